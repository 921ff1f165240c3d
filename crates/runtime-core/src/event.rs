//! Events: markers recorded into streams, for cross-stream ordering and timing.
//!
//! An event counts its records. `record` takes the next number and queues a marker; the
//! executor completes that number when the stream reaches it, reading the shared monotonic
//! clock ([`now_ns`]) at that moment. All devices share the clock, so events on different
//! devices can be timed against each other (CUDA refuses this).
//!
//! Semantics, as in CUDA: `query` on a never-recorded event is true; a stream's `wait_event`
//! on a never-recorded event is a no-op; waits refer to the latest record at the time they
//! are queued. `elapsed_time` needs both events recorded with timing enabled and completed:
//! it raises `NotReady` when either is still pending (call `synchronize` first) instead of
//! blocking.
//!
//! User events (OpenCL's `clCreateUserEvent`): [`Event::user`] makes an event whose one
//! record is pending from the start and is completed by the host with [`Event::set`] (or
//! failed with [`Event::set_failed`]). Streams wait on it with `wait_event` like on any
//! event; a stream that waits on a failed user event reports the failure as a kernel error at
//! its next synchronisation (the work behind the wait is skipped until then, as behind a
//! failing kernel), and `synchronize` on the event raises it. A user event is never
//! recorded on a stream. Nothing waits for ever on one: `shutdown` fails every user event
//! still unset (`fail_pending_user_events`), which releases the streams waiting on it.
//!
//! Completion callbacks ([`Event::on_complete`]) run on the thread that completes the
//! record (an engine worker, a recording caller, or the caller of `set`); the asyncio face
//! of the Python package resolves its futures through them, without polling.

use std::collections::BTreeSet;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use crate::clock::now_ns;
use crate::error::{DeviceError, Result, StreamError};
use crate::sync::{AtomicU64, Condvar, Mutex, Ordering};

static NEXT_EVENT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Every user event made and not yet dropped (weakly), so that `shutdown` can fail the ones
/// still unset instead of leaving streams blocked on them.
static USER_EVENTS: crate::sync::StaticMutex<Vec<std::sync::Weak<EventInner>>> =
    crate::sync::StaticMutex::new(Vec::new());

static FORK: crate::sync::ForkGuarded<crate::sync::StaticMutex<Vec<std::sync::Weak<EventInner>>>> =
    crate::sync::ForkGuarded::new(|| &USER_EVENTS);

/// Around `fork()`: hold the list of user events (see `runtime::install_fork_handlers`).
pub(crate) fn before_fork(wait: std::time::Duration) {
    FORK.before_fork(wait);
}

/// After `fork()`: release what [`before_fork`] took (in the child also a hold of a thread
/// that vanished in the fork).
pub(crate) fn after_fork(child: bool) {
    FORK.after_fork(child);
}

/// What parks on an event until one of its records completes: a stream blocked on a wait.
/// Events sit below streams, so they only know this much about them.
pub(crate) trait Wake: Send + Sync {
    /// The record this waiter waited for has completed: continue.
    fn wake(self: Arc<Self>);
}

/// The completion state of an event's records and the streams parked on them. Generic over
/// the waiter type so that the protocol can be model-checked with loom (`loom_tests`).
pub(crate) struct Gate<W> {
    state: Mutex<GateState<W>>,
    cv: Condvar,
    /// Highest record number completed (what `query` and the timestamp refer to).
    latest: AtomicU64,
}

struct GateState<W> {
    latest: u64,
    // Records of one event on different streams can complete out of order, so "the highest
    // completed number >= id" does not mean record `id` has completed. Stream waits ask
    // `is_done(id)`, which tracks each record: every number <= `done_through` has completed,
    // and `done_above` holds the completed numbers past it.
    done_through: u64,
    done_above: BTreeSet<u64>,
    timestamp_ns: Option<u64>,
    waiting: Vec<(u64, W)>,
    /// Threads asleep on the condvar in [`Gate::wait_latest`]: a completion notifies only
    /// when there is one (std's `notify_all` is a system call even with no sleeper, and an
    /// event recorded after every launch paid it on the runner for each record).
    sleepers: u32,
}

