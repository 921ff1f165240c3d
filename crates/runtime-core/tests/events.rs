//! Events: query, record, wait, synchronize and timing.
//!
//! All tests share one runtime (same settings, never shut down). Streams that a gate op holds
//! back are never synchronised (or waited on by `synchronize_all`) while the gate is closed:
//! a synchronising caller may run a queued stream itself.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use runtime_core::error::{DeviceError, Error, StreamError};
use runtime_core::event::{Event, EventOptions};
use runtime_core::kernel::{self, DType, KernelArg, Tensor};
use runtime_core::runtime::Runtime;
use runtime_core::stream::{FnOp, Op, OpKind, Stream};

use common::init;

fn stream(rt: &Runtime, device: i64) -> Stream {
    Stream::new(rt.device(device).unwrap(), 0).unwrap()
}

/// An op that blocks its stream until `open` is called (or fails after 10 s, so that a broken
/// test cannot hang).
struct Gate(Arc<(Mutex<bool>, Condvar)>);

impl Gate {
    fn new() -> Gate {
        Gate(Arc::new((Mutex::new(false), Condvar::new())))
    }

    fn op(&self) -> Arc<dyn Op> {
        let g = self.0.clone();
        FnOp::shared("gate", OpKind::Compute, move || {
            let (lock, cv) = &*g;
            let open = lock.lock().unwrap();
            let (open, _) = cv
                .wait_timeout_while(open, Duration::from_secs(10), |o| !*o)
                .unwrap();
            if *open {
                Ok(())
            } else {
                Err(runtime_core::error::KernelFailure::new(
                    "gate",
                    "never opened",
                ))
            }
        })
    }

    fn open(&self) {
        *self.0 .0.lock().unwrap() = true;
        self.0 .1.notify_all();
    }
}

fn flag_op(flag: &Arc<AtomicBool>) -> Arc<dyn Op> {
    let f = flag.clone();
    FnOp::shared("flag", OpKind::Compute, move || {
        f.store(true, Ordering::SeqCst);
        Ok(())
    })
}

#[test]
fn query_before_record_is_true() {
    let _rt = init();
    let e = Event::new();
    assert!(e.query().unwrap());
    assert!(!e.is_recorded());
    e.synchronize(None).unwrap();
    e.synchronize(Some(Duration::ZERO)).unwrap();
}

#[test]
fn record_on_idle_stream_completes_at_once() {
    let rt = init();
    let s = stream(&rt, 0);
    let e = Event::new();
    s.record(&e).unwrap();
    assert!(e.is_recorded());
    assert!(e.query().unwrap());
    assert!(e.timestamp_ns().is_ok());
    // Also right after work has run and been synchronised, while the worker may still hold
    // the stream (it lingers for the next command): many times, as that is a race.
    for _ in 0..500 {
        s.launch(FnOp::shared("nothing", OpKind::Compute, || Ok(())))
            .unwrap();
        s.synchronize(None).unwrap();
        let e2 = Event::with_options(EventOptions {
            timing: false,
            blocking: true,
        });
        s.record(&e2).unwrap();
        assert!(e2.query().unwrap());
    }
}

#[test]
fn record_behind_work_completes_when_the_stream_gets_there() {
    let rt = init();
    let s = stream(&rt, 0);
    let gate = Gate::new();
    let e = Event::new();
    s.launch(gate.op()).unwrap();
    s.record(&e).unwrap();
    assert!(!e.query().unwrap());
    assert!(matches!(
        e.timestamp_ns(),
        Err(Error::Stream(StreamError::NotReady { .. }))
    ));
    // Event synchronize with a timeout returns false while the stream is held back.
    assert!(common::timed_out(
        e.synchronize(Some(Duration::from_millis(20)))
    ));
    gate.open();
    e.synchronize(Some(Duration::from_secs(10))).unwrap();
    assert!(e.query().unwrap());
    s.synchronize(None).unwrap();
}

#[test]
fn blocking_event_synchronize_times_out_then_completes() {
    let rt = init();
    let s = stream(&rt, 1);
    let gate = Gate::new();
    let e = Event::with_options(EventOptions {
        timing: false,
        blocking: true,
    });
    s.launch(gate.op()).unwrap();
    s.record(&e).unwrap();
    assert!(common::timed_out(
        e.synchronize(Some(Duration::from_millis(10)))
    ));
    gate.open();
    e.synchronize(None).unwrap();
    s.synchronize(None).unwrap();
}

