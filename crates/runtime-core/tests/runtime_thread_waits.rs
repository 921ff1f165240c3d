//! Blocking calls made from a kernel or host function (a runtime thread) either complete or
//! fail at once with `NotPermitted`; they never hang, with `enablePipelining` on or off.
//!
//! Each scenario runs an op that makes the call and reports its result through a channel;
//! the test then checks the stream is still usable. Tests in this file hold one lock, since
//! they change process-wide options.

use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use runtime_core::config::ConfigBuilder;
use runtime_core::error::{Error, StreamError};
use runtime_core::event::{Event, EventOptions};
use runtime_core::runtime::{self, Runtime};
use runtime_core::stream::{FnOp, OpKind, Stream};

static LOCK: Mutex<()> = Mutex::new(());

fn setup(pipelining: bool) -> (MutexGuard<'static, ()>, Arc<Runtime>) {
    let g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    runtime::set_option(runtime_core::config::RuntimeOption::Pipelining, pipelining);
    let rt = runtime::init(&ConfigBuilder {
        device_count: Some(2),
        memory: Some(runtime_core::Bytes::mib(64)),
        profile: None,
    })
    .expect("init the runtime");
    (g, rt)
}

type Outcome = Result<(), Error>;

/// Run `call` inside an op on `on`; return what it returned (or fail the test after 10 s,
/// which would be a hang).
fn from_op(on: &Stream, call: impl FnOnce() -> Outcome + Send + 'static) -> Outcome {
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    let call = Mutex::new(Some(call));
    on.launch(FnOp::shared("caller", OpKind::Compute, move || {
        let f = call.lock().unwrap().take().expect("runs once");
        tx.lock().unwrap().send(f()).unwrap();
        Ok(())
    }))
    .unwrap();
    let got = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the call from the runtime thread hung");
    on.synchronize(Some(Duration::from_secs(10))).unwrap();
    got
}

fn not_permitted(r: &Outcome) -> bool {
    matches!(r, Err(Error::Stream(StreamError::NotPermitted { .. })))
}

fn scenarios(pipelining: bool) {
    let (_g, rt) = setup(pipelining);
    let dev = rt.device(0).unwrap().clone();
    let a = Stream::new(&dev, 0).unwrap();

    // Its own stream: synchronize, destroy, a device barrier, the all-streams barrier.
    let me = a.clone();
    let r = from_op(&a, move || me.synchronize(None));
    assert!(not_permitted(&r), "own synchronize: {r:?}");
    let me = a.clone();
    let r = from_op(&a, move || me.destroy());
    assert!(not_permitted(&r), "own destroy: {r:?}");
    assert!(!a.is_destroyed());
    let d = dev.clone();
    let r = from_op(&a, move || d.synchronize(None));
    assert!(not_permitted(&r), "device synchronize: {r:?}");
    let r = from_op(&a, || runtime::synchronize_all(None));
    assert!(not_permitted(&r), "all-streams barrier: {r:?}");
    let r = from_op(&a, runtime::shutdown);
    assert!(not_permitted(&r), "shutdown: {r:?}");
    assert!(runtime::is_initialized());

    // Another stream that is idle: completes.
    let idle = Stream::new(&dev, 0).unwrap();
    let other = idle.clone();
    from_op(&a, move || other.synchronize(None)).unwrap();

    // Another stream with queued work nobody has started (held back by an event): the op
    // cannot run it (it is blocked on the event), so the wait is refused rather than hung.
    let gate = Event::with_options(EventOptions::without_timing());
    let holder = Stream::new(rt.device(1).unwrap(), 0).unwrap();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let release_rx = Mutex::new(release_rx);
    holder
        .launch(FnOp::shared("hold", OpKind::Compute, move || {
            let _ = release_rx
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(10));
            Ok(())
        }))
        .unwrap();
    holder.record(&gate).unwrap();
    let blocked = Stream::new(&dev, 0).unwrap();
    blocked.wait_event(&gate).unwrap();
    blocked
        .launch(FnOp::shared("after", OpKind::Compute, || Ok(())))
        .unwrap();
    let other = blocked.clone();
    let r = from_op(&a, move || other.synchronize(None));
    assert!(not_permitted(&r), "blocked stream: {r:?}");
    release_tx.send(()).unwrap();
    blocked.synchronize(Some(Duration::from_secs(10))).unwrap();
    holder.synchronize(Some(Duration::from_secs(10))).unwrap();

    // An event not yet reached, from a runtime thread: refused; a completed one: fine.
    let pending = Event::with_options(EventOptions::without_timing());
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let go_rx = Mutex::new(go_rx);
    holder
        .launch(FnOp::shared("hold", OpKind::Compute, move || {
            let _ = go_rx.lock().unwrap().recv_timeout(Duration::from_secs(10));
            Ok(())
        }))
        .unwrap();
    holder.record(&pending).unwrap();
    let e = pending.clone();
    let r = from_op(&a, move || e.synchronize(None));
    assert!(not_permitted(&r), "pending event: {r:?}");
    go_tx.send(()).unwrap();
    pending.synchronize(Some(Duration::from_secs(10))).unwrap();
    let e = pending.clone();
    from_op(&a, move || e.synchronize(None)).unwrap();

    // The streams are usable afterwards.
    a.launch(FnOp::shared("after all", OpKind::Compute, || Ok(())))
        .unwrap();
    a.synchronize(None).unwrap();
    drop(rt);
    runtime::shutdown().expect("shutdown");
    runtime::set_option(runtime_core::config::RuntimeOption::Pipelining, true);
}