impl<W> GateState<W> {
    /// Whether record number `id` itself has completed.
    fn is_done(&self, id: u64) -> bool {
        id <= self.done_through || self.done_above.contains(&id)
    }

    fn mark_done(&mut self, id: u64) {
        if id <= self.done_through {
            return;
        }
        if id == self.done_through + 1 {
            // The usual case (records complete in order): no set operations, no allocation.
            self.done_through = id;
            while self.done_above.remove(&(self.done_through + 1)) {
                self.done_through += 1;
            }
        } else {
            self.done_above.insert(id);
        }
    }
}

impl<W> Gate<W> {
    pub(crate) fn new() -> Self {
        Gate {
            state: Mutex::new(GateState {
                latest: 0,
                done_through: 0,
                done_above: BTreeSet::new(),
                timestamp_ns: None,
                waiting: Vec::new(),
                sleepers: 0,
            }),
            cv: Condvar::new(),
            latest: AtomicU64::new(0),
        }
    }

    /// Highest completed record number.
    pub(crate) fn latest(&self) -> u64 {
        self.latest.load(Ordering::SeqCst)
    }

    /// Complete record `id` (with timestamp `ts`); returns the waiters it releases.
    pub(crate) fn complete(&self, id: u64, ts: Option<u64>) -> Vec<W> {
        let mut st = self.state.lock();
        if id > st.latest {
            st.latest = id;
            st.timestamp_ns = ts;
            self.latest.store(id, Ordering::SeqCst);
        }
        st.mark_done(id);
        let (ready, still): (Vec<_>, Vec<_>) = std::mem::take(&mut st.waiting)
            .into_iter()
            .partition(|(w, _)| st.is_done(*w));
        st.waiting = still;
        if st.sleepers > 0 {
            self.cv.notify_all();
        }
        ready.into_iter().map(|(_, w)| w).collect()
    }

    /// Complete every record up to `id` (with timestamp `ts`), as a semaphore does: an event
    /// shared between processes (`ipc_event`) completes this way, since records numbered by
    /// other processes never complete here one by one. Returns the waiters it releases.
    pub(crate) fn complete_through(&self, id: u64, ts: Option<u64>) -> Vec<W> {
        let mut st = self.state.lock();
        if id > st.latest {
            st.latest = id;
            st.timestamp_ns = ts;
            self.latest.store(id, Ordering::SeqCst);
        }
        if id > st.done_through {
            let st = &mut *st;
            st.done_through = id;
            st.done_above = st.done_above.split_off(&(id + 1));
            while st.done_above.remove(&(st.done_through + 1)) {
                st.done_through += 1;
            }
        }
        let (ready, still): (Vec<_>, Vec<_>) = std::mem::take(&mut st.waiting)
            .into_iter()
            .partition(|(w, _)| st.is_done(*w));
        st.waiting = still;
        if st.sleepers > 0 {
            self.cv.notify_all();
        }
        ready.into_iter().map(|(_, w)| w).collect()
    }

    /// Take back a waiter parked with [`Gate::park_unless_complete`] before its record
    /// completed: the first one `is_it` picks. `None` when it was released already. The
    /// caller drops it, after the gate's lock.
    pub(crate) fn unpark(&self, mut is_it: impl FnMut(&W) -> bool) -> Option<W> {
        let mut st = self.state.lock();
        let i = st.waiting.iter().position(|(_, w)| is_it(w))?;
        Some(st.waiting.remove(i).1)
    }

    /// Waiters parked now.
    pub(crate) fn parked(&self) -> usize {
        self.state.lock().waiting.len()
    }

    /// If record `id` has completed return true; otherwise run `on_block` and register `w` to
    /// be released by the `complete` that finishes it (atomically with respect to
    /// completion), and return false.
    pub(crate) fn park_unless_complete(&self, id: u64, w: W, on_block: impl FnOnce()) -> bool {
        let mut st = self.state.lock();
        if st.is_done(id) {
            return true;
        }
        on_block();
        st.waiting.push((id, w));
        false
    }

