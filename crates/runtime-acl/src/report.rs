//! Host callbacks delivered to a thread of the caller's choosing: `aclrtSubscribeReport`,
//! `aclrtLaunchCallback`, `aclrtProcessReport`, `aclrtUnSubscribeReport`.
//!
//! A thread subscribes to a stream with its thread id (`pthread_self()`, which is also
//! Python's `threading.get_ident()`), then loops on `aclrtProcessReport`. `aclrtLaunchCallback`
//! queues an op on the stream; when the stream reaches it, the op hands the callback to that
//! thread's queue, and the thread runs it inside `aclrtProcessReport`. A blocking callback
//! (`ACL_CALLBACK_BLOCK`) is followed on the stream by a wait on a user event that is set once
//! the callback returned, so the stream waits without holding an engine thread. The event is
//! set however the callback ends: run, dropped because its thread unsubscribed or ACL was
//! finalized, or never delivered because an earlier failure on the stream skipped the op (the
//! op is dropped then, and with it the callback) — so no stream waits for a callback that
//! will not come.
//!
//! Callbacks run outside every lock of this module.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use runtime_core::event::Event;
use runtime_core::stream::{FnOp, OpKind, Stream};

use crate::codes::*;
use crate::error::{AclError, AclResult};
use crate::state::{self, Handle};

/// A callback on its way to its thread. Dropping it (run or not) sets the event a blocking
/// callback's stream waits on.
pub struct Report {
    f: Option<Box<dyn FnOnce() + Send>>,
    done: Option<Event>,
}

impl Report {
    /// Run the callback on this thread.
    pub fn run(mut self) {
        if let Some(f) = self.f.take() {
            f();
        }
    }
}

impl Drop for Report {
    fn drop(&mut self) {
        if let Some(e) = self.done.take() {
            let _ = e.set();
        }
    }
}

struct ThreadQueue {
    items: Mutex<(VecDeque<Report>, bool)>,
    ready: Condvar,
}

impl ThreadQueue {
    /// Close the queue: a waiting `aclrtProcessReport` returns; pending reports are dropped
    /// (by the caller, outside the lock).
    fn close(&self) -> VecDeque<Report> {
        let mut g = self.items.lock();
        g.1 = true;
        let left = std::mem::take(&mut g.0);
        drop(g);
        self.ready.notify_all();
        left
    }
}

#[derive(Default)]
struct Subscriptions {
    /// Runtime stream id -> the thread id that serves it.
    by_stream: HashMap<u64, u64>,
    /// Thread id -> its queue.
    queues: HashMap<u64, Arc<ThreadQueue>>,
}

static SUBS: crate::fork::Mutex<Option<Subscriptions>> = crate::fork::Mutex::new(None);

fn with_subs<R>(f: impl FnOnce(&mut Subscriptions) -> R) -> R {
    let mut g = SUBS.lock();
    f(g.get_or_insert_with(Subscriptions::default))
}

/// The calling thread's id as ACL numbers threads (`pthread_self()`).
pub fn this_thread() -> u64 {
    // SAFETY: pthread_self has no preconditions and always succeeds.
    (unsafe { libc::pthread_self() }) as u64
}

/// A destroyed stream is served by no thread any more.
fn forget_stream(s: &Stream) {
    let closed = with_subs(|subs| {
        let tid = subs.by_stream.remove(&s.id())?;
        close_if_unused(subs, tid)
    });
    drop(closed);
}

/// Close and remove `tid`'s queue when it serves no stream any more.
fn close_if_unused(subs: &mut Subscriptions, tid: u64) -> Option<VecDeque<Report>> {
    if subs.by_stream.values().any(|&t| t == tid) {
        return None;
    }
    subs.queues.remove(&tid).map(|q| q.close())
}

