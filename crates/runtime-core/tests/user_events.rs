//! User events (`Event::user`): completed by the host, waited on by streams, failed, and
//! released by `shutdown`; completion callbacks (`Event::on_complete`); `Event::device`.
//!
//! One test function: `shutdown` ends the runtime the binary's checks share.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use runtime_core::error::{Error, StreamError};
use runtime_core::event::Event;
use runtime_core::stream::{FnOp, OpKind, Stream};

const WAIT: Duration = Duration::from_secs(10);

fn log_op(
    log: &Arc<Mutex<Vec<&'static str>>>,
    what: &'static str,
) -> Arc<dyn runtime_core::stream::Op> {
    let log = log.clone();
    FnOp::shared("log", OpKind::Compute, move || {
        log.lock().unwrap().push(what);
        Ok(())
    })
}

#[test]
fn user_events() {
    let rt = common::init();
    let dev = rt.device(1).unwrap();

    // A stream waits for the host to set the event; callbacks run once it is set.
    let s = Stream::new(dev, 0).unwrap();
    let ev = Event::user();
    assert!(ev.is_user());
    assert!(!ev.query().unwrap());
    assert_eq!(ev.device(), None);
    let log = Arc::new(Mutex::new(Vec::new()));
    s.launch(log_op(&log, "before")).unwrap();
    s.wait_event(&ev).unwrap();
    s.launch(log_op(&log, "after")).unwrap();
    let called = Arc::new(AtomicUsize::new(0));
    let c = called.clone();
    ev.on_complete(Box::new(move |outcome| {
        assert!(outcome.is_ok());
        c.fetch_add(1, Ordering::SeqCst);
    }))
    .unwrap();
    assert!(common::timed_out(
        s.synchronize(Some(Duration::from_millis(20)))
    ));
    assert_eq!(*log.lock().unwrap(), vec!["before"]);
    assert_eq!(called.load(Ordering::SeqCst), 0);
    ev.set().unwrap();
    s.synchronize(Some(WAIT)).unwrap();
    assert_eq!(*log.lock().unwrap(), vec!["before", "after"]);
    assert_eq!(called.load(Ordering::SeqCst), 1);
    assert!(
        matches!(ev.set(), Err(Error::Stream(StreamError::Invalid(m))) if m.contains("already set"))
    );
    assert!(
        matches!(s.record(&ev), Err(Error::Stream(StreamError::Invalid(m))) if m.contains("cannot be recorded"))
    );
    assert!(
        matches!(Event::new().set(), Err(Error::Stream(StreamError::Invalid(m))) if m.contains("not a user event"))
    );

    // A callback on a completed (or never recorded) event runs at once, on this thread.
    let (tx, rx) = mpsc::channel();
    let here = std::thread::current().id();
    Event::new()
        .on_complete(Box::new(move |_| {
            tx.send(std::thread::current().id()).unwrap()
        }))
        .unwrap();
    assert_eq!(rx.try_recv().unwrap(), here);

    // Event::device is the device of the stream of the last record.
    let e = Event::new();
    s.record(&e).unwrap();
    assert_eq!(e.device(), Some(1));

    // A failed user event fails the waiting stream once; the work behind it is skipped.
    let failed = Event::user();
    let log2 = Arc::new(Mutex::new(Vec::new()));
    s.wait_event(&failed).unwrap();
    s.launch(log_op(&log2, "skipped")).unwrap();
    let (ftx, frx) = mpsc::channel();
    failed
        .on_complete(Box::new(move |failure| ftx.send(failure).unwrap()))
        .unwrap();
    failed.set_failed("sensor unplugged").unwrap();
    match frx.try_recv().unwrap() {
        Err(Error::Stream(StreamError::Kernel(k))) => {
            assert_eq!(k.kernel, format!("UserEvent#{}", failed.id()));
            assert_eq!(k.message, "sensor unplugged");
        }
        other => panic!("expected the user event's failure, got {other:?}"),
    }
    match s.synchronize(Some(WAIT)) {
        Err(Error::Stream(StreamError::Kernel(k))) => {
            assert_eq!(k.kernel, format!("wait(UserEvent#{})", failed.id()));
            assert_eq!(k.message, "sensor unplugged");
            assert_eq!(k.stream, s.id());
        }
        other => panic!("expected the wait's failure, got {other:?}"),
    }
    assert!(log2.lock().unwrap().is_empty());
    s.synchronize(Some(WAIT)).unwrap();
    assert!(matches!(
        failed.synchronize(Some(WAIT)),
        Err(Error::Stream(StreamError::Kernel(_)))
    ));
    assert_eq!(failed.failure().as_deref(), Some("sensor unplugged"));

    cancelled_completion_callbacks_are_dropped_at_once_and_never_run();

    // Shutdown releases a stream waiting on a user event nobody sets.
    let stuck = Stream::new(dev, 0).unwrap();
    let never = Event::user();
    let log3 = Arc::new(Mutex::new(Vec::new()));
    stuck.wait_event(&never).unwrap();
    stuck.launch(log_op(&log3, "behind")).unwrap();
    drop(rt);
    assert!(
        runtime_core::bindings::shutdown_within(Some(WAIT)).unwrap(),
        "shutdown hung on the user event"
    );
    assert!(never.failure().unwrap().contains("shut down"));
    assert!(log3.lock().unwrap().is_empty());
}

/// A cancelled completion callback (a cancelled or timed-out `await`) is dropped at once,
/// with everything it holds, and never runs; one that ran cannot be cancelled. (Called by
/// `user_events`, before its shutdown.)
fn cancelled_completion_callbacks_are_dropped_at_once_and_never_run() {
    let ev = Event::user();
    let held = Arc::new(());
    let called = Arc::new(AtomicUsize::new(0));
    let mut regs = Vec::new();
    for _ in 0..100 {
        let (h, c) = (held.clone(), called.clone());
        regs.push(
            ev.on_complete(Box::new(move |_| {
                let _keep = h;
                c.fetch_add(1, Ordering::SeqCst);
            }))
            .unwrap(),
        );
    }
    assert_eq!(ev.parked_callbacks(), 100);
    assert_eq!(Arc::strong_count(&held), 101);
    let kept = regs.pop().unwrap();
    for r in regs {
        assert!(r.cancel());
    }
    assert_eq!(ev.parked_callbacks(), 1);
    assert_eq!(Arc::strong_count(&held), 2);
    ev.set().unwrap();
    assert_eq!(called.load(Ordering::SeqCst), 1);
    assert_eq!(Arc::strong_count(&held), 1);
    assert!(!kept.cancel(), "a callback that ran cannot be taken back");
    // Registered on a completed event, it runs at once and there is nothing to cancel.
    let (h, c) = (held.clone(), called.clone());
    let ran = ev
        .on_complete(Box::new(move |_| {
            let _keep = h;
            c.fetch_add(1, Ordering::SeqCst);
        }))
        .unwrap();
    assert_eq!(called.load(Ordering::SeqCst), 2);
    assert!(!ran.cancel());
    assert_eq!(Arc::strong_count(&held), 1);
}