#[test]
fn waits_from_runtime_threads_complete_or_fail_fast_with_pipelining() {
    scenarios(true);
}

#[test]
fn waits_from_runtime_threads_complete_or_fail_fast_without_pipelining() {
    scenarios(false);
}

/// With one serial engine, a host function that waits for another stream's queued work runs
/// that work itself instead of waiting for a worker that is busy running the caller.
#[test]
fn a_wait_for_queued_work_runs_it_inline_on_the_serial_engine() {
    let (_g, rt) = setup(false);
    let dev = rt.device(0).unwrap().clone();
    let (a, b) = (Stream::new(&dev, 0).unwrap(), Stream::new(&dev, 0).unwrap());
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    let b2 = b.clone();
    a.launch(FnOp::shared("waits for b", OpKind::Compute, move || {
        let (btx, brx) = mpsc::channel();
        let btx = Mutex::new(btx);
        b2.launch(FnOp::shared("b", OpKind::Compute, move || {
            btx.lock().unwrap().send(7).unwrap();
            Ok(())
        }))
        .unwrap();
        let done = b2.synchronize(None);
        tx.lock()
            .unwrap()
            .send((done.map_err(|e| e.to_string()), brx.try_recv().ok()))
            .unwrap();
        Ok(())
    }))
    .unwrap();
    let (done, value) = rx.recv_timeout(Duration::from_secs(10)).expect("hung");
    assert_eq!(done, Ok(()));
    assert_eq!(value, Some(7));
    a.synchronize(None).unwrap();
    drop(rt);
    runtime::shutdown().expect("shutdown");
    runtime::set_option(runtime_core::config::RuntimeOption::Pipelining, true);
}

/// A blocking submission from a runtime thread (a synchronous-mode launch, a blocking copy)
/// either runs right there (its stream is idle) or is refused before anything is queued:
/// never "refused, but run anyway".
#[test]
fn blocking_submissions_from_runtime_threads_run_inline_or_leave_no_trace() {
    let (_g, rt) = setup(true);
    let dev = rt.device(0).unwrap().clone();
    let (a, idle) = (Stream::new(&dev, 0).unwrap(), Stream::new(&dev, 0).unwrap());
    let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counting = |ran: &Arc<std::sync::atomic::AtomicUsize>| {
        let ran = ran.clone();
        FnOp::shared("counted", OpKind::Copy, move || {
            ran.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        })
    };
    // A blocking copy on the stream running the caller: refused, and it never runs.
    let (me, op) = (a.clone(), counting(&ran));
    let r = from_op(&a, move || {
        runtime_core::bindings::submit_blocking_on(&me, None, op).map(|_| ())
    });
    assert!(not_permitted(&r), "own stream: {r:?}");
    // On an idle stream it runs right there.
    let (other, op) = (idle.clone(), counting(&ran));
    from_op(&a, move || {
        runtime_core::bindings::submit_blocking_on(&other, None, op).map(|_| ())
    })
    .unwrap();
    // A synchronous-mode launch on the stream running the caller: refused, never run.
    runtime::set_option(runtime_core::config::RuntimeOption::Async, false);
    let (me, op) = (a.clone(), counting(&ran));
    let r = from_op(&a, move || me.launch(op));
    runtime::set_option(runtime_core::config::RuntimeOption::Async, true);
    assert!(not_permitted(&r), "own stream, synchronous mode: {r:?}");
    a.synchronize(None).unwrap();
    idle.synchronize(None).unwrap();
    assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 1);
    drop(rt);
    runtime::shutdown().expect("shutdown");
}
