//! Regression tests for defects found by the reliability battery (issue 6).
//!
//! All tests share one runtime (same settings, never shut down).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use runtime_core::config::ConfigBuilder;
use runtime_core::kernel;
use runtime_core::runtime::{self, Runtime};
use runtime_core::stream::{self, Stream};

fn init() -> Arc<Runtime> {
    runtime::init(&ConfigBuilder {
        device_count: Some(2),
        memory: Some(runtime_core::Bytes::mib(64)),
        profile: None,
    })
    .expect("init the runtime")
}

/// A global or device barrier racing with another thread's `Stream::destroy` used to fail
/// with "Stream#N is no longer valid: it was destroyed" about a stream the caller never
/// named: `synchronize_all` checked `is_destroyed` and then synchronised, and the destroy
/// could land in between.
#[test]
fn barrier_racing_with_stream_destroy_reports_no_invalid_handle() {
    let rt = init();
    let dev = rt.device(0).unwrap().clone();
    let stop = Arc::new(AtomicBool::new(false));
    let churners: Vec<_> = (0..2)
        .map(|_| {
            let (dev, stop) = (dev.clone(), stop.clone());
            std::thread::spawn(move || {
                let noop = kernel::find("noop").unwrap();
                while !stop.load(Ordering::Relaxed) {
                    let s = Stream::new(&dev, 0).unwrap();
                    kernel::launch(&s, noop.clone(), vec![]).unwrap();
                    s.destroy().unwrap();
                }
            })
        })
        .collect();
    // At least 1.5 s and 20 barriers (slow under valgrind), at most 60 s.
    let start = Instant::now();
    let mut barriers = 0u64;
    let mut failure = None;
    while (start.elapsed() < Duration::from_millis(1500) || barriers < 20)
        && start.elapsed() < Duration::from_secs(60)
    {
        let r = if barriers.is_multiple_of(2) {
            runtime::synchronize_all(Some(Duration::from_secs(30)))
        } else {
            dev.synchronize(Some(Duration::from_secs(30)))
        };
        barriers += 1;
        if let Err(e) = r {
            failure = Some(e);
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for c in churners {
        c.join().unwrap();
    }
    assert!(failure.is_none(), "barrier {barriers} failed: {failure:?}");
    assert!(barriers >= 2, "only {barriers} barriers ran");
}

/// Launches that another thread got accepted just before `destroy` took effect may still be
/// queued when `destroy` returns. A global or device barrier used to skip destroyed streams,
/// so nothing could wait for that work: after the barrier, accepted work had not all run.
#[test]
fn barrier_waits_for_work_accepted_before_a_destroy() {
    use runtime_core::stream::{FnOp, OpKind};
    use std::sync::atomic::AtomicU64;

    let rt = init();
    let dev = rt.device(1).unwrap().clone();
    for trial in 0..20 {
        let s = Stream::new(&dev, 0).unwrap();
        let ran = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let launchers: Vec<_> = (0..3)
            .map(|_| {
                let (s, ran, stop) = (s.clone(), ran.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut accepted = 0u64;
                    // bounded, so that the backlog stays small
                    while !stop.load(Ordering::Relaxed) && accepted < 3000 {
                        let r = ran.clone();
                        let op = FnOp::shared("count", OpKind::Compute, move || {
                            // slow enough that a backlog builds up behind the destroy
                            let t0 = Instant::now();
                            while t0.elapsed() < Duration::from_micros(3) {
                                std::hint::spin_loop();
                            }
                            r.fetch_add(1, Ordering::SeqCst);
                            Ok(())
                        });
                        match runtime_core::bindings::enqueue(&s, op) {
                            Ok(_) => accepted += 1,
                            Err(_) => break,
                        }
                    }
                    accepted
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(2 + trial % 3));
        s.destroy().unwrap();
        stop.store(true, Ordering::Relaxed);
        let accepted: u64 = launchers.into_iter().map(|l| l.join().unwrap()).sum();
        let done = if trial % 2 == 0 {
            runtime::synchronize_all(Some(Duration::from_secs(60)))
        } else {
            dev.synchronize(Some(Duration::from_secs(60)))
        };
        done.expect("the barrier");
        assert_eq!(
            ran.load(Ordering::SeqCst),
            accepted,
            "trial {trial}: accepted work had not run when the barrier returned"
        );
    }
}

/// `fill` / `scale` / `axpy` on int64 tensors accepted the float 2^63 (it passed an inclusive
/// check against `i64::MAX as f64`, which rounds up to 2^63) and saturated it to `i64::MAX`.
#[test]
fn float_scalar_two_to_the_63_does_not_fit_int64() {
    use runtime_core::kernel::{DType, KernelArg, Tensor};

    let rt = init();
    let dev = rt.device(0).unwrap().clone();
    let s = Stream::new(&dev, 0).unwrap();
    let buf = dev.memory().allocate(32).unwrap();
    let x = || KernelArg::Tensor(Tensor::new(buf.clone(), 0, DType::I64, vec![4]).unwrap());
    let fill = kernel::find("fill").unwrap();
    let err = kernel::launch(&s, fill.clone(), vec![x(), KernelArg::Float(2f64.powi(63))])
        .expect_err("2^63 does not fit in int64");
    assert!(err.to_string().contains("does not fit in int64"), "{err}");
    // the extremes that do fit are still accepted
    kernel::launch(
        &s,
        fill.clone(),
        vec![x(), KernelArg::Float(-(2f64.powi(63)))],
    )
    .unwrap();
    kernel::launch(&s, fill, vec![x(), KernelArg::Int(i64::MAX)]).unwrap();
    s.synchronize(None).unwrap();
    let mut out = [0u8; 8];
    buf.read(0, &mut out).unwrap();
    assert_eq!(i64::from_ne_bytes(out), i64::MAX);
    s.destroy().unwrap();
}

/// Waits with a timeout near `Duration::MAX` used to panic computing `Instant::now() + t`;
/// such a timeout now means no limit.
#[test]
fn huge_timeouts_mean_no_limit() {
    use runtime_core::event::{Event, EventOptions};
    let rt = init();
    let s = Stream::new(rt.device(0).unwrap(), 0).unwrap();
    let e = Event::with_options(EventOptions::without_timing());
    runtime_core::bindings::enqueue(
        &s,
        stream::FnOp::shared("short", stream::OpKind::Compute, || {
            std::thread::sleep(Duration::from_millis(5));
            Ok(())
        }),
    )
    .unwrap();
    s.record(&e).unwrap();
    s.synchronize(Some(Duration::MAX)).unwrap();
    e.synchronize(Some(Duration::MAX)).unwrap();
    rt.device(0)
        .unwrap()
        .synchronize(Some(Duration::MAX))
        .unwrap();
    runtime::synchronize_all(Some(Duration::MAX)).unwrap();
}