    /// Sleep until the highest completed record reaches `target` or `deadline`.
    pub(crate) fn wait_latest(&self, target: u64, deadline: Option<Instant>) -> bool {
        let mut st = self.state.lock();
        while st.latest < target {
            // Counted under the lock a completer notifies under, and the wait lets go of it
            // atomically: a completer either sees this sleeper or ran before the check.
            st.sleepers += 1;
            match deadline {
                None => st = self.cv.wait(st),
                Some(d) => {
                    if Instant::now() >= d {
                        st.sleepers -= 1;
                        return false;
                    }
                    st = self.cv.wait_until(st, d);
                }
            }
            st.sleepers -= 1;
        }
        true
    }

    /// The timestamp of the latest record if it is `recorded` (the latest handed out).
    pub(crate) fn timestamp_if(&self, recorded: u64) -> Option<u64> {
        let st = self.state.lock();
        st.timestamp_ns.filter(|_| st.latest >= recorded)
    }
}

/// What an event shared with other processes adds (`ipc_event`): record numbers taken from
/// the shared page, so that every process's records are one sequence; completions published
/// there; and records made by other processes taken up as local ones.
pub(crate) trait Shared: Send + Sync {
    /// Take the next record number of the shared sequence for a record made here, and
    /// publish it as the latest.
    fn take_record(&self) -> u64;
    /// Record `latest` (and so every record before it) has completed here.
    fn completed(&self, latest: u64);
    /// Before `recorded` is read: take up a newer record another process made.
    fn pull(&self, event: &EventInner);
    /// An error to report instead of success: the exporting process died (opened events).
    fn check(&self) -> Result<()>;
    /// Why record `latest` completed without running: the process that made it died first.
    fn abandoned(&self, latest: u64) -> Option<crate::error::Error>;
    /// The handle another process opens the event with (exported events only).
    fn handle(&self) -> Option<Vec<u8>>;
}

pub(crate) struct EventInner {
    pub(crate) id: u64,
    timing: bool,
    blocking: bool,
    recorded: AtomicU64,
    gate: Gate<Arc<dyn Wake>>,
    destroyed: AtomicBool,
    /// The runtime generation the event belongs to; 0 until first used under one when it
    /// was made with no runtime live.
    generation: std::sync::atomic::AtomicU64,
    /// A user event: completed by the host (`set`), never recorded on a stream.
    user: bool,
    /// Whether `set` or `set_failed` was called (user events).
    set: AtomicBool,
    /// Why the user event failed (`set_failed`); written once, before its completion.
    failure: std::sync::OnceLock<String>,
    /// 1 + the index of the device of the stream it was last recorded on (0: never).
    device: AtomicU64,
    /// Set once for an event shared with other processes (`ipc_event`).
    pub(crate) shared: std::sync::OnceLock<Arc<dyn Shared>>,
}

impl EventInner {
    /// Latest record number handed out (0: never recorded).
    pub(crate) fn recorded(&self) -> u64 {
        if let Some(s) = self.shared.get() {
            s.pull(self);
        }
        self.recorded.load(Ordering::SeqCst)
    }

