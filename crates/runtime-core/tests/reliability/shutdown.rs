//! Regression test for a defect found by the reliability battery (issue 6): `shutdown` took
//! the runtime out of the global slot before draining the queued work, so queued work that
//! looks the runtime up while it runs (a Python kernel converting its buffer arguments does)
//! failed, and the work queued behind it on its stream was skipped.
//!
//! Its own test binary: it shuts the runtime down (the tests hold a file-level lock).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runtime_core::config::ConfigBuilder;
use runtime_core::runtime;
use runtime_core::stream::{FnOp, OpKind, Stream};

static LOCK: Mutex<()> = Mutex::new(());

fn init(device_count: usize) -> Arc<runtime::Runtime> {
    runtime::init(&ConfigBuilder {
        device_count: Some(device_count),
        memory: Some(runtime_core::Bytes::mib(64)),
        profile: None,
    })
    .expect("init the runtime")
}

#[test]
fn queued_work_runs_with_the_runtime_still_installed() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    for round in 0..3 {
        let rt = init(2);
        let generation = rt.generation();
        let saw_runtime = Arc::new(AtomicUsize::new(0));
        let ran_after = Arc::new(AtomicBool::new(false));
        let mut streams = Vec::new();
        for i in 0..4 {
            let s = Stream::new(rt.device(i % 2).unwrap(), 0).unwrap();
            runtime_core::bindings::enqueue(
                &s,
                FnOp::shared("slow", OpKind::Compute, || {
                    std::thread::sleep(Duration::from_millis(20));
                    Ok(())
                }),
            )
            .unwrap();
            let seen = saw_runtime.clone();
            runtime_core::bindings::enqueue(
                &s,
                FnOp::shared(
                    "looks-up-the-runtime",
                    OpKind::Compute,
                    move || match runtime::get() {
                        Ok(r) if r.generation() == generation => {
                            seen.fetch_add(1, Ordering::SeqCst);
                            Ok(())
                        }
                        _ => Err(runtime_core::error::KernelFailure::new(
                            "looks-up-the-runtime",
                            "the runtime was already gone while its queued work ran",
                        )),
                    },
                ),
            )
            .unwrap();
            let after = ran_after.clone();
            runtime_core::bindings::enqueue(
                &s,
                FnOp::shared("behind-it", OpKind::Compute, move || {
                    after.store(true, Ordering::SeqCst);
                    Ok(())
                }),
            )
            .unwrap();
            streams.push(s);
        }
        drop(rt);
        runtime::shutdown().expect("shutdown");
        assert_eq!(saw_runtime.load(Ordering::SeqCst), 4, "round {round}");
        assert!(
            ran_after.load(Ordering::SeqCst),
            "round {round}: work behind it was skipped"
        );
        assert!(!runtime::is_initialized());
        for s in &streams {
            assert!(s.check().is_err(), "a stream survived shutdown");
        }
    }
}

/// While `shutdown` drains, new work is refused: a thread that keeps launching and waiting on
/// an event gets an error or sees its event complete, never a record that no engine will run
/// (with the first fix alone, work accepted after the drain hung its waiters).
#[test]
fn shutdown_racing_a_launcher_never_leaves_a_waiter_hanging() {
    use runtime_core::event::{Event, EventOptions};
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    for round in 0..30 {
        let rt = init(2);
        let s = Stream::new(rt.device(round % 2).unwrap(), 0).unwrap();
        let slow = Stream::new(rt.device((round + 1) % 2).unwrap(), 0).unwrap();
        if round % 2 == 1 {
            runtime_core::bindings::enqueue(
                &slow,
                FnOp::shared("slow", OpKind::Compute, || {
                    std::thread::sleep(Duration::from_millis(20));
                    Ok(())
                }),
            )
            .unwrap();
        }
        drop(rt);
        let launcher = std::thread::spawn(move || {
            let e = Event::with_options(EventOptions::without_timing());
            loop {
                let op = FnOp::shared("noop", OpKind::Compute, || Ok(()));
                if runtime_core::bindings::enqueue(&s, op).is_err() || s.record(&e).is_err() {
                    return true;
                }
                match e.wait(Some(Duration::from_secs(10))) {
                    Ok(true) => {}
                    Ok(false) => return false, // a record no engine will run
                    Err(_) => return true,
                }
            }
        });
        std::thread::sleep(Duration::from_micros(500 * (round as u64 % 5)));
        runtime::shutdown().expect("shutdown");
        assert!(
            launcher.join().unwrap(),
            "round {round}: a waiter hung after shutdown"
        );
    }
}

/// `init` called while `shutdown` drains waits for it and returns a new, working runtime
/// (it used to return the dying one, on which every call failed).
#[test]
fn init_racing_shutdown_returns_a_new_runtime() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    for round in 0..5 {
        let rt = init(1);
        let old = rt.generation();
        let s = Stream::new(rt.device(0).unwrap(), 0).unwrap();
        let started = Arc::new(AtomicBool::new(false));
        let flag = started.clone();
        runtime_core::bindings::enqueue(
            &s,
            FnOp::shared("slow", OpKind::Compute, move || {
                flag.store(true, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(30));
                Ok(())
            }),
        )
        .unwrap();
        while !started.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        let closer = std::thread::spawn(runtime::shutdown);
        while !rt.is_closing() {
            std::thread::yield_now();
        }
        let fresh = init(1); // while the other thread's shutdown drains
        closer.join().unwrap().expect("shutdown");
        assert!(
            fresh.generation() > old,
            "round {round}: got the dying runtime"
        );
        assert!(!fresh.is_closing());
        let s2 = Stream::new(fresh.device(0).unwrap(), 0).expect("the new runtime works");
        s2.synchronize(None).unwrap();
        drop((s, s2, rt, fresh));
        runtime::shutdown().expect("shutdown");
    }
}
