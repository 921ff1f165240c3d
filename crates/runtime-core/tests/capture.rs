//! Capture and replay: work captured between `begin_capture` and `end_capture` does not run;
//! each `launch_graph` runs all of it, in order, as if it had been submitted then.
//!
//! All tests share one runtime (same settings, never shut down). Streams held back by a gate
//! op are never synchronised while the gate is closed.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use runtime_core::error::{Error, KernelFailure, StreamError};
use runtime_core::event::{Event, EventOptions};
use runtime_core::kernel::{self, DType, KernelArg, Tensor};
use runtime_core::runtime::{self};
use runtime_core::stream::{FnOp, Op, OpKind, Stream};

use common::init;

type Log = Arc<Mutex<Vec<String>>>;

fn log_op(log: &Log, name: &str) -> Arc<dyn Op> {
    let (log, n) = (log.clone(), name.to_string());
    FnOp::shared(name, OpKind::Compute, move || {
        log.lock().unwrap().push(n.clone());
        Ok(())
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

fn read_f32(b: &runtime_core::memory::Buffer, n: usize) -> Vec<f32> {
    let mut bytes = vec![0u8; n * 4];
    b.read(0, &mut bytes).unwrap();
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn replay_runs_everything_in_order_each_time() {
    let rt = init();
    let dev = rt.device(0).unwrap();
    let s = Stream::new(dev, 0).unwrap();
    let log: Log = Arc::new(Mutex::new(Vec::new()));
    let buf = dev.memory().allocate(8 * 4).unwrap();
    let x = Tensor::new(buf.clone(), 0, DType::F32, vec![8]).unwrap();
    let e = Event::new();

    s.begin_capture().unwrap();
    assert!(s.is_capturing());
    s.launch(log_op(&log, "a")).unwrap();
    kernel::launch(
        &s,
        kernel::find("fill").unwrap(),
        vec![KernelArg::Tensor(x.clone()), KernelArg::Float(1.0)],
    )
    .unwrap();
    s.launch(log_op(&log, "b")).unwrap();
    // x = 2 * x + x  (axpy in place): 1 -> 3 on each replay, after the fill.
    kernel::launch(
        &s,
        kernel::find("axpy").unwrap(),
        vec![
            KernelArg::Tensor(x.clone()),
            KernelArg::Tensor(x),
            KernelArg::Float(2.0),
        ],
    )
    .unwrap();
    s.record(&e).unwrap();
    s.launch(log_op(&log, "c")).unwrap();
    let g = s.end_capture().unwrap();
    assert!(!s.is_capturing());

    // Nothing ran or was queued during capture.
    assert!(log.lock().unwrap().is_empty());
    assert_eq!(s.counters(), (0, 0));
    assert!(!e.is_recorded());
    assert_eq!(read_f32(&buf, 8), vec![0.0; 8]);
    assert_eq!(g.len(), 6);
    assert!(!g.is_empty());
    let names = g.node_names();
    assert_eq!(&names[..4], ["a", "fill", "b", "axpy"]);
    assert!(names[4].starts_with("record(Event#"), "{names:?}");
    assert_eq!(names[5], "c");

    s.launch_graph(&g).unwrap();
    s.synchronize(None).unwrap();
    assert_eq!(*log.lock().unwrap(), ["a", "b", "c"]);
    assert_eq!(read_f32(&buf, 8), vec![3.0; 8]);
    assert!(e.query().unwrap());
    let t1 = e.timestamp_ns().unwrap();

    s.launch_graph(&g).unwrap();
    s.launch(log_op(&log, "after")).unwrap();
    s.synchronize(None).unwrap();
    assert_eq!(
        *log.lock().unwrap(),
        ["a", "b", "c", "a", "b", "c", "after"]
    );
    assert_eq!(read_f32(&buf, 8), vec![3.0; 8]);
    assert!(e.timestamp_ns().unwrap() >= t1);
}

#[test]
fn capture_state_errors() {
    let rt = init();
    let s = Stream::new(rt.device(1).unwrap(), 0).unwrap();
    assert!(matches!(
        s.end_capture(),
        Err(Error::Stream(StreamError::Invalid(_)))
    ));
    s.begin_capture().unwrap();
    assert!(matches!(
        s.begin_capture(),
        Err(Error::Stream(StreamError::Invalid(_)))
    ));
    let g = s.end_capture().unwrap();
    assert!(g.is_empty());
    s.launch_graph(&g).unwrap();
    s.synchronize(None).unwrap();
}

#[test]
fn a_graph_launched_inside_a_capture_is_inlined() {
    let rt = init();
    let s = Stream::new(rt.device(0).unwrap(), 0).unwrap();
    let log: Log = Arc::new(Mutex::new(Vec::new()));
    s.begin_capture().unwrap();
    s.launch(log_op(&log, "x")).unwrap();
    s.launch(log_op(&log, "y")).unwrap();
    let inner = s.end_capture().unwrap();
    s.begin_capture().unwrap();
    s.launch(log_op(&log, "start")).unwrap();
    s.launch_graph(&inner).unwrap();
    s.launch_graph(&inner).unwrap();
    let outer = s.end_capture().unwrap();
    assert_eq!(outer.len(), 5);
    assert!(log.lock().unwrap().is_empty());
    s.launch_graph(&outer).unwrap();
    s.synchronize(None).unwrap();
    assert_eq!(*log.lock().unwrap(), ["start", "x", "y", "x", "y"]);
}

#[test]
fn a_graph_runs_on_another_stream_too() {
    let rt = init();
    let s = Stream::new(rt.device(0).unwrap(), 0).unwrap();
    let t = Stream::new(rt.device(0).unwrap(), -2).unwrap();
    let log: Log = Arc::new(Mutex::new(Vec::new()));
    s.begin_capture().unwrap();
    s.launch(log_op(&log, "g")).unwrap();
    let g = s.end_capture().unwrap();
    t.launch_graph(&g).unwrap();
    t.launch_graph(&g).unwrap();
    t.synchronize(None).unwrap();
    assert_eq!(*log.lock().unwrap(), ["g", "g"]);
}

#[test]
fn a_failing_op_in_a_graph_skips_the_rest() {
    let rt = init();
    let s = Stream::new(rt.device(1).unwrap(), 0).unwrap();
    let log: Log = Arc::new(Mutex::new(Vec::new()));
    let e = Event::with_options(EventOptions::without_timing());
    s.begin_capture().unwrap();
    s.launch(log_op(&log, "before")).unwrap();
    s.launch(FnOp::shared("graph_fail", OpKind::Compute, || {
        Err(KernelFailure::new("graph_fail", "nope"))
    }))
    .unwrap();
    s.launch(log_op(&log, "behind")).unwrap();
    s.record(&e).unwrap();
    let g = s.end_capture().unwrap();
    s.launch_graph(&g).unwrap();
    match s.synchronize(None) {
        Err(Error::Stream(StreamError::Kernel(f))) => assert_eq!(f.kernel, "graph_fail"),
        other => panic!("{other:?}"),
    }
    assert_eq!(*log.lock().unwrap(), ["before"]);
    assert!(e.query().unwrap(), "records in the graph still complete");
}

/// A wait captured in a graph, and the same event recorded on the replaying stream right
/// after `launch_graph`: the wait must refer to the record that existed at launch, not the one
/// queued behind the graph on its own stream (which would never complete first).
#[test]
fn a_graph_wait_does_not_wait_for_a_record_queued_after_the_launch() {
    let rt = init();
    let (s, other) = (
        Stream::new(rt.device(0).unwrap(), 0).unwrap(),
        Stream::new(rt.device(0).unwrap(), 0).unwrap(),
    );
    let log: Log = Arc::new(Mutex::new(Vec::new()));
    let e = Event::with_options(EventOptions::without_timing());
    // e's first record, on another stream, completes at once.
    other.record(&e).unwrap();

    s.begin_capture().unwrap();
    s.wait_event(&e).unwrap();
    s.launch(log_op(&log, "step")).unwrap();
    let g = s.end_capture().unwrap();

    // The replaying stream is busy, so the graph has not started when `e` is recorded again
    // behind it.
    let gate = Gate::new();
    s.launch(gate.op()).unwrap();
    s.launch_graph(&g).unwrap();
    s.record(&e).unwrap();
    gate.open();
    s.synchronize(Some(Duration::from_secs(10)))
        .expect("the stream deadlocked on a record queued behind the graph");
    assert_eq!(*log.lock().unwrap(), ["step"]);

    // Same with an event never recorded before the launch: the wait is a no-op.
    let fresh = Event::with_options(EventOptions::without_timing());
    s.begin_capture().unwrap();
    s.wait_event(&fresh).unwrap();
    s.launch(log_op(&log, "step2")).unwrap();
    let g = s.end_capture().unwrap();
    let gate = Gate::new();
    s.launch(gate.op()).unwrap();
    s.launch_graph(&g).unwrap();
    s.record(&fresh).unwrap();
    gate.open();
    s.synchronize(Some(Duration::from_secs(10)))
        .expect("the stream deadlocked on a record queued behind the graph");
    assert_eq!(*log.lock().unwrap(), ["step", "step2"]);
}

/// A record captured in a graph counts as submitted when the graph is launched: another stream
/// that waits on the event after the launch waits for the graph's work.
#[test]
fn a_wait_after_launch_graph_waits_for_the_graphs_record() {
    let rt = init();
    let (s, b) = (
        Stream::new(rt.device(0).unwrap(), 0).unwrap(),
        Stream::new(rt.device(1).unwrap(), 0).unwrap(),
    );
    let done = Arc::new(AtomicBool::new(false));
    let e = Event::with_options(EventOptions::without_timing());
    s.begin_capture().unwrap();
    let d = done.clone();
    s.launch(FnOp::shared("graph_work", OpKind::Compute, move || {
        d.store(true, Ordering::SeqCst);
        Ok(())
    }))
    .unwrap();
    s.record(&e).unwrap();
    let g = s.end_capture().unwrap();

    let gate = Gate::new();
    s.launch(gate.op()).unwrap();
    s.launch_graph(&g).unwrap();
    b.wait_event(&e).unwrap();
    let (d, saw) = (done.clone(), Arc::new(AtomicBool::new(false)));
    let saw2 = saw.clone();
    b.launch(FnOp::shared("after_graph", OpKind::Compute, move || {
        saw2.store(d.load(Ordering::SeqCst), Ordering::SeqCst);
        Ok(())
    }))
    .unwrap();
    assert!(!e.query().unwrap(), "the graph's record is pending");
    assert!(
        common::timed_out(b.synchronize(Some(Duration::from_millis(20)))),
        "b must wait for the graph"
    );
    gate.open();
    b.synchronize(Some(Duration::from_secs(10))).unwrap();
    assert!(
        saw.load(Ordering::SeqCst),
        "b's op ran after the graph's op"
    );
    s.synchronize(None).unwrap();
}

fn is_capturing_error<T: std::fmt::Debug>(r: runtime_core::Result<T>) -> bool {
    matches!(r, Err(Error::Stream(StreamError::Capturing { .. })))
}

/// Anything that would wait for a capturing stream's work is refused (CUDA's
/// `cudaErrorStreamCaptureImplicit`): it would otherwise return before the captured work
/// ever ran, e.g. a blocking copy would hand back unfilled memory.
#[test]
fn waits_on_a_capturing_stream_are_refused() {
    let rt = init();
    let dev = rt.device(1).unwrap();
    let s = Stream::new(dev, 0).unwrap();
    let log: Log = Arc::new(Mutex::new(Vec::new()));
    s.begin_capture().unwrap();
    assert!(is_capturing_error(s.synchronize(None)));
    assert!(is_capturing_error(dev.synchronize(None)));
    assert!(is_capturing_error(runtime::synchronize_all(None)));
    assert!(is_capturing_error(
        runtime_core::bindings::submit_blocking_on(&s, None, log_op(&log, "copy"))
    ));
    let mut back = [0u8; 4];
    let buf = dev.memory().allocate(4).unwrap();
    assert!(is_capturing_error(s.copy_to_host(&buf, 0, &mut back)));
    let g = s.end_capture().unwrap();
    assert!(g.is_empty());
    s.synchronize(None).unwrap();
    dev.synchronize(None).unwrap();
    assert!(log.lock().unwrap().is_empty());
}

/// CUDA's cross-stream capture: an event recorded in A's capture and waited on by B pulls B
/// into the capture (fork); B's last record, waited on by A, joins it back. The graph
/// replays the fork/join with every dependency respected.
#[test]
fn cross_stream_capture_forks_and_joins() {
    let rt = init();
    let dev = rt.device(0).unwrap();
    let (a, b) = (Stream::new(dev, 0).unwrap(), Stream::new(dev, 0).unwrap());
    let log: Log = Arc::new(Mutex::new(Vec::new()));
    let buf = dev.memory().allocate(4 * 4).unwrap();
    let x = Tensor::new(buf.clone(), 0, DType::F32, vec![4]).unwrap();
    let (fork, join) = (
        Event::with_options(EventOptions::without_timing()),
        Event::with_options(EventOptions::without_timing()),
    );

    a.begin_capture().unwrap();
    a.launch(log_op(&log, "a1")).unwrap();
    kernel::launch(
        &a,
        kernel::find("fill").unwrap(),
        vec![KernelArg::Tensor(x.clone()), KernelArg::Float(2.0)],
    )
    .unwrap();
    a.record(&fork).unwrap();
    assert!(!b.is_capturing());
    b.wait_event(&fork).unwrap();
    assert!(
        b.is_capturing(),
        "waiting on a captured event joins the capture"
    );
    b.launch(log_op(&log, "b1")).unwrap();
    // x = 3 * x + x on B: needs A's fill first.
    kernel::launch(
        &b,
        kernel::find("axpy").unwrap(),
        vec![
            KernelArg::Tensor(x.clone()),
            KernelArg::Tensor(x.clone()),
            KernelArg::Float(3.0),
        ],
    )
    .unwrap();
    b.record(&join).unwrap();
    match b.end_capture() {
        Err(Error::Stream(StreamError::Invalid(m))) => assert!(m.contains("end it there"), "{m}"),
        r => panic!("a joined stream ended the capture: {r:?}"),
    }
    a.wait_event(&join).unwrap();
    a.launch(log_op(&log, "a2")).unwrap();
    // x = 0.5 * x on A: after B's axpy.
    kernel::launch(
        &a,
        kernel::find("scale").unwrap(),
        vec![
            KernelArg::Tensor(x.clone()),
            KernelArg::Tensor(x),
            KernelArg::Float(0.5),
        ],
    )
    .unwrap();
    let g = a.end_capture().unwrap();
    assert!(!a.is_capturing() && !b.is_capturing());
    assert!(log.lock().unwrap().is_empty(), "nothing ran during capture");
    assert_eq!(b.counters(), (0, 0));

    for round in 1..=3 {
        a.launch_graph(&g).unwrap();
        a.synchronize(None).unwrap();
        assert_eq!(read_f32(&buf, 4), vec![4.0; 4], "round {round}");
        let l = log.lock().unwrap();
        assert_eq!(&l[l.len() - 3..], ["a1", "b1", "a2"]);
    }
    // The events work normally again outside the capture.
    b.record(&join).unwrap();
    b.synchronize(None).unwrap();
    assert!(join.query().unwrap());
}

/// A forked stream that is never joined back makes `end_capture` fail (CUDA's
/// `cudaErrorStreamCaptureUnjoined`); the capture is over for both streams either way.
#[test]
fn a_capture_with_an_unjoined_fork_fails_to_end() {
    let rt = init();
    let dev = rt.device(0).unwrap();
    let (a, b) = (Stream::new(dev, 0).unwrap(), Stream::new(dev, 0).unwrap());
    let log: Log = Arc::new(Mutex::new(Vec::new()));
    let fork = Event::with_options(EventOptions::without_timing());
    a.begin_capture().unwrap();
    a.record(&fork).unwrap();
    b.wait_event(&fork).unwrap();
    b.launch(log_op(&log, "b1")).unwrap();
    match a.end_capture() {
        Err(Error::Stream(StreamError::Invalid(m))) => {
            assert!(m.contains(&format!("Stream#{}", b.id())), "{m}")
        }
        r => panic!("unjoined capture ended: {r:?}"),
    }
    assert!(!a.is_capturing() && !b.is_capturing());
    b.launch(log_op(&log, "after")).unwrap();
    b.synchronize(None).unwrap();
    assert_eq!(*log.lock().unwrap(), ["after"]);
}

/// Inside a capture, a wait on an event recorded outside any capture is an ordinary
/// dependency: each replay waits for that event's latest record at launch.
#[test]
fn a_captured_wait_on_an_outside_event_is_an_ordinary_dependency() {
    let rt = init();
    let dev = rt.device(0).unwrap();
    let (producer, s) = (Stream::new(dev, 0).unwrap(), Stream::new(dev, 0).unwrap());
    let log: Log = Arc::new(Mutex::new(Vec::new()));
    let ready = Event::with_options(EventOptions::without_timing());
    s.begin_capture().unwrap();
    s.wait_event(&ready).unwrap();
    s.launch(log_op(&log, "consumer")).unwrap();
    let g = s.end_capture().unwrap();

    let gate = Gate::new();
    producer.launch(gate.op()).unwrap();
    producer.launch(log_op(&log, "producer")).unwrap();
    producer.record(&ready).unwrap();
    s.launch_graph(&g).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert!(
        log.lock().unwrap().is_empty(),
        "the replay waited for the record"
    );
    gate.open();
    s.synchronize(None).unwrap();
    assert_eq!(*log.lock().unwrap(), ["producer", "consumer"]);
}