    pub(crate) fn next_record(&self) -> u64 {
        if let Some(s) = self.shared.get() {
            let id = s.take_record();
            self.recorded.fetch_max(id, Ordering::SeqCst);
            return id;
        }
        self.recorded.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Take up record `id`, made by another process, as the latest (`ipc_event`).
    pub(crate) fn note_remote_record(&self, id: u64) {
        self.recorded.fetch_max(id, Ordering::SeqCst);
    }

    /// The latest record number this process took or took up, without looking at other
    /// processes' records (`ipc_event`).
    pub(crate) fn latest_taken(&self) -> u64 {
        self.recorded.load(Ordering::SeqCst)
    }

    /// Why waiting for the latest record failed once it completed: a failed user event, or
    /// a shared event whose exporter (or the process that made the record) died. Streams
    /// that waited on it, `synchronize` and completion callbacks all report this.
    pub(crate) fn wait_failure(&self) -> Option<crate::error::Error> {
        if let Some(why) = self.failure() {
            return Some(
                crate::error::KernelFailure::new(format!("UserEvent#{}", self.id), why.to_string())
                    .into(),
            );
        }
        let s = self.shared.get()?;
        s.check().err().or_else(|| s.abandoned(self.recorded()))
    }

    /// Remember the device of the stream recording it (`Event::device`).
    pub(crate) fn note_device(&self, device: usize) {
        self.device.store(device as u64 + 1, Ordering::Relaxed);
    }

    /// The failure of a user event completed with `set_failed`.
    pub(crate) fn failure(&self) -> Option<&str> {
        self.failure.get().map(String::as_str)
    }

    /// Complete record `id` now (stream order reached it).
    pub(crate) fn complete(&self, id: u64) {
        let ts = self.timing.then(now_ns);
        let Some(s) = self.shared.get() else {
            for w in self.gate.complete(id, ts) {
                w.wake();
            }
            return;
        };
        // Published before the local waiters run, so that what they do next (another
        // process's turn) sees it.
        s.completed(id);
        for w in self.gate.complete_through(id, ts) {
            w.wake();
        }
    }

    /// Complete record `id`, made by another process, here only: it completed there (or its
    /// process died), so nothing is published (`ipc_event`).
    pub(crate) fn complete_mirrored(&self, id: u64) {
        let ts = self.timing.then(now_ns);
        for w in self.gate.complete_through(id, ts) {
            w.wake();
        }
    }

    /// See [`Gate::park_unless_complete`].
    pub(crate) fn park_unless_complete(
        &self,
        id: u64,
        waiter: Arc<dyn Wake>,
        on_block: impl FnOnce(),
    ) -> bool {
        self.gate.park_unless_complete(id, waiter, on_block)
    }
}

/// Complete user event `e` (its only record), with `failure` if it failed.
fn complete_user(e: &EventInner, failure: Option<String>) {
    if let Some(f) = failure {
        let _ = e.failure.set(f);
    }
    e.complete(1);
}

/// Fail every user event of the live runtime (or of none yet) that is still unset, with
/// `why`: the streams waiting on them are released (their waits report the failure). Called
/// by `shutdown` before it drains the streams, so that none waits for ever.
pub(crate) fn fail_pending_user_events(why: &str) {
    let live = crate::generation::live();
    let pending: Vec<Arc<EventInner>> = {
        let mut all = USER_EVENTS.lock();
        all.retain(|w| w.strong_count() > 0);
        all.iter().filter_map(std::sync::Weak::upgrade).collect()
    };
    for e in &pending {
        let g = e.generation.load(std::sync::atomic::Ordering::Acquire);
        if (g == live || g == 0) && !e.set.swap(true, Ordering::AcqRel) {
            complete_user(e, Some(why.to_string()));
        }
    }
}

/// What [`Event::on_complete`] calls: with what a wait for the record reports (`Ok`, the
/// kernel failure of a failed user event, or `InvalidHandle` for a shared event whose
/// exporter or recorder died), as [`Event::synchronize`] would.
pub type CompletionFn = Box<dyn FnOnce(Result<()>) + Send>;

/// A completion callback parked on an event ([`Event::on_complete`]).
struct Callback {
    f: crate::sync::lock::Mutex<Option<CompletionFn>>,
    /// Weak: the event's gate holds this callback while it waits.
    event: std::sync::Weak<EventInner>,
}

impl Wake for Callback {
    fn wake(self: Arc<Self>) {
        // Taken out under the lock, run after it.
        let f = self.f.lock().take();
        if let Some(f) = f {
            let outcome = match self.event.upgrade() {
                Some(e) => Event(e).outcome(),
                None => Ok(()),
            };
            // User code, on whichever thread completed the event (an engine worker running a
            // record, a host thread setting a user event): a panic stays in the callback
            // (the panic hook reports it) and the completing thread goes on, so the stream
            // completes its record and the worker lives.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(outcome)));
        }
    }
}

/// A completion callback registered with [`Event::on_complete`]; [`Completion::cancel`]
/// takes it back before it runs. Dropping this handle leaves the callback registered.
pub struct Completion {
    cb: Option<(Arc<Callback>, std::sync::Weak<EventInner>)>,
}

impl std::fmt::Debug for Completion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.cb.is_some() {
            "Completion(parked)"
        } else {
            "Completion(ran)"
        })
    }
}