/// `aclrtSubscribeReport`: thread `thread_id` serves `stream`'s callbacks.
pub fn subscribe(thread_id: u64, stream_h: Handle) -> AclResult<()> {
    const NAME: &str = "aclrtSubscribeReport";
    let s = state::stream(NAME, stream_h)?;
    state::on_stream_destroyed(forget_stream);
    with_subs(|subs| {
        match subs.by_stream.get(&s.id()) {
            Some(&t) if t == thread_id => {
                return Err(AclError::new(
                    ACL_ERROR_REPEAT_SUBSCRIBE,
                    format!("{NAME}: thread {thread_id} already serves this stream"),
                ))
            }
            Some(&t) => {
                return Err(AclError::new(
                    ACL_ERROR_RT_STREAM_SUBSCRIBE,
                    format!("{NAME}: the stream is served by thread {t} already"),
                ))
            }
            None => {}
        }
        subs.by_stream.insert(s.id(), thread_id);
        subs.queues.entry(thread_id).or_insert_with(|| {
            Arc::new(ThreadQueue {
                items: Mutex::new((VecDeque::new(), false)),
                ready: Condvar::new(),
            })
        });
        Ok(())
    })
}

/// `aclrtUnSubscribeReport`: thread `thread_id` no longer serves `stream`. Callbacks queued for
/// it and not yet run are dropped (a blocking one's stream goes on).
pub fn unsubscribe(thread_id: u64, stream_h: Handle) -> AclResult<()> {
    const NAME: &str = "aclrtUnSubscribeReport";
    let s = state::stream(NAME, stream_h)?;
    let dropped = with_subs(|subs| {
        if subs.by_stream.get(&s.id()) != Some(&thread_id) {
            return Err(AclError::new(
                ACL_ERROR_RT_STREAM_NO_CB_REG,
                format!("{NAME}: thread {thread_id} does not serve this stream"),
            ));
        }
        subs.by_stream.remove(&s.id());
        Ok(close_if_unused(subs, thread_id))
    })?;
    drop(dropped);
    Ok(())
}

/// `aclrtLaunchCallback`: queue `f` on the stream; the thread subscribed to it runs `f` when
/// the stream gets there (`block` `ACL_CALLBACK_BLOCK`: later work on the stream waits for it
/// to return).
pub fn launch(f: Box<dyn FnOnce() + Send>, block: i32, stream_h: Handle) -> AclResult<()> {
    const NAME: &str = "aclrtLaunchCallback";
    if block != ACL_CALLBACK_NO_BLOCK && block != ACL_CALLBACK_BLOCK {
        return Err(AclError::param(format!(
            "{NAME}: blockType {block} is not an aclrtCallbackBlockType (0 no block, 1 block)"
        )));
    }
    let s = state::stream(NAME, stream_h)?;
    let sid = s.id();
    let Some(tid) = with_subs(|subs| subs.by_stream.get(&sid).copied()) else {
        return Err(AclError::new(
            ACL_ERROR_RT_STREAM_NO_CB_REG,
            format!("{NAME}: no thread is subscribed to the stream (aclrtSubscribeReport)"),
        ));
    };
    let done = (block == ACL_CALLBACK_BLOCK).then(Event::user);
    let report = Mutex::new(Some(Report {
        f: Some(f),
        done: done.clone(),
    }));
    let op = FnOp::shared(NAME, OpKind::Compute, move || {
        let Some(r) = report.lock().take() else {
            return Ok(()); // a replay: the callback was delivered once
        };
        let queue = with_subs(|subs| {
            (subs.by_stream.get(&sid) == Some(&tid))
                .then(|| subs.queues.get(&tid).cloned())
                .flatten()
        });
        let Some(q) = queue else {
            return Ok(()); // unsubscribed meanwhile: `r` is dropped, the stream goes on
        };
        let mut g = q.items.lock();
        if !g.1 {
            g.0.push_back(r);
            drop(g);
            q.ready.notify_one();
        }
        Ok(())
    });
    s.launch(op).map_err(|e| AclError::core(NAME, &e))?;
    if let Some(e) = done {
        s.wait_event(&e).map_err(|e| AclError::core(NAME, &e))?;
    }
    Ok(())
}

