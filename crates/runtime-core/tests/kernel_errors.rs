//! A failing op (an error or a panic) is reported at the next synchronisation of its stream,
//! naming the kernel; ops queued behind it are skipped, event records still complete, and
//! after the report the stream runs new work normally.
//!
//! All tests share one runtime. They hold a file-level lock, since a device-wide
//! synchronisation in one test would take (and clear) another test's pending error.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use runtime_core::error::{Error, KernelFailure, StreamError};
use runtime_core::event::{Event, EventOptions};
use runtime_core::runtime::{self, Runtime};
use runtime_core::stream::{FnOp, Op, OpKind, Stream};

static LOCK: Mutex<()> = Mutex::new(());

fn init() -> (MutexGuard<'static, ()>, Arc<Runtime>) {
    let g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    (g, common::init())
}

fn count_op(c: &Arc<AtomicUsize>) -> Arc<dyn Op> {
    let c = c.clone();
    FnOp::shared("count", OpKind::Compute, move || {
        c.fetch_add(1, Ordering::SeqCst);
        Ok(())
    })
}

fn failing_op() -> Arc<dyn Op> {
    FnOp::shared("bad_kernel", OpKind::Compute, || {
        Err(KernelFailure::new("bad_kernel", "boom: value out of range"))
    })
}

fn panicking_op() -> Arc<dyn Op> {
    FnOp::shared("panicky_kernel", OpKind::Compute, || {
        panic!("kaboom {}", 42);
    })
}

/// An op that blocks its stream until `open` is called (or fails after 10 s).
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
                Err(KernelFailure::new("gate", "never opened"))
            }
        })
    }

    fn open(&self) {
        *self.0 .0.lock().unwrap() = true;
        self.0 .1.notify_all();
    }
}

fn expect_kernel_error(r: runtime_core::Result<()>, kernel: &str, stream: &Stream) -> String {
    match r {
        Err(Error::Stream(StreamError::Kernel(f))) => {
            assert_eq!(f.kernel, kernel);
            assert_eq!(f.stream, stream.id());
            let text = Error::from(f.clone()).to_string();
            assert!(text.contains(kernel), "{text}");
            f.message
        }
        other => panic!("expected a kernel failure of {kernel}, got {other:?}"),
    }
}

/// The shared scenario: ok op, failing op, skipped op, record; then recovery.
fn check_failure_scenario(bad: Arc<dyn Op>, name: &str) -> String {
    let (_g, rt) = init();
    let s = Stream::new(rt.device(0).unwrap(), 0).unwrap();
    let gate = Gate::new();
    let (before, behind, later) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let e = Event::new();
    // Hold the stream so that everything is queued before the failure happens.
    s.launch(gate.op()).unwrap();
    s.launch(count_op(&before)).unwrap();
    s.launch(bad).unwrap();
    s.launch(count_op(&behind)).unwrap();
    s.launch(count_op(&behind)).unwrap();
    s.record(&e).unwrap();
    s.launch(count_op(&behind)).unwrap();
    gate.open();

    // The record behind the failure completes (nothing waiting on it hangs) ...
    e.synchronize(Some(Duration::from_secs(10))).unwrap();
    assert!(e.query().unwrap());
    assert!(e.timestamp_ns().is_ok());
    // ... and the error surfaces at the next synchronize.
    let message = expect_kernel_error(s.synchronize(None), name, &s);
    assert_eq!(before.load(Ordering::SeqCst), 1);
    assert_eq!(
        behind.load(Ordering::SeqCst),
        0,
        "ops behind the error are skipped"
    );
    let (submitted, completed) = s.counters();
    assert_eq!(submitted, completed, "skipped ops still count as completed");

    // Reported once; afterwards the stream runs new work normally.
    s.synchronize(None).unwrap();
    s.launch(count_op(&later)).unwrap();
    s.launch(count_op(&later)).unwrap();
    s.synchronize(None).unwrap();
    assert_eq!(later.load(Ordering::SeqCst), 2);
    assert_eq!(behind.load(Ordering::SeqCst), 0);
    message
}

#[test]
fn an_error_is_reported_at_the_next_synchronize() {
    let message = check_failure_scenario(failing_op(), "bad_kernel");
    assert!(message.contains("boom: value out of range"), "{message}");
}

#[test]
fn a_panic_is_reported_at_the_next_synchronize() {
    let message = check_failure_scenario(panicking_op(), "panicky_kernel");
    assert!(message.contains("panicked"), "{message}");
    assert!(message.contains("kaboom 42"), "{message}");
}