impl Completion {
    /// Take the callback back unless it ran (or is running): it will not be called, and it
    /// and what it holds are dropped now, on this thread, after the event's lock. Returns
    /// whether it was taken back.
    pub fn cancel(self) -> bool {
        let Some((cb, event)) = self.cb else {
            return false;
        };
        let me = Arc::as_ptr(&cb).cast::<()>();
        let parked = event.upgrade().and_then(|e| {
            e.gate
                .unpark(|w| std::ptr::eq(Arc::as_ptr(w).cast::<()>(), me))
        });
        let f = cb.f.lock().take();
        let taken = f.is_some();
        drop(f);
        drop(parked);
        taken
    }
}

/// An event handle. Cheap to clone.
#[derive(Clone)]
pub struct Event(pub(crate) Arc<EventInner>);

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Event#{}", self.0.id)
    }
}

impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// How an event behaves: [`Event::with_options`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventOptions {
    /// Take a timestamp when the stream reaches a record (`elapsed_time`). On by default, as
    /// in CUDA and the seed.
    pub timing: bool,
    /// `synchronize` sleeps at once instead of spinning briefly first (CUDA's
    /// `cudaEventBlockingSync`). Off by default.
    pub blocking: bool,
}

impl Default for EventOptions {
    fn default() -> Self {
        EventOptions {
            timing: true,
            blocking: false,
        }
    }
}

impl EventOptions {
    /// Without timestamps (cheaper records; CUDA's `cudaEventDisableTiming`).
    pub fn without_timing() -> Self {
        EventOptions {
            timing: false,
            ..Self::default()
        }
    }
}

impl Default for Event {
    fn default() -> Self {
        Event::new()
    }
}

impl Event {
    /// A new event with the default options (timing on, spinning briefly before sleeping).
    pub fn new() -> Event {
        Event::with_options(EventOptions::default())
    }

    /// A new event with `options`.
    pub fn with_options(options: EventOptions) -> Event {
        let EventOptions { timing, blocking } = options;
        Event(Arc::new(EventInner {
            id: NEXT_EVENT_ID.fetch_add(1, Ordering::Relaxed),
            timing,
            blocking,
            recorded: AtomicU64::new(0),
            gate: Gate::new(),
            destroyed: AtomicBool::new(false),
            generation: std::sync::atomic::AtomicU64::new(crate::generation::live()),
            user: false,
            set: AtomicBool::new(false),
            failure: std::sync::OnceLock::new(),
            device: AtomicU64::new(0),
            shared: std::sync::OnceLock::new(),
        }))
    }

    /// A user event (OpenCL's `clCreateUserEvent`): pending until the host calls
    /// [`Event::set`] or [`Event::set_failed`]. Streams can wait on it (`wait_event`); it
    /// cannot be recorded. Its timestamp is the time of `set`.
    pub fn user() -> Event {
        let e = Event(Arc::new(EventInner {
            id: NEXT_EVENT_ID.fetch_add(1, Ordering::Relaxed),
            timing: true,
            blocking: false,
            // Its one record is handed out now and completed by `set`.
            recorded: AtomicU64::new(1),
            gate: Gate::new(),
            destroyed: AtomicBool::new(false),
            generation: std::sync::atomic::AtomicU64::new(crate::generation::live()),
            user: true,
            set: AtomicBool::new(false),
            failure: std::sync::OnceLock::new(),
            device: AtomicU64::new(0),
            shared: std::sync::OnceLock::new(),
        }));
        let mut all = USER_EVENTS.lock();
        all.retain(|w| w.strong_count() > 0);
        all.push(Arc::downgrade(&e.0));
        drop(all);
        e
    }

    /// Whether this is a user event ([`Event::user`]).
    pub fn is_user(&self) -> bool {
        self.0.user
    }

    /// Complete a user event: the streams and callers waiting on it continue.
    ///
    /// # Errors
    /// `Invalid` for an event that is not a user event (record it on a stream instead) or
    /// one already set; `InvalidHandle`.
    pub fn set(&self) -> Result<()> {
        self.finish(None)
    }

