//! Runtime lifecycle: init is idempotent, shutdown waits for queued work and invalidates every
//! old handle, init works again afterwards; the current device is per thread.
//!
//! Every test holds a file-level lock and leaves the runtime shut down.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex, MutexGuard};
use std::time::Duration;

use runtime_core::config::ConfigBuilder;
use runtime_core::device;
use runtime_core::error::{DeviceError, Error};
use runtime_core::event::{Event, EventOptions};
use runtime_core::kernel::{self, DType, KernelArg, Tensor};
use runtime_core::runtime::{self, Runtime};
use runtime_core::stream::{FnOp, Op, OpKind, Stream};

static LOCK: Mutex<()> = Mutex::new(());

/// Holds the lock; shuts the runtime down when dropped, even if the test failed.
struct Session(#[allow(dead_code)] MutexGuard<'static, ()>);

impl Drop for Session {
    fn drop(&mut self) {
        let _ = runtime::shutdown();
    }
}

fn session() -> Session {
    let g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    runtime::shutdown().expect("shutdown");
    Session(g)
}

fn settings() -> ConfigBuilder {
    ConfigBuilder {
        device_count: Some(2),
        memory: Some(runtime_core::Bytes::mib(256)),
        profile: None,
    }
}

fn init() -> Arc<Runtime> {
    runtime::init(&settings()).expect("init the runtime")
}

fn is_invalid_handle<T: std::fmt::Debug>(r: runtime_core::Result<T>) -> bool {
    matches!(r, Err(Error::Device(DeviceError::InvalidHandle { .. })))
}

fn is_not_initialized<T: std::fmt::Debug>(r: runtime_core::Result<T>) -> bool {
    matches!(r, Err(Error::Device(DeviceError::NotInitialized)))
}

fn slow_count(c: &Arc<AtomicUsize>) -> Arc<dyn Op> {
    let c = c.clone();
    FnOp::shared("slow", OpKind::Compute, move || {
        std::thread::sleep(Duration::from_millis(2));
        c.fetch_add(1, Ordering::SeqCst);
        Ok(())
    })
}

#[test]
fn init_is_idempotent() {
    let _s = session();
    assert!(!runtime::is_initialized());
    assert!(is_not_initialized(runtime::get()));
    let a = init();
    let b = init();
    assert!(Arc::ptr_eq(&a, &b));
    assert_eq!(a.generation(), b.generation());
    assert_eq!(a.devices().len(), 2);
    assert_eq!(a.config().memory_per_device, 256 << 20);
    // Default settings mean "whatever is running".
    let c = runtime::init(&ConfigBuilder::default()).unwrap();
    assert!(Arc::ptr_eq(&a, &c));
    // Other explicit settings are refused while initialised.
    let other = ConfigBuilder {
        device_count: Some(3),
        ..settings()
    };
    match runtime::init(&other) {
        Err(Error::Arg(e)) => assert!(e.message.contains("shutdown"), "{e}"),
        r => panic!("{r:?}"),
    }
    assert!(Arc::ptr_eq(&runtime::get().unwrap(), &a));
    // Bad device indices name the range.
    match a.device(2) {
        Err(Error::Device(DeviceError::InvalidDevice { index: 2, count: 2 })) => {}
        r => panic!("{r:?}"),
    }
    assert!(a.device(usize::MAX).is_err());
}

#[test]
fn shutdown_invalidates_old_handles_and_init_works_again() {
    let _s = session();
    let rt = init();
    let gen = rt.generation();
    let dev = rt.device(0).unwrap().clone();
    let s = Stream::new(&dev, 0).unwrap();
    let default = dev.default_stream().unwrap();
    let e = Event::new();
    let buf = dev.memory().allocate(64).unwrap();
    buf.write(0, &[9; 64]).unwrap();
    s.record(&e).unwrap();
    s.begin_capture().unwrap();
    s.launch(FnOp::shared("captured", OpKind::Compute, || Ok(())))
        .unwrap();
    let graph = s.end_capture().unwrap();
    s.launch_graph(&graph).unwrap();
    s.synchronize(None).unwrap();
    let x = Tensor::new(buf.clone(), 0, DType::F32, vec![16]).unwrap();
    drop(rt);

    runtime::shutdown().expect("shutdown");
    assert!(!runtime::is_initialized());
    assert!(is_not_initialized(runtime::get()));
    assert!(is_not_initialized(runtime::current_device()));
    assert!(is_not_initialized(runtime::set_device(0)));
    runtime::shutdown().expect("shutdown"); // a no-op when not initialised

    // Every old device and stream handle fails with InvalidHandle.
    assert!(is_invalid_handle(dev.check_alive()));
    assert!(is_invalid_handle(dev.default_stream()));
    assert!(is_invalid_handle(dev.synchronize(None)));
    assert!(is_invalid_handle(Stream::new(&dev, 0)));
    assert!(is_invalid_handle(device::current_stream(&dev)));
    for st in [&s, &default] {
        assert!(is_invalid_handle(st.check()));
        assert!(is_invalid_handle(st.query()));
        assert!(is_invalid_handle(st.synchronize(None)));
        assert!(is_invalid_handle(st.record(&e)));
        assert!(is_invalid_handle(st.wait_event(&e)));
        assert!(is_invalid_handle(st.begin_capture()));
        assert!(is_invalid_handle(st.launch(FnOp::shared(
            "late",
            OpKind::Compute,
            || Ok(())
        ))));
        assert!(is_invalid_handle(kernel::launch(
            st,
            kernel::find("fill").unwrap(),
            vec![KernelArg::Tensor(x.clone()), KernelArg::Float(1.0)],
        )));
    }
    assert!(is_invalid_handle(default.destroy()));
    // Events and buffers belong to their runtime too (the buffer's memory stays mapped
    // while the handle lives, so nothing dangles, but every use is refused).
    assert!(is_not_initialized(e.query()));
    let mut back = [0u8; 64];
    assert!(is_invalid_handle(buf.read(0, &mut back)));
    assert!(is_invalid_handle(buf.write(0, &back)));
    assert!(is_invalid_handle(buf.fill(0, 64, 1)));
    assert!(is_invalid_handle(Tensor::new(
        buf.clone(),
        0,
        DType::F32,
        vec![16]
    )));

    // init again: a new generation with working devices; old handles stay dead.
    let rt = init();
    assert!(rt.generation() > gen);
    let dev2 = rt.device(0).unwrap();
    assert!(dev2 != &dev);
    assert!(is_invalid_handle(s.query()));
    assert!(is_invalid_handle(dev.check_alive()));
    let s2 = Stream::new(dev2, 0).unwrap();
    assert!(is_invalid_handle(e.query()));
    assert!(is_invalid_handle(s2.record(&e)));
    assert!(is_invalid_handle(s2.wait_event(&e)));
    assert!(is_invalid_handle(s2.launch_graph(&graph)));
    assert!(is_invalid_handle(buf.read(0, &mut back)));
    let e2 = Event::new();
    let n = Arc::new(AtomicUsize::new(0));
    s2.launch(slow_count(&n)).unwrap();
    s2.record(&e2).unwrap();
    s2.synchronize(None).unwrap();
    assert!(e2.query().unwrap());
    assert_eq!(n.load(Ordering::SeqCst), 1);
    let d2 = dev2.default_stream().unwrap();
    assert!(d2 != default);
    d2.launch(slow_count(&n)).unwrap();
    dev2.synchronize(None).unwrap();
    assert_eq!(n.load(Ordering::SeqCst), 2);
    // A graph captured on device 0 is refused on device 1, as a kernel argument would be.
    s2.begin_capture().unwrap();
    s2.launch(slow_count(&n)).unwrap();
    let g0 = s2.end_capture().unwrap();
    let other = Stream::new(rt.device(1).unwrap(), 0).unwrap();
    match other.launch_graph(&g0) {
        Err(Error::Arg(a)) => assert_eq!(a.arg, "graph"),
        r => panic!("cross-device graph launch: {r:?}"),
    }
    drop(buf);
}

#[test]
fn shutdown_waits_for_queued_work() {
    let _s = session();
    let rt = init();
    let per_stream = 10;
    let mut counters = Vec::new();
    let mut kept = Vec::new();
    let e = Event::with_options(EventOptions::without_timing());
    for d in 0..2 {
        for k in 0..3 {
            let s = Stream::new(rt.device(d).unwrap(), -k).unwrap();
            let c = Arc::new(AtomicUsize::new(0));
            for _ in 0..per_stream {
                s.launch(slow_count(&c)).unwrap();
            }
            counters.push(c);
            if d == 1 && k == 0 {
                s.record(&e).unwrap();
            }
            if k == 2 {
                kept.push(s); // the other streams' handles are dropped with work queued
            }
        }
    }
    // A stream on device 0 waits for device 1's work, and the default stream has work too.
    let waiter = Stream::new(rt.device(0).unwrap(), 0).unwrap();
    waiter.wait_event(&e).unwrap();
    let after_wait = Arc::new(AtomicUsize::new(0));
    let (c1, aw) = (counters[3].clone(), after_wait.clone());
    waiter
        .launch(FnOp::shared("after_wait", OpKind::Compute, move || {
            aw.store(c1.load(Ordering::SeqCst), Ordering::SeqCst);
            Ok(())
        }))
        .unwrap();
    let default_count = Arc::new(AtomicUsize::new(0));
    let ds = rt.device(1).unwrap().default_stream().unwrap();
    for _ in 0..per_stream {
        ds.launch(slow_count(&default_count)).unwrap();
    }
    drop((rt, ds, waiter));

    runtime::shutdown().expect("shutdown");
    for (i, c) in counters.iter().enumerate() {
        assert_eq!(c.load(Ordering::SeqCst), per_stream, "stream {i}");
    }
    assert_eq!(default_count.load(Ordering::SeqCst), per_stream);
    assert_eq!(after_wait.load(Ordering::SeqCst), per_stream);
    // The event belongs to the runtime that is gone.
    assert!(is_not_initialized(e.query()));
    for s in &kept {
        assert!(is_invalid_handle(s.query()));
    }
}

#[test]
fn shutdown_drops_errors_of_queued_work() {
    let _s = session();
    let rt = init();
    let s = Stream::new(rt.device(0).unwrap(), 0).unwrap();
    s.launch(FnOp::shared("fails", OpKind::Compute, || {
        Err(runtime_core::error::KernelFailure::new("fails", "x"))
    }))
    .unwrap();
    runtime::shutdown().expect("shutdown");
    let rt = init();
    let s = Stream::new(rt.device(0).unwrap(), 0).unwrap();
    s.synchronize(None).unwrap();
    runtime::synchronize_all(None).unwrap();
}

#[test]
fn current_device_is_per_thread() {
    let _s = session();
    let rt = runtime::init(&ConfigBuilder {
        device_count: Some(8),
        memory: Some(runtime_core::Bytes::mib(16)),
        profile: None,
    })
    .unwrap();
    assert_eq!(runtime::current_device().unwrap().index(), 0);
    let barrier = Arc::new(Barrier::new(8));
    let handles: Vec<_> = (0..8)
        .map(|i| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                assert_eq!(runtime::current_device().unwrap().index(), 0, "default");
                runtime::set_device(i).unwrap();
                barrier.wait(); // every thread has set its own device
                let dev = runtime::current_device().unwrap();
                assert_eq!(dev.index(), i);
                assert_eq!(runtime_core::device::current_device_index(), i);
                match runtime::set_device(8) {
                    Err(Error::Device(DeviceError::InvalidDevice { index: 8, count: 8 })) => {}
                    r => panic!("{r:?}"),
                }
                assert_eq!(runtime::current_device().unwrap().index(), i);
                // Work on the current device's current stream.
                let s = device::current_stream(&dev).unwrap();
                assert!(s.is_default());
                assert_eq!(s.device_index(), i);
                let buf = dev.memory().allocate(4 * 8).unwrap();
                assert_eq!(buf.device(), i);
                let x = Tensor::new(buf.clone(), 0, DType::I32, vec![8]).unwrap();
                kernel::launch(
                    &s,
                    kernel::find("fill").unwrap(),
                    vec![KernelArg::Tensor(x), KernelArg::Int(i as i64)],
                )
                .unwrap();
                s.synchronize(None).unwrap();
                let mut b = [0u8; 4];
                buf.read(28, &mut b).unwrap();
                assert_eq!(i32::from_ne_bytes(b), i as i32);
                barrier.wait();
                assert_eq!(runtime::current_device().unwrap().index(), i);
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(runtime::current_device().unwrap().index(), 0);
    assert_eq!(rt.devices().len(), 8);
}

#[test]
fn current_stream_is_per_thread_and_device() {
    let _s = session();
    let rt = init();
    let dev = rt.device(1).unwrap();
    let mine = Stream::new(dev, 0).unwrap();
    assert!(device::current_stream(dev).unwrap().is_default());
    assert!(device::set_current_stream(dev, Some(mine.clone())).is_none());
    assert_eq!(device::current_stream(dev).unwrap(), mine);
    let d = dev.clone();
    std::thread::spawn(move || assert!(device::current_stream(&d).unwrap().is_default()))
        .join()
        .unwrap();
    // A destroyed current stream falls back to the default one.
    mine.destroy().unwrap();
    assert!(device::current_stream(dev).unwrap().is_default());
    assert_eq!(device::set_current_stream(dev, None), Some(mine));
}

#[test]
fn options_outlive_shutdown() {
    let _s = session();
    let _rt = init();
    assert!(runtime::get_option(
        runtime_core::config::RuntimeOption::Pipelining
    ));
    runtime::set_option(runtime_core::config::RuntimeOption::Pipelining, false);
    runtime::shutdown().expect("shutdown");
    assert!(!runtime::get_option(
        runtime_core::config::RuntimeOption::Pipelining
    ));
    // Work still runs, on the serial engine.
    let rt = init();
    let s = Stream::new(rt.device(0).unwrap(), 0).unwrap();
    let n = Arc::new(AtomicUsize::new(0));
    for _ in 0..5 {
        s.launch(slow_count(&n)).unwrap();
    }
    let buf = rt.device(0).unwrap().memory().allocate(16).unwrap();
    s.launch(runtime_core::stream::copy::memset(&buf, 0, 16, 3).unwrap())
        .unwrap();
    s.synchronize(None).unwrap();
    assert_eq!(n.load(Ordering::SeqCst), 5);
    let mut b = [0u8; 16];
    buf.read(0, &mut b).unwrap();
    assert_eq!(b, [3; 16]);
    runtime::set_option(runtime_core::config::RuntimeOption::Pipelining, true);
    assert!("noSuchOption"
        .parse::<runtime_core::config::RuntimeOption>()
        .is_err());
}

/// After `shutdown`, every thread's current device and current streams are reset, not only
/// the calling thread's: a new runtime with fewer devices starts each thread on device 0.
#[test]
fn shutdown_resets_every_threads_current_device_and_stream() {
    let _s = session();
    let rt = init();
    let dev1 = rt.device(1).unwrap().clone();
    let mine = Stream::new(&dev1, 0).unwrap();
    let (to_worker, from_main) = std::sync::mpsc::channel::<()>();
    let (to_main, from_worker) = std::sync::mpsc::channel::<(usize, bool)>();
    let worker = std::thread::spawn(move || {
        runtime::set_device(1).unwrap();
        device::set_current_stream(&dev1, Some(mine));
        to_main
            .send((device::current_device_index(), false))
            .unwrap();
        from_main.recv().unwrap(); // the main thread shut down and re-initialised
        let index = device::current_device_index();
        let rt = runtime::get().unwrap();
        let default = device::current_stream(rt.device(0).unwrap())
            .unwrap()
            .is_default();
        to_main.send((index, default)).unwrap();
    });
    assert_eq!(from_worker.recv().unwrap(), (1, false));
    drop(rt);
    runtime::shutdown().expect("shutdown");
    runtime::init(&ConfigBuilder {
        device_count: Some(1),
        ..settings()
    })
    .unwrap();
    to_worker.send(()).unwrap();
    assert_eq!(from_worker.recv().unwrap(), (0, true));
    worker.join().unwrap();
    assert_eq!(runtime::current_device().unwrap().index(), 0);
}

/// The exit policy (moved from the Python bindings' `lifecycle.rs`): `at_exit` shuts the
/// runtime down after its queued work, then turns `enableAsync` off, so a runtime initialised
/// afterwards (by a later exit handler) runs each submission before the call returns.
#[test]
fn at_exit_shuts_down_and_leaves_later_runtimes_synchronous() {
    use runtime_core::config::RuntimeOption;
    struct RestoreAsync;
    impl Drop for RestoreAsync {
        fn drop(&mut self) {
            runtime::set_option(RuntimeOption::Async, true);
        }
    }
    let _s = session();
    let _restore = RestoreAsync;
    let rt = init();
    let s = Stream::new(rt.device(0).unwrap(), 0).unwrap();
    let n = Arc::new(AtomicUsize::new(0));
    for _ in 0..5 {
        s.launch(slow_count(&n)).unwrap();
    }
    assert!(runtime::get_option(RuntimeOption::Async));
    runtime::at_exit().unwrap();
    assert_eq!(n.load(Ordering::SeqCst), 5, "the queued work ran first");
    assert!(!runtime::is_initialized());
    assert!(!runtime::get_option(RuntimeOption::Async));
    // A runtime a later exit handler makes: every launch has run when it returns.
    let rt = init();
    let s = Stream::new(rt.device(1).unwrap(), 0).unwrap();
    for i in 6..=8 {
        s.launch(slow_count(&n)).unwrap();
        assert_eq!(n.load(Ordering::SeqCst), i);
    }
    // Nothing to shut down is fine too.
    runtime::at_exit().unwrap();
    runtime::at_exit().unwrap();
    assert!(!runtime::is_initialized());
}

/// A gathering still waiting for ranks at shutdown fails there, its waiter at once and later
/// joins of its id after the next `init`. Left in place, a rank joining after `init`
/// completed it, and the communicator held a device of each runtime.
#[test]
fn shutdown_fails_a_communicator_still_gathering_its_ranks() {
    let _s = session();
    let rt = init();
    let id = runtime_core::comm::unique_id();
    let f = runtime_core::comm::init_rank(2, &id, 0, &rt.devices()[0], Duration::from_secs(60))
        .expect("rank 0 joins");
    let waiter = std::thread::spawn(move || f.wait());
    // Rank 0 waits in the gathering (or has not begun to: the outcome is the same).
    std::thread::sleep(Duration::from_millis(20));
    drop(rt);
    runtime::shutdown().expect("shutdown");
    let e = waiter
        .join()
        .unwrap()
        .expect_err("the gathering failed at shutdown");
    assert!(
        e.to_string().contains("the runtime is shutting down"),
        "{e}"
    );
    let rt = init();
    let late = runtime_core::comm::init_rank(2, &id, 1, &rt.devices()[1], Duration::from_secs(1));
    let e = late.expect_err("a join of the failed id is refused");
    assert!(
        e.to_string().contains("the runtime is shutting down"),
        "{e}"
    );
}