/// A graph replay runs its consecutive ops as one unit (`panics::OpScope`): a panic in one
/// node is reported as that kernel's, with its own message, the ops behind it are skipped,
/// the record after them still completes, and the next replay runs every node again.
#[test]
fn a_panic_inside_a_graph_replay_is_that_nodes_failure() {
    let (_g, rt) = init();
    let s = Stream::new(rt.device(0).unwrap(), 0).unwrap();
    let (before, behind) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let e = Event::new();
    s.begin_capture().unwrap();
    s.launch(count_op(&before)).unwrap();
    s.launch(count_op(&before)).unwrap();
    s.launch(panicking_op()).unwrap();
    s.launch(count_op(&behind)).unwrap();
    s.record(&e).unwrap();
    let g = s.end_capture().unwrap();
    for replay in 1..=2 {
        s.launch_graph(&g).unwrap();
        let message = expect_kernel_error(s.synchronize(None), "panicky_kernel", &s);
        assert!(message.contains("kaboom 42"), "{message}");
        assert!(message.contains("kernel_errors.rs:"), "location: {message}");
        assert_eq!(
            before.load(Ordering::SeqCst),
            2 * replay,
            "the nodes before ran"
        );
        assert_eq!(
            behind.load(Ordering::SeqCst),
            0,
            "the node behind was skipped"
        );
        assert!(e.query().unwrap(), "the record after the failure completed");
    }
    s.launch(count_op(&behind)).unwrap();
    s.synchronize(None).unwrap();
    assert_eq!(
        behind.load(Ordering::SeqCst),
        1,
        "the stream runs new work after the report"
    );
}

#[test]
fn a_panic_with_a_non_string_payload_is_reported() {
    let (_g, rt) = init();
    let s = Stream::new(rt.device(1).unwrap(), 0).unwrap();
    s.launch(FnOp::shared("odd_panic", OpKind::Compute, || {
        std::panic::panic_any(17u32)
    }))
    .unwrap();
    let message = expect_kernel_error(s.synchronize(None), "odd_panic", &s);
    assert!(message.contains("panicked"), "{message}");
    s.synchronize(None).unwrap();
}

#[test]
fn only_the_first_error_is_reported() {
    let (_g, rt) = init();
    let s = Stream::new(rt.device(0).unwrap(), 0).unwrap();
    let gate = Gate::new();
    s.launch(gate.op()).unwrap();
    s.launch(failing_op()).unwrap();
    s.launch(panicking_op()).unwrap();
    gate.open();
    expect_kernel_error(s.synchronize(None), "bad_kernel", &s);
    s.synchronize(None).unwrap();
}

#[test]
fn a_stream_waiting_on_an_event_behind_a_failure_does_not_hang() {
    let (_g, rt) = init();
    let a = Stream::new(rt.device(0).unwrap(), 0).unwrap();
    let b = Stream::new(rt.device(1).unwrap(), 0).unwrap();
    let e = Event::with_options(EventOptions::without_timing());
    let ran = Arc::new(AtomicUsize::new(0));
    a.launch(failing_op()).unwrap();
    a.record(&e).unwrap();
    b.wait_event(&e).unwrap();
    b.launch(count_op(&ran)).unwrap();
    b.synchronize(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 1, "b has no error of its own");
    expect_kernel_error(a.synchronize(None), "bad_kernel", &a);
}

#[test]
fn device_and_global_synchronize_report_the_error() {
    let (_g, rt) = init();
    let dev = rt.device(1).unwrap();
    let s = Stream::new(dev, 0).unwrap();
    s.launch(failing_op()).unwrap();
    expect_kernel_error(dev.synchronize(None), "bad_kernel", &s);
    dev.synchronize(None).unwrap();

    s.launch(panicking_op()).unwrap();
    expect_kernel_error(runtime::synchronize_all(None), "panicky_kernel", &s);
    runtime::synchronize_all(None).unwrap();
    s.synchronize(None).unwrap();
}

#[test]
fn destroy_reports_a_pending_error() {
    let (_g, rt) = init();
    let s = Stream::new(rt.device(0).unwrap(), 0).unwrap();
    s.launch(failing_op()).unwrap();
    let r = s.destroy();
    expect_kernel_error(r, "bad_kernel", &s);
    assert!(s.is_destroyed());
    assert!(s.launch(failing_op()).is_err());
}

/// The barrier looks only at streams with work, errors or captures since it last found them
/// quiet; a stream it dropped from that list is seen again as soon as it gets new work.
#[test]
fn barriers_see_streams_again_after_finding_them_quiet() {
    let (_g, rt) = init();
    let dev = rt.device(1).unwrap();
    let streams: Vec<Stream> = (0..64).map(|_| Stream::new(dev, 0).unwrap()).collect();
    let ran = Arc::new(AtomicUsize::new(0));
    for s in &streams {
        s.launch(count_op(&ran)).unwrap();
    }
    dev.synchronize(None).unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 64);
    for round in 0..3 {
        // Work behind a gate on one stream, an error on another: both dropped off the list by
        // the previous barrier, both must be waited for and reported by the next one.
        let gate = Gate::new();
        let held = &streams[(round * 7 + 3) % 64];
        let failing = &streams[(round * 11 + 5) % 64];
        held.launch(gate.op()).unwrap();
        held.launch(count_op(&ran)).unwrap();
        failing.launch(failing_op()).unwrap();
        let opener = {
            let gate = Gate(gate.0.clone());
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                gate.open();
            })
        };
        expect_kernel_error(runtime::synchronize_all(None), "bad_kernel", failing);
        assert_eq!(
            ran.load(Ordering::SeqCst),
            64 + round + 1,
            "the held work ran first"
        );
        opener.join().unwrap();
        runtime::synchronize_all(None).unwrap();
    }
    // A capture on a stream the barrier had dropped is seen (refused) too.
    let s = &streams[9];
    s.begin_capture().unwrap();
    assert!(matches!(
        dev.synchronize(None),
        Err(Error::Stream(StreamError::Capturing { .. }))
    ));
    drop(s.end_capture());
    dev.synchronize(None).unwrap();
}