    /// Complete a user event as failed with `message`: streams waiting on it report a kernel
    /// error (`wait(UserEvent#id)`) at their next synchronisation and skip the work queued
    /// behind the wait until then; `synchronize` on the event raises it.
    ///
    /// # Errors
    /// As for [`Event::set`].
    pub fn set_failed(&self, message: &str) -> Result<()> {
        self.finish(Some(message.to_string()))
    }

    fn finish(&self, failure: Option<String>) -> Result<()> {
        self.check()?;
        if !self.0.user {
            return Err(StreamError::Invalid(format!(
                "Event#{} is not a user event: record it on a stream instead of setting it",
                self.0.id
            ))
            .into());
        }
        if self.0.set.swap(true, Ordering::AcqRel) {
            return Err(StreamError::Invalid(format!(
                "user Event#{} was already set; a user event completes once",
                self.0.id
            ))
            .into());
        }
        complete_user(&self.0, failure);
        Ok(())
    }

    /// Why a user event failed ([`Event::set_failed`], or shutdown while it was unset).
    pub fn failure(&self) -> Option<String> {
        self.0.failure().map(str::to_string)
    }

    /// The device of the stream this event was last recorded on (`None`: never recorded,
    /// or a user event).
    pub fn device(&self) -> Option<usize> {
        match self.0.device.load(Ordering::Relaxed) {
            0 => None,
            d => Some(d as usize - 1),
        }
    }

    /// Call `f` once the latest record (at the time of this call) has completed: at once,
    /// on the calling thread, when it already has (or the event was never recorded);
    /// otherwise on the thread that completes it. `f` gets what a wait would report
    /// ([`CompletionFn`]) and must not block. The event does not keep itself alive through
    /// `f`'s registration; the returned [`Completion`] takes it back (a cancelled `await`
    /// lets go of its callback at once). A panic in `f` is contained: it is reported by the
    /// panic hook and goes no further (the completing thread, a stream worker for instance,
    /// goes on).
    pub fn on_complete(&self, f: CompletionFn) -> Result<Completion> {
        self.check()?;
        let target = self.0.recorded();
        let cb = Arc::new(Callback {
            f: crate::sync::lock::Mutex::new(Some(f)),
            event: Arc::downgrade(&self.0),
        });
        let waiter: Arc<dyn Wake> = cb.clone();
        if target == 0 || self.0.gate.park_unless_complete(target, waiter, || ()) {
            cb.wake();
            return Ok(Completion { cb: None });
        }
        Ok(Completion {
            cb: Some((cb, Arc::downgrade(&self.0))),
        })
    }

    /// Completion callbacks parked on this event now (they hold what they capture until
    /// the event completes or [`Completion::cancel`] takes them back).
    pub fn parked_callbacks(&self) -> usize {
        self.0.gate.parked()
    }