/// The calling thread's queue, or `ACL_ERROR_RT_THREAD_SUBSCRIBE`.
fn my_queue(name: &str) -> AclResult<Arc<ThreadQueue>> {
    state::check_init(name)?;
    let tid = this_thread();
    with_subs(|subs| subs.queues.get(&tid).cloned()).ok_or_else(|| {
        AclError::new(
            ACL_ERROR_RT_THREAD_SUBSCRIBE,
            format!("{name}: this thread ({tid}) serves no stream (aclrtSubscribeReport)"),
        )
    })
}

/// The next callback for the calling thread, waiting up to `timeout` (`None`: for ever);
/// `Ok(None)` when the time ran out. For callers that wait in slices (the Python face).
pub fn next(timeout: Option<Duration>) -> AclResult<Option<Report>> {
    const NAME: &str = "aclrtProcessReport";
    let q = my_queue(NAME)?;
    let deadline = timeout.map(|t| std::time::Instant::now() + t);
    let mut g = q.items.lock();
    loop {
        if let Some(r) = g.0.pop_front() {
            return Ok(Some(r));
        }
        if g.1 {
            return Err(AclError::new(
                ACL_ERROR_RT_THREAD_SUBSCRIBE,
                format!("{NAME}: the thread was unsubscribed while it waited"),
            ));
        }
        match deadline {
            None => q.ready.wait(&mut g),
            Some(d) => {
                if q.ready.wait_until(&mut g, d).timed_out() && g.0.is_empty() {
                    return Ok(None);
                }
            }
        }
    }
}

/// A callback already waiting for the calling thread, without waiting.
pub fn try_next() -> Option<Report> {
    let tid = this_thread();
    let q = with_subs(|subs| subs.queues.get(&tid).cloned())?;
    let r = q.items.lock().0.pop_front();
    r
}

/// `timeout` in milliseconds as `aclrtProcessReport` takes it: -1 waits for ever, > 0 that
/// long; anything else is an error.
pub fn timeout_ms(name: &str, ms: i32) -> AclResult<Option<Duration>> {
    match ms {
        -1 => Ok(None),
        ms if ms > 0 => Ok(Some(Duration::from_millis(ms as u64))),
        ms => Err(AclError::param(format!(
            "{name}: timeout {ms} ms (use -1 to wait for ever, or a positive number)"
        ))),
    }
}

/// `aclrtProcessReport`: run the callbacks that reached this thread, waiting up to `timeout`
/// ms (-1: for ever) for the first; `ACL_ERROR_RT_REPORT_TIMEOUT` when none came.
pub fn process(timeout: i32) -> AclResult<()> {
    const NAME: &str = "aclrtProcessReport";
    let t = timeout_ms(NAME, timeout)?;
    let Some(first) = next(t)? else {
        return Err(AclError::new(
            ACL_ERROR_RT_REPORT_TIMEOUT,
            format!("{NAME}: no callback within {timeout} ms"),
        ));
    };
    first.run();
    while let Some(r) = try_next() {
        r.run();
    }
    Ok(())
}

/// Forget every subscription (`aclFinalize`): waiting threads return, pending callbacks are
/// dropped (their streams go on).
pub(crate) fn reset() {
    let subs = SUBS.lock().take();
    if let Some(subs) = subs {
        let mut dropped = Vec::new();
        for q in subs.queues.values() {
            dropped.push(q.close());
        }
        drop(dropped);
    }
}

// --------------------------------------------------------------------------- fork

static SUBS_FORK: crate::fork::Guarded<Option<Subscriptions>> = crate::fork::Guarded::new(|| &SUBS);

pub(crate) fn before_fork() {
    SUBS_FORK.before_fork();
}

pub(crate) fn after_fork(child: bool) {
    SUBS_FORK.after_fork(child);
}

/// In a forked child: forget (leak) the parent's subscriptions (their threads are gone).
pub(crate) fn forget_in_child() {
    std::mem::forget(SUBS.lock().take());
}