#[test]
fn elapsed_time_around_a_kernel() {
    let rt = init();
    let dev = rt.device(0).unwrap();
    let s = stream(&rt, 0);
    let buf = dev.memory().allocate(1024 * 4).unwrap();
    let x = Tensor::new(buf.clone(), 0, DType::F32, vec![1024]).unwrap();
    let (start, end) = (Event::new(), Event::new());
    s.record(&start).unwrap();
    kernel::launch(
        &s,
        kernel::find("fill").unwrap(),
        vec![KernelArg::Tensor(x), KernelArg::Float(1.5)],
    )
    .unwrap();
    s.record(&end).unwrap();
    s.synchronize(None).unwrap();
    let ms = start.elapsed_time(&end).unwrap();
    assert!(ms >= 0.0, "{ms}");
    assert!(end.elapsed_time(&start).unwrap() <= 0.0);
    assert_eq!(start.elapsed_time(&start).unwrap(), 0.0);
    let mut b = [0u8; 4];
    buf.read(4 * 1023, &mut b).unwrap();
    assert_eq!(f32::from_ne_bytes(b), 1.5);
}

#[test]
fn elapsed_time_errors() {
    let rt = init();
    let s = stream(&rt, 0);
    let recorded = Event::new();
    s.record(&recorded).unwrap();
    s.synchronize(None).unwrap();

    let never = Event::new();
    let e = recorded.elapsed_time(&never).unwrap_err();
    assert!(matches!(e, Error::Stream(StreamError::Invalid(_))), "{e}");
    assert!(e.to_string().contains("never recorded"), "{e}");
    assert!(never.elapsed_time(&recorded).is_err());

    let untimed = Event::with_options(EventOptions::without_timing());
    s.record(&untimed).unwrap();
    s.synchronize(None).unwrap();
    let e = recorded.elapsed_time(&untimed).unwrap_err();
    assert!(matches!(e, Error::Stream(StreamError::Invalid(_))), "{e}");
    assert!(e.to_string().contains("enable_timing"), "{e}");
    assert!(untimed.elapsed_time(&recorded).is_err());
    assert!(untimed.timestamp_ns().is_err());
}

#[test]
fn elapsed_time_across_devices() {
    let rt = init();
    let (s0, s1) = (stream(&rt, 0), stream(&rt, 1));
    let (start, end) = (Event::new(), Event::new());
    s0.record(&start).unwrap();
    s0.synchronize(None).unwrap();
    s1.launch(FnOp::shared("work", OpKind::Compute, || Ok(())))
        .unwrap();
    s1.record(&end).unwrap();
    s1.synchronize(None).unwrap();
    let ms = start.elapsed_time(&end).unwrap();
    assert!(ms >= 0.0, "{ms}");
    assert!(end.elapsed_time(&start).unwrap() <= 0.0);
}

#[test]
fn wait_on_never_recorded_event_is_a_noop() {
    let rt = init();
    let s = stream(&rt, 0);
    let e = Event::with_options(EventOptions::without_timing());
    let before = s.counters();
    s.wait_event(&e).unwrap();
    assert_eq!(s.counters(), before, "nothing was queued");
    let flag = Arc::new(AtomicBool::new(false));
    s.launch(flag_op(&flag)).unwrap();
    s.synchronize(Some(Duration::from_secs(10))).unwrap();
    assert!(flag.load(Ordering::SeqCst));
    // Recording the event later does not retroactively affect the stream.
    s.record(&e).unwrap();
    s.synchronize(None).unwrap();
}

#[test]
fn wait_event_holds_the_other_stream_until_the_record() {
    let rt = init();
    let (a, b) = (stream(&rt, 0), stream(&rt, 1));
    let gate = Gate::new();
    let e = Event::with_options(EventOptions::without_timing());
    let (before, after) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    a.launch(gate.op()).unwrap();
    a.launch(flag_op(&before)).unwrap();
    a.record(&e).unwrap();
    b.wait_event(&e).unwrap();
    let seen = before.clone();
    let ok = Arc::new(AtomicBool::new(false));
    let ok2 = ok.clone();
    b.launch(FnOp::shared("after", OpKind::Compute, move || {
        ok2.store(seen.load(Ordering::SeqCst), Ordering::SeqCst);
        Ok(())
    }))
    .unwrap();
    b.launch(flag_op(&after)).unwrap();
    // `b` cannot finish while `a` is held back.
    assert!(common::timed_out(
        b.synchronize(Some(Duration::from_millis(20)))
    ));
    assert!(!b.query().unwrap());
    assert!(!after.load(Ordering::SeqCst));
    gate.open();
    b.synchronize(Some(Duration::from_secs(10))).unwrap();
    assert!(after.load(Ordering::SeqCst));
    assert!(ok.load(Ordering::SeqCst), "b's op saw a's op done");
    a.synchronize(None).unwrap();
}