    /// What a wait for the latest record reports once it completed.
    fn outcome(&self) -> Result<()> {
        self.check()?;
        match self.0.wait_failure() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The runtime generation the event belongs to (0: not yet used under one).
    pub fn generation(&self) -> u64 {
        self.0.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Event id.
    pub fn id(&self) -> u64 {
        self.0.id
    }

    /// Whether timing is enabled.
    pub fn timing(&self) -> bool {
        self.0.timing
    }

    /// Whether `synchronize` blocks without spinning.
    pub fn blocking(&self) -> bool {
        self.0.blocking
    }

    /// Fails if destroyed, if no runtime is live, or if the runtime it belongs to was shut
    /// down (an event made with no runtime live belongs to the first one it is used under).
    pub fn check(&self) -> Result<()> {
        let invalid = |why: &str| -> Result<()> {
            Err(DeviceError::InvalidHandle {
                what: format!("Event#{}", self.0.id),
                why: why.into(),
            }
            .into())
        };
        if self.0.destroyed.load(Ordering::Acquire) {
            return invalid("it was destroyed");
        }
        let live = crate::generation::live();
        if live == 0 {
            return Err(DeviceError::NotInitialized.into());
        }
        let mine = match self.0.generation.compare_exchange(
            0,
            live,
            std::sync::atomic::Ordering::AcqRel,
            std::sync::atomic::Ordering::Acquire,
        ) {
            Ok(_) => live,
            Err(g) => g,
        };
        if mine == live {
            self.0.shared.get().map_or(Ok(()), |s| s.check())
        } else {
            invalid("the runtime was shut down")
        }
    }

    /// Whether the latest record has completed (true if never recorded).
    pub fn query(&self) -> Result<bool> {
        self.check()?;
        let target = self.0.recorded();
        if self.0.shared.get().is_some() {
            // Taking up another process's record can find the shared event unusable.
            self.check()?;
        }
        Ok(self.0.gate.latest() >= target)
    }

    /// Whether the event was ever recorded.
    pub fn is_recorded(&self) -> bool {
        self.0.recorded() > 0
    }

    /// Wait until the latest record has completed.
    ///
    /// # Errors
    /// `Timeout` when `timeout` passed first; `InvalidHandle`; `NotPermitted` from a runtime
    /// thread while the record is pending.
    pub fn synchronize(&self, timeout: Option<Duration>) -> Result<()> {
        if self.wait(timeout)? {
            Ok(())
        } else {
            Err(StreamError::Timeout {
                what: format!("Event#{}", self.0.id),
                timeout_ms: timeout.map_or(f64::INFINITY, |t| t.as_secs_f64() * 1e3),
            }
            .into())
        }
    }

    /// Wait up to `timeout` for the latest record: `Ok(false)` if it is still pending then
    /// (for callers that wait in slices, such as the Python bindings).
    ///
    /// # Errors
    /// As for [`Event::synchronize`], without `Timeout`.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<bool> {
        let done = self.wait_inner(timeout)?;
        if done {
            self.outcome()?;
        }
        Ok(done)
    }

    fn wait_inner(&self, timeout: Option<Duration>) -> Result<bool> {
        self.check()?;
        let target = self.0.recorded();
        if self.0.gate.latest() >= target {
            return Ok(true);
        }
        if !self.0.blocking {
            let until = Instant::now() + Duration::from_micros(50);
            let pause = crate::sync::Pause::new();
            while Instant::now() < until {
                if self.0.gate.latest() >= target {
                    return Ok(true);
                }
                pause.spin();
            }
        }
        if crate::sync::on_runtime_thread() {
            // The record may sit behind the very kernel making this call.
            return Err(StreamError::NotPermitted {
                what: format!(
                    "waiting for Event#{} from a kernel or host function",
                    self.0.id
                ),
            }
            .into());
        }
        let deadline = crate::clock::deadline_after(timeout);
        Ok(self.0.gate.wait_latest(target, deadline))
    }

    /// Timestamp of the latest completed record, in ns of [`now_ns`].
    pub fn timestamp_ns(&self) -> Result<u64> {
        self.check()?;
        let what = || format!("Event#{}", self.0.id);
        if !self.0.timing {
            return Err(StreamError::Invalid(format!(
                "{} was created with enable_timing=False; it has no timestamp",
                what()
            ))
            .into());
        }
        let recorded = self.0.recorded();
        if recorded == 0 {
            return Err(StreamError::Invalid(format!(
                "{} was never recorded; record it on a stream first",
                what()
            ))
            .into());
        }
        self.0
            .gate
            .timestamp_if(recorded)
            .ok_or_else(|| StreamError::NotReady { what: what() }.into())
    }

    /// Milliseconds from this event to `end` (negative if `end` came first).
    pub fn elapsed_time(&self, end: &Event) -> Result<f64> {
        let a = self.timestamp_ns()?;
        let b = end.timestamp_ns()?;
        Ok((b as f64 - a as f64) / 1e6)
    }

    /// Make the handle invalid. Pending records still complete, so nothing waiting hangs.
    ///
    /// Letting go of a handle whose runtime was shut down is fine; destroying it twice is an
    /// error.
    pub fn destroy(&self) -> Result<()> {
        if self.0.destroyed.swap(true, Ordering::AcqRel) {
            return Err(DeviceError::InvalidHandle {
                what: format!("Event#{}", self.0.id),
                why: "it was destroyed".into(),
            }
            .into());
        }
        Ok(())
    }
}