/// A wait refers to the latest record at the time it is queued: re-recording the event on
/// another (idle) stream must not release it early.
#[test]
fn rerecord_elsewhere_does_not_release_an_earlier_wait() {
    let rt = init();
    let (a, b, c) = (stream(&rt, 0), stream(&rt, 0), stream(&rt, 1));
    let gate = Gate::new();
    let e = Event::with_options(EventOptions::without_timing());
    let flag = Arc::new(AtomicBool::new(false));
    a.launch(gate.op()).unwrap();
    a.record(&e).unwrap();
    b.wait_event(&e).unwrap();
    b.launch(flag_op(&flag)).unwrap();
    c.record(&e).unwrap(); // completes at once: c is idle
    assert!(e.query().unwrap(), "the latest record has completed");
    assert!(common::timed_out(
        b.synchronize(Some(Duration::from_millis(20)))
    ));
    assert!(!flag.load(Ordering::SeqCst));
    gate.open();
    b.synchronize(Some(Duration::from_secs(10))).unwrap();
    assert!(flag.load(Ordering::SeqCst));
    a.synchronize(None).unwrap();
}

#[test]
fn destroyed_event_is_an_invalid_handle() {
    let rt = init();
    let s = stream(&rt, 0);
    let e = Event::new();
    s.record(&e).unwrap();
    e.destroy().unwrap();
    for r in [
        e.query().map(|_| ()),
        e.synchronize(None).map(|_| ()),
        s.record(&e),
        s.wait_event(&e),
        e.destroy(),
    ] {
        assert!(
            matches!(r, Err(Error::Device(DeviceError::InvalidHandle { .. }))),
            "{r:?}"
        );
    }
}

/// Once an event recorded as a stream's last command has completed, the stream is idle:
/// `query` never says false in the instant between the event's completion and the stream's
/// own count (and `synchronize` of the stream still implies the event has completed).
#[test]
fn an_event_recorded_last_completing_means_its_stream_is_idle() {
    let rt = init();
    let s = stream(&rt, 0);
    for i in 0..2000 {
        let e = Event::with_options(EventOptions {
            timing: false,
            blocking: i % 2 == 0,
        });
        s.launch(FnOp::shared("tiny", OpKind::Compute, || Ok(())))
            .unwrap();
        s.record(&e).unwrap();
        if i % 3 == 0 {
            s.synchronize(None).unwrap();
            assert!(
                e.query().unwrap(),
                "round {i}: stream synchronised, event pending"
            );
        } else {
            while !e.query().unwrap() {
                std::hint::spin_loop();
            }
            assert!(s.query().unwrap(), "round {i}: event done, stream busy");
        }
    }
}

/// Every user callback is contained: a completion callback that panics on the stream worker
/// that completes the event does not kill the worker. (Before, it ran outside `catch_unwind`:
/// the worker died mid-command, the stream never completed, and shutdown timed out.)
#[test]
fn a_panicking_completion_callback_leaves_the_worker_and_the_stream_running() {
    let rt = init();
    let s = stream(&rt, 1);
    for _ in 0..8 {
        let gate = Gate::new();
        s.launch(gate.op()).unwrap();
        let e = Event::new();
        s.record(&e).unwrap();
        let called = Arc::new(AtomicBool::new(false));
        let c = called.clone();
        e.on_complete(Box::new(move |_| {
            c.store(true, Ordering::SeqCst);
            panic!("callback exploded");
        }))
        .unwrap();
        gate.open();
        s.synchronize(Some(Duration::from_secs(120))).unwrap();
        assert!(called.load(Ordering::SeqCst) && e.query().unwrap());
        // The same workers run the next work.
        let flag = Arc::new(AtomicBool::new(false));
        s.launch(flag_op(&flag)).unwrap();
        s.synchronize(Some(Duration::from_secs(120))).unwrap();
        assert!(flag.load(Ordering::SeqCst));
    }
}
