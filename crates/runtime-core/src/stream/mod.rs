//! Streams: ordered queues of commands drained by the device's engines.
//!
//! * [`command`]: the [`Op`] trait and the commands a stream carries.
//! * `engine`: the worker threads (compute, copy and serial engines per device).
//! * `executor`: what a stream needs of its device: engines, submission gate (a
//!   `sync::gate`, which `shutdown` closes before it drains), options and the registry of
//!   the device's streams.
//! * `capture`: capture sessions, with fork and join across streams through events.
//! * [`graph`]: captured work and its replay.
//! * `completion`: the submitted/completed counters and the wait on them.
//! * [`copy`]: stream-ordered copies and memsets between host memory and device buffers.
//! * `panics`: a panicking op becomes a `KernelFailure` (message and location), quietly.
//! * `reclaim`: a queued op's memory goes back on the thread that queued it.
//!
//! A stream is a queue of commands (`command::CommandQueue`, under a lock held only to push
//! or pop) plus a small state machine
//! (`IDLE -> QUEUED -> RUNNING -> IDLE`, or `RUNNING -> BLOCKED` while it waits for an event).
//! Whoever moves a stream to `RUNNING` owns it and runs its commands in order, so work on one
//! stream is ordered while different streams run on different workers. Completion is two
//! counters, `submitted` and `completed`: `query()` and `synchronize()` on an idle stream read
//! two atomics and never talk to an engine.
//!
//! Blocking and non-blocking streams: by default each device's default stream is an
//! ordinary stream (the per-thread default stream model, as `nvcc --default-stream
//! per-thread`). With the `legacyDefaultStream` option on, the default stream is CUDA's legacy
//! one: work queued on it waits for the work queued before on every blocking stream of the
//! device, and work queued on a blocking stream waits for the work queued before on the
//! default stream. Streams made with `non_blocking` (CUDA's `cudaStreamNonBlocking`) never
//! take part. The barrier is an event record on the other stream and a wait on this one, made
//! only when the other stream has pending work.
//!
//! Errors: a failing op (error or panic) puts the stream in an error state; the ops queued
//! behind it are skipped (event records still complete, so no wait hangs) until the error is
//! reported by the next `synchronize()`, after which the stream runs normally again.

mod alloc;
pub(crate) mod capture;
pub mod command;
pub(crate) mod completion;
pub mod copy;
pub(crate) mod engine;
pub(crate) mod executor;
pub mod graph;
pub(crate) mod panics;
mod reclaim;
pub(crate) mod spread;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::sync::lock::Mutex;

use crate::clock::{deadline_after, now_ns};
use crate::error::{DeviceError, KernelFailure, Result, StreamError};
use crate::event::{Event, Wake};
use crate::memory::access::{AccessSet, PendingWork};
use crate::memory::pinned::PinnedBuffer;
use crate::memory::{Buffer, Element};
use crate::sync::gate::EntryGuard;
use crate::trace;
use capture::Session;
use command::{Command, Commands};
pub use command::{FnOp, Op, OpKind};
use completion::Completion;
use engine::{EngineKind, Engines};
pub(crate) use executor::Executor;
pub use graph::Graph;
use graph::Node;

/// Commands a stream holds before launching waits (CUDA's launch queue blocks at about a
/// thousand pending launches too): a launcher that finds more pending waits until half of
/// them have run, so a tight launch loop cannot queue without bound or starve the workers of
/// the GIL that queued Python kernels need.
pub const MAX_QUEUED: u64 = 1024;

/// Highest (most urgent) stream priority. Lower numbers are more urgent, as in CUDA.
pub const PRIORITY_HIGHEST: i32 = -3;
/// Lowest stream priority, and the default.
pub const PRIORITY_LOWEST: i32 = 0;
pub(crate) const PRIORITY_LEVELS: usize = (PRIORITY_LOWEST - PRIORITY_HIGHEST + 1) as usize;

const IDLE: u8 = 0;
const QUEUED: u8 = 1;
const RUNNING: u8 = 2;
const BLOCKED: u8 = 3;

/// Commands a runner executes before letting other waiting streams have a turn (or
/// [`TIME_SLICE`], whichever comes first).
const SLICE: u32 = 64;
/// Time a runner spends on one stream before letting other waiting streams have a turn.
const TIME_SLICE: Duration = Duration::from_millis(1);

static NEXT_STREAM_ID: AtomicU64 = AtomicU64::new(1);

pub(crate) struct StreamInner {
    pub(crate) id: u64,
    pub(crate) exec: Arc<Executor>,
    pub(crate) priority: i32,
    pub(crate) level: usize,
    is_default: bool,
    /// Never synchronises with the legacy default stream (`cudaStreamNonBlocking`).
    non_blocking: bool,
    /// Commands queued and not yet run; a runner that takes one but cannot run it yet
    /// (engine hand-off, time slice, event wait) puts it back first.
    queue: Commands,
    state: AtomicU8,
    done: Completion,
    /// A lower bound of `done.completed()` seen by launchers: the back-pressure check reads
    /// the engine-written counter only when this bound alone cannot rule a full backlog out.
    completed_floor: AtomicU64,
    /// The number (1-based, in submission order) of the event record the runner is
    /// completing: between the event's completion and the stream's counter, `query` waits
    /// for the counter, so an event completed as the last command implies an idle stream.
    recording: AtomicU64,
    failed: AtomicBool,
    /// Boxed: most streams never fail, and the failure is larger than the rest of the stream.
    error: Mutex<Option<Box<KernelFailure>>>,
    destroyed: AtomicBool,
    /// The capture this stream takes part in (it began it, or joined it through an event).
    capture: Mutex<Option<Arc<Session>>>,
    /// Whether `capture` is `Some`: read without the lock on every synchronize and blocking
    /// copy (written under it).
    capturing: AtomicBool,
    /// Whether the stream is on its executor's list of streams a barrier must look at (see
    /// [`Executor::mark_active`]).
    pub(crate) listed: AtomicBool,
    /// The blocks of the launch this stream runs now, which a thread waiting for the stream
    /// may run while it waits ([`offer_help`]); `offered` says whether the slot is set.
    offer: Mutex<Option<Arc<dyn engine::Help>>>,
    offered: AtomicBool,
}

impl Drop for StreamInner {
    fn drop(&mut self) {
        self.exec.unregister(self.id);
    }
}

impl StreamInner {
    /// Replace the capture this stream takes part in; the old value is returned so that the
    /// caller drops it after the lock (captured steps may own Python objects).
    fn set_capture(self: &Arc<Self>, new: Option<Arc<Session>>) -> Option<Arc<Session>> {
        if new.is_some() {
            // A barrier refuses while any stream captures: it must see this one.
            self.exec.mark_active(self);
        }
        let mut slot = self.capture.lock();
        self.capturing.store(new.is_some(), Ordering::SeqCst);
        std::mem::replace(&mut *slot, new)
    }

    /// Nothing for a barrier to wait for or report: no queued work, and no unreported error
    /// or capture (a destroyed stream's errors are not a barrier's to report).
    pub(crate) fn quiet(&self) -> bool {
        self.done.reached(self.done.submitted())
            && (self.destroyed.load(Ordering::SeqCst)
                || (!self.failed.load(Ordering::SeqCst) && !self.capturing.load(Ordering::SeqCst)))
    }
}

impl Wake for StreamInner {
    fn wake(self: Arc<Self>) {
        unblock(&self);
    }
}

/// Who is running a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Runner {
    Engine(EngineKind),
    /// A waiting engine worker running the stream it waits for, until the instant if any:
    /// runs anything.
    Caller(Option<Instant>),
}

/// A handle to a stream. Cheap to clone; all clones are the same stream.
#[derive(Clone)]
pub struct Stream(pub(crate) Arc<StreamInner>);

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Stream#{}(device {}, priority {})",
            self.0.id,
            self.0.exec.device(),
            self.0.priority
        )
    }
}

impl PartialEq for Stream {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// What a stream is created on ([`Stream::new`]): a device (`device::Device`, of the layer
/// above this one, implements it). Sealed.
pub trait StreamDevice: sealed::Sealed {
    /// The device's executor (callable only inside this crate: it takes a token only this
    /// crate can make).
    #[doc(hidden)]
    fn executor(&self, token: sealed::Token) -> &Arc<Executor>;
}

pub(crate) mod sealed {
    /// Implemented by the types that may implement [`super::StreamDevice`].
    pub trait Sealed {}

    /// Proof of a call from inside this crate.
    pub struct Token(pub(crate) ());
}

/// Where an outcome of running one command leaves the stream.
enum Step {
    Done,
    Blocked,
}

impl Stream {
    /// Create a stream on `device` (a `device::Device`) with `priority` in
    /// `PRIORITY_HIGHEST..=PRIORITY_LOWEST`.
    ///
    /// # Errors
    /// `InvalidArgument` for a priority out of range; `InvalidHandle` after shutdown.
    pub fn new(device: &impl StreamDevice, priority: i32) -> Result<Stream> {
        Self::new_internal(device.executor(sealed::Token(())), priority, false, false)
    }

    /// [`Stream::new`] for a non-blocking stream (CUDA's `cudaStreamNonBlocking`): it never
    /// synchronises with the device's default stream, also when the `legacyDefaultStream`
    /// option makes the default stream CUDA's legacy one (see the module documentation).
    ///
    /// # Errors
    /// As for [`Stream::new`].
    pub fn new_non_blocking(device: &impl StreamDevice, priority: i32) -> Result<Stream> {
        Self::new_internal(device.executor(sealed::Token(())), priority, false, true)
    }

    pub(crate) fn new_internal(
        exec: &Arc<Executor>,
        priority: i32,
        is_default: bool,
        non_blocking: bool,
    ) -> Result<Stream> {
        exec.check_alive()?;
        if !(PRIORITY_HIGHEST..=PRIORITY_LOWEST).contains(&priority) {
            return Err(crate::error::arg_error(
                "priority",
                format!(
                    "must be between {PRIORITY_HIGHEST} (highest) and {PRIORITY_LOWEST} (lowest), got {priority}"
                ),
            ));
        }
        let id = NEXT_STREAM_ID.fetch_add(1, Ordering::Relaxed);
        let inner = Arc::new(StreamInner {
            id,
            exec: exec.clone(),
            priority,
            level: (priority - PRIORITY_HIGHEST) as usize,
            is_default,
            non_blocking,
            queue: Commands::default(),
            state: AtomicU8::new(IDLE),
            done: Completion::new(),
            completed_floor: AtomicU64::new(0),
            recording: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            error: Mutex::new(None),
            destroyed: AtomicBool::new(false),
            capture: Mutex::new(None),
            capturing: AtomicBool::new(false),
            listed: AtomicBool::new(false),
            offer: Mutex::new(None),
            offered: AtomicBool::new(false),
        });
        exec.register(&inner);
        Ok(Stream(inner))
    }

    /// Stream id (unique in the process).
    pub fn id(&self) -> u64 {
        self.0.id
    }

    /// The index of the stream's device.
    pub fn device_index(&self) -> usize {
        self.0.exec.device()
    }

    /// The executor of the stream's device.
    pub(crate) fn executor(&self) -> &Arc<Executor> {
        &self.0.exec
    }

    /// Priority.
    pub fn priority(&self) -> i32 {
        self.0.priority
    }

    /// Whether this is a device's default stream.
    pub fn is_default(&self) -> bool {
        self.0.is_default
    }

    /// Whether the stream was made non-blocking ([`Stream::new_non_blocking`]).
    pub fn is_non_blocking(&self) -> bool {
        self.0.non_blocking
    }

    /// Under the `legacyDefaultStream` option, order what is submitted next after the work
    /// queued so far on the streams this one synchronises with: every other blocking stream
    /// of the device for the default stream, the default stream for a blocking stream.
    /// Returns whether it queued a barrier wait.
    fn legacy_barrier(&self) -> bool {
        let s = &self.0;
        if s.non_blocking || !s.exec.options.legacy_default_stream() {
            return false;
        }
        let mut waited = false;
        for other in s.exec.streams() {
            let o = &other.0;
            let partner = if s.is_default {
                !o.non_blocking
            } else {
                o.is_default
            };
            if !partner
                || o.id == s.id
                || other.is_destroyed()
                || other.is_capturing()
                || other.pending() == 0
            {
                continue;
            }
            let ev = Event::with_options(crate::event::EventOptions::without_timing());
            let id = ev.0.next_record();
            other.submit_raw(Command::Record(ev.0.clone(), id));
            self.submit_raw(Command::Wait(ev.0, id));
            waited = true;
        }
        waited
    }

    /// Fails if the stream was destroyed or its runtime shut down.
    pub fn check(&self) -> Result<()> {
        self.check_destroyed()?;
        self.0.exec.check_alive()
    }

    fn check_destroyed(&self) -> Result<()> {
        if self.0.destroyed.load(Ordering::Acquire) {
            return Err(DeviceError::InvalidHandle {
                what: format!("Stream#{}", self.0.id),
                why: "it was destroyed".into(),
            }
            .into());
        }
        Ok(())
    }

    /// [`Stream::check`] for a submission: the guard keeps shutdown from draining before the
    /// command is pushed.
    fn enter(&self) -> Result<EntryGuard<'_>> {
        self.check_destroyed()?;
        self.0.exec.enter_submit()
    }

    /// Queue an operation. In synchronous mode (`enableAsync` off) waits for it and raises
    /// its error here; otherwise waits only while the stream holds more than [`MAX_QUEUED`]
    /// commands, until half of them have run.
    pub fn launch(&self, op: Arc<dyn Op>) -> Result<()> {
        if self.enqueue(op)? {
            self.after_submit()?;
        }
        Ok(())
    }

    /// Queue an operation (or record it while capturing). Returns true when it was queued,
    /// false when it was captured. Callers that must release a lock (the Python bindings
    /// release the GIL) wait themselves in synchronous mode.
    ///
    /// In synchronous mode on a runtime thread the caller will wait for the op, which it may
    /// only do if the op runs right here: it runs inline when the stream is idle, and is
    /// otherwise refused with `NotPermitted` before anything is queued (never "refused, but
    /// run anyway").
    pub(crate) fn enqueue(&self, op: Arc<dyn Op>) -> Result<bool> {
        self.enqueue_as(op)
    }

    /// [`Stream::launch`] of an op the stream owns from here on, taken from `op` (`Some`):
    /// queued in a box an earlier launch emptied (no allocation per launch) when batching is
    /// on; captured, or run inline, as any op otherwise.
    pub(crate) fn launch_owned<T: Op + 'static>(&self, op: &mut Option<T>) -> Result<()> {
        if self.enqueue_owned(op)? {
            self.after_submit()?;
        }
        Ok(())
    }

    /// [`Stream::enqueue`] of an op the stream owns from here on (see
    /// [`Stream::launch_owned`]), taken from `op` (always `Some`) by whichever path queues,
    /// captures or runs it: the op moves once, into its box, where each move by value on the
    /// way was a copy of the whole op.
    pub(crate) fn enqueue_owned<T: Op + 'static>(&self, op: &mut Option<T>) -> Result<bool> {
        if self.0.exec.options.batching() {
            self.enqueue_as(Owned(op))
        } else {
            self.enqueue_as(Arc::new(Owned(op).take()) as Arc<dyn Op>)
        }
    }

    fn enqueue_as(&self, op: impl Queueable) -> Result<bool> {
        {
            let _submitting = self.enter()?;
            if let Some(session) = self.session() {
                session.push(self.0.id, Node::Op(op.shared()));
                return Ok(false);
            }
            if !(self.is_sync_mode() && engine::on_worker_thread()) {
                op.submit_to(self);
                return Ok(true);
            }
        }
        if self.run_inline_from_runtime_thread(&op.shared())? {
            return Ok(true);
        }
        Err(self.busy_from_runtime_thread("a synchronous-mode launch"))
    }

    /// Queue an operation that binds at launch (a collective taking its sequence number): bound
    /// now and queued, or captured unbound so that each replay binds it at its launch. Never
    /// runs inline and never waits (in synchronous mode too): a collective must return so that
    /// the same thread can issue the other ranks' calls. Returns true when queued.
    pub(crate) fn enqueue_bound(&self, op: Arc<dyn graph::LaunchBound>) -> Result<bool> {
        let _submitting = self.enter()?;
        if let Some(session) = self.session() {
            session.push(self.0.id, Node::Launch(op));
            return Ok(false);
        }
        self.submit(Command::Op(op.bind()));
        Ok(true)
    }

    /// [`Stream::try_run_inline`] for a blocking submission from a runtime thread: when the
    /// stream has nothing pending but its worker has not let it go yet (it is between its
    /// last command and going idle, or lingering for the next), wait out that moment instead
    /// of calling it busy. That worker lets go without waiting for anything (least of all for
    /// this thread), however long the OS keeps it off a core: a fixed 5 ms here refused the
    /// copy on a loaded machine (the stateful test, at a load of 10 on 2 cores). The bound
    /// (10 s) is only a backstop against a stream no worker will ever release.
    pub(crate) fn run_inline_from_runtime_thread(&self, op: &Arc<dyn Op>) -> Result<bool> {
        let until = Instant::now() + Duration::from_secs(10);
        let mut looks = 0u32;
        loop {
            if self.try_run_inline(op)? {
                return Ok(true);
            }
            let s = &self.0;
            let releasing = s.done.is_idle() && s.queue.is_empty();
            if !releasing || Instant::now() >= until {
                return Ok(false);
            }
            looks = looks.saturating_add(1);
            if looks < 1000 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    /// `NotPermitted` for a blocking submission (`what`) from a runtime thread onto this
    /// stream while it is busy: nothing was queued.
    pub(crate) fn busy_from_runtime_thread(&self, what: &str) -> crate::error::Error {
        StreamError::NotPermitted {
            what: format!(
                "{what} on Stream#{} from a kernel or host function while that stream is busy (nothing was queued)",
                self.0.id
            ),
        }
        .into()
    }

    /// Run `op` right here if the stream is idle (nothing queued, not capturing), counting it
    /// as submitted and completed; its error is reported by the next synchronisation as
    /// usual. Returns false, doing nothing, when the stream is busy: queue it instead.
    pub(crate) fn try_run_inline(&self, op: &Arc<dyn Op>) -> Result<bool> {
        let _submitting = self.enter()?;
        let s = &self.0;
        self.refuse_if_capturing("a blocking copy or memset")?;
        if s.state
            .compare_exchange(IDLE, RUNNING, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return Ok(false);
        }
        // The op's allocations must be free now: the caller may hold a lock of its own (the
        // Python bindings hold the interpreter's, which a kernel holding them may need), so
        // it never blocks here; contended, the op is queued and waited for instead.
        let held = (s.done.is_idle() && s.queue.is_empty())
            .then(|| op.accesses().try_acquire())
            .flatten();
        let idle = held.is_some();
        if let Some(held) = held {
            s.done.submit();
            run_held(s, op.as_ref(), &panics::OpScope::enter());
            drop(held);
            complete_one(s);
        }
        if release_stream(s) {
            s.state.store(QUEUED, Ordering::SeqCst);
            schedule(s, None);
        }
        Ok(idle)
    }

    /// Whether synchronous mode (`enableAsync` off) is in force for this stream's runtime.
    pub(crate) fn is_sync_mode(&self) -> bool {
        !self.0.exec.options.is_async()
    }

    /// Commands submitted so far: a target for [`Stream::wait_for`].
    pub(crate) fn submitted(&self) -> u64 {
        self.0.done.submitted()
    }

    /// Whether everything up to `target` has completed.
    pub(crate) fn reached(&self, target: u64) -> bool {
        self.0.done.reached(target)
    }

    fn after_submit(&self) -> Result<()> {
        if self.0.exec.options.is_async() {
            if let Some(target) = self.backlog_target() {
                self.wait_for(target, None)?;
            }
            Ok(())
        } else {
            self.synchronize(None)
        }
    }

    /// Commands queued on this stream and not yet completed.
    pub fn pending(&self) -> u64 {
        // `completed` first: read the other way round, a completion in between could make
        // it exceed the earlier `submitted`.
        let completed = self.0.done.completed();
        self.0.done.submitted().saturating_sub(completed)
    }

    /// Back-pressure: when more than [`MAX_QUEUED`] commands are pending, the command count
    /// a launcher should wait for (until half the backlog has run) before it launches again;
    /// `None` when there is room, and always on an engine worker (a kernel that launches
    /// must not stall the engine that would drain the backlog). [`Stream::launch`] waits by
    /// itself; callers of [`Stream::enqueue`] that hold a lock (the Python bindings hold the
    /// GIL, which queued Python kernels need) wait after releasing it.
    pub(crate) fn backlog_target(&self) -> Option<u64> {
        let s = &self.0;
        let submitted = s.done.submitted();
        // Fast path without touching the counter the engine writes (its cache line stays
        // with the worker): `completed >= floor`, so this bound suffices most of the time.
        if submitted.saturating_sub(s.completed_floor.load(Ordering::Relaxed)) <= MAX_QUEUED {
            return None;
        }
        let completed = s.done.completed();
        s.completed_floor.fetch_max(completed, Ordering::Relaxed);
        if submitted.saturating_sub(completed) <= MAX_QUEUED || engine::on_worker_thread() {
            return None;
        }
        Some(submitted - MAX_QUEUED / 2)
    }

    pub(crate) fn submit(&self, cmd: Command) {
        self.legacy_barrier();
        self.submit_raw(cmd);
    }

    /// [`Stream::submit`] without the legacy default stream barrier.
    fn submit_raw(&self, cmd: Command) {
        let s = &self.0;
        let target = s.done.submit();
        let uses = match &cmd {
            Command::Op(op) => {
                reclaim::note(op);
                Some(op.accesses())
            }
            Command::Boxed(b) => b.op().map(Op::accesses),
            Command::Graph(g, _) => Some(&g.accesses),
            Command::Record(..) | Command::Wait(..) => None,
        };
        self.note_uses(uses, target);
        let kind = cmd.kind();
        if trace::enabled() {
            trace_enqueue(s, &cmd);
        }
        s.queue.push(cmd, s.exec.options.batching());
        self.schedule_if_idle(kind);
    }

    /// [`Stream::submit`] of an op the queue owns, in a reused box ([`command::Reusable`]);
    /// batching on only (the boxes come back through `incoming`).
    fn submit_owned<T: Op + 'static>(&self, op: Owned<'_, T>) {
        self.legacy_barrier();
        let s = &self.0;
        let target = s.done.submit();
        self.note_uses(Some(op.get().accesses()), target);
        let kind = Some(op.get().kind());
        if trace::enabled() {
            trace_named(s, op.get().name().to_string());
        }
        s.queue.push_owned(op.0);
        self.schedule_if_idle(kind);
    }

    /// Note that the command counted as `target` uses `uses` (host access to those
    /// allocations then waits for it), and that the stream has work.
    fn note_uses(&self, uses: Option<&AccessSet>, target: u64) {
        if let Some(uses) = uses.filter(|u| !u.is_empty()) {
            uses.note(
                self.0.work_id(),
                || Arc::downgrade(&self.0) as std::sync::Weak<dyn PendingWork>,
                target,
            );
        }
        self.0.exec.mark_active(&self.0);
    }

    /// After a push: hand an idle stream to an engine (`kind`: the engine its first command
    /// wants).
    fn schedule_if_idle(&self, kind: Option<OpKind>) {
        let s = &self.0;
        // Load first: a stream already running (the common case in a launch loop) is only
        // read, where a failing compare-exchange would still take its cache line from the
        // runner.
        if s.state.load(Ordering::SeqCst) == IDLE
            && s.state
                .compare_exchange(IDLE, QUEUED, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            schedule(&self.0, kind);
        }
    }

    /// Whether everything queued so far has run (an idle stream answers from two atomics).
    /// Once an event recorded as the stream's last command has completed, this is true.
    pub fn query(&self) -> Result<bool> {
        self.check()?;
        let s = &self.0;
        let submitted = s.done.submitted();
        if s.done.reached(submitted) {
            return Ok(true);
        }
        if s.recording.load(Ordering::SeqCst) == submitted {
            // The last command is a record the runner is completing right now (between two
            // statements, without blocking): wait for its count.
            while !s.done.reached(submitted) {
                std::thread::yield_now();
            }
            return Ok(true);
        }
        Ok(false)
    }

    /// Wait until everything queued so far has run, then report (and clear) the first error
    /// a command raised since the last synchronisation.
    ///
    /// # Errors
    /// `Timeout` when `timeout` passed first (the work goes on); the stream's pending
    /// `Kernel` error; `InvalidHandle`; `Capturing`; `NotPermitted` from a runtime thread.
    pub fn synchronize(&self, timeout: Option<Duration>) -> Result<()> {
        let target = self.synchronize_target()?;
        if !self.wait_for(target, timeout)? {
            return Err(timed_out(format!("{self:?}"), timeout));
        }
        self.take_error()
    }

    /// What [`Stream::synchronize`] checks and waits for, for callers that wait in their own
    /// way (the Python bindings wait in slices with the GIL released, then call
    /// [`Stream::take_error`]): the count of commands submitted so far.
    ///
    /// # Errors
    /// `InvalidHandle` (destroyed, or after shutdown); `Capturing` while the stream captures.
    pub(crate) fn synchronize_target(&self) -> Result<u64> {
        self.check()?;
        self.refuse_if_capturing("synchronize()")?;
        Ok(self.0.done.submitted())
    }

    /// Raise and clear the pending error, if any. This ends every synchronisation (of the
    /// stream, of its device, a destroy), which is where the device's async pool gives free
    /// blocks beyond its release threshold back (`memory::async_pool`).
    pub(crate) fn take_error(&self) -> Result<()> {
        if let Some(mem) = self.0.exec.memory() {
            mem.trim_async_pool();
        }
        if self.0.failed.load(Ordering::SeqCst) {
            // Take and clear under the error lock, which is also where failures are stored, so
            // a failure racing with this call is either reported now or stays pending.
            let mut slot = self.0.error.lock();
            let e = slot.take();
            self.0.failed.store(false, Ordering::SeqCst);
            drop(slot);
            if let Some(e) = e {
                return Err(StreamError::Kernel(*e).into());
            }
        }
        Ok(())
    }

    /// Wait until `completed >= target`; `Ok(false)` on timeout. Does not report the stream's
    /// errors (see [`Stream::take_error`]).
    ///
    /// A thread that is not a runtime thread runs blocks of the stream's running multi-block
    /// launch while it waits, when the launch offers them (see `kernel::block`).
    ///
    /// From a runtime thread (a kernel or host function), a wait must not need that thread:
    /// a stream that is only queued is run right here; a wait for the stream running the
    /// caller, or for one that is running or blocked elsewhere (it may be waiting for the
    /// caller), fails with [`StreamError::NotPermitted`] at once instead of hanging, as CUDA
    /// answers such calls from a callback with `cudaErrorNotPermitted`.
    ///
    /// # Errors
    /// `NotPermitted` as above.
    pub(crate) fn wait_for(&self, target: u64, timeout: Option<Duration>) -> Result<bool> {
        let s = &self.0;
        if s.done.reached(target) {
            return Ok(true);
        }
        let deadline = deadline_after(timeout);
        if !engine::on_worker_thread() {
            // A thread that waits for the stream runs blocks of its running launch meanwhile.
            return Ok(s.done.wait_helping(target, deadline, &|| help_offered(s)));
        }
        if running_here(s.id) {
            return Err(self.not_permitted("a kernel or host function running on it"));
        }
        if s.state.load(Ordering::SeqCst) == QUEUED
            && s.state
                .compare_exchange(QUEUED, RUNNING, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            run_stream(&self.0, Runner::Caller(deadline));
        }
        if s.done.reached(target) {
            return Ok(true);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(false);
        }
        Err(self.not_permitted("a runtime thread (a kernel or host function)"))
    }

    fn not_permitted(&self, from: &str) -> crate::error::Error {
        StreamError::NotPermitted {
            what: format!("waiting for Stream#{} from {from}", self.0.id),
        }
        .into()
    }

    /// Make this stream wait (on the device, without blocking the caller) until `event`'s
    /// latest record has completed. A never-recorded event is a no-op, as in CUDA.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        let _submitting = self.enter()?;
        event.check()?;
        let id = event.0.recorded();
        if let Some(session) = self.session() {
            session.wait(self.0.id, &event.0);
            return Ok(());
        }
        if let Some(session) = capture::session_of(&event.0) {
            // The event was recorded in another stream's capture: this stream joins it.
            session.fork(&self.0, &event.0);
            let old = self.0.set_capture(Some(session));
            drop(old);
            return Ok(());
        }
        if id == 0 {
            return Ok(());
        }
        self.submit(Command::Wait(event.0.clone(), id));
        Ok(())
    }

    /// Make later work on this stream wait for everything queued so far on `other` (torch's
    /// `Stream.wait_stream`): a record on `other` that this stream waits on.
    ///
    /// # Errors
    /// As for [`Stream::record`] and [`Stream::wait_event`].
    pub fn wait_stream(&self, other: &Stream) -> Result<()> {
        let e = Event::with_options(crate::event::EventOptions::without_timing());
        other.record(&e)?;
        self.wait_event(&e)
    }

    /// Record `event` on this stream: it completes when the stream reaches this point, with
    /// the time read then. On an idle stream it completes at once.
    pub fn record(&self, event: &Event) -> Result<()> {
        let _submitting = self.enter()?;
        event.check()?;
        if event.is_user() {
            return Err(StreamError::Invalid(format!(
                "Event#{} is a user event: it completes when set() is called and cannot be recorded on a stream",
                event.id()
            ))
            .into());
        }
        event.0.note_device(self.0.exec.device());
        if let Some(session) = self.session() {
            session.record(self.0.id, &event.0);
            return Ok(());
        }
        capture::recorded_outside(&event.0);
        if self.legacy_barrier() {
            let id = event.0.next_record();
            self.submit_raw(Command::Record(event.0.clone(), id));
            return Ok(());
        }
        let id = event.0.next_record();
        // Idle fast path: everything submitted so far has completed, so "reaching" the event
        // is now. The counters decide, not the stream's state: a worker keeps a stream that
        // ran dry for a moment (`Engine::linger`), and a record right after a synchronize
        // must still complete at once.
        if self.0.done.is_idle() {
            event.0.complete(id);
            return Ok(());
        }
        self.submit_raw(Command::Record(event.0.clone(), id));
        Ok(())
    }

    /// Start capturing: until [`Stream::end_capture`], launches, records and waits on this
    /// stream are recorded into a graph instead of running. Other streams join the capture by
    /// waiting on an event recorded in it (see the `capture` module).
    pub fn begin_capture(&self) -> Result<()> {
        self.check()?;
        let mut c = self.0.capture.lock();
        if c.is_some() {
            return Err(StreamError::Invalid(format!(
                "Stream#{} is already capturing; call end_capture() first",
                self.0.id
            ))
            .into());
        }
        self.0.exec.mark_active(&self.0);
        *c = Some(Session::begin(self.0.id));
        self.0.capturing.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Whether the stream is capturing (it began a capture, or joined one).
    pub fn is_capturing(&self) -> bool {
        self.0.capturing.load(Ordering::Acquire)
    }

    fn session(&self) -> Option<Arc<Session>> {
        if !self.is_capturing() {
            return None; // the common case: no lock on the launch path
        }
        self.0.capture.lock().clone()
    }

    /// Fails with [`StreamError::Capturing`] when the stream is capturing: `what` would wait
    /// for work that is only being recorded.
    pub(crate) fn refuse_if_capturing(&self, what: &str) -> Result<()> {
        if self.is_capturing() {
            return Err(StreamError::Capturing {
                stream: self.0.id,
                what: what.to_string(),
            }
            .into());
        }
        Ok(())
    }

    /// Stop capturing and return the graph (the stream must be the one that began the
    /// capture). Streams that joined the capture stop capturing too; if one of them was
    /// never joined back (its last captured step waited for by a stream already in the
    /// capture), the capture ends with an error and no graph.
    pub fn end_capture(&self) -> Result<Graph> {
        self.check()?;
        let session = self.session().ok_or_else(|| {
            StreamError::Invalid(format!(
                "Stream#{} is not capturing; call begin_capture() first",
                self.0.id
            ))
        })?;
        if session.origin() != self.0.id {
            return Err(StreamError::Invalid(format!(
                "Stream#{} joined the capture begun on Stream#{}; end it there",
                self.0.id,
                session.origin()
            ))
            .into());
        }
        let members = session.forked();
        for m in members.iter().chain([&self.0]) {
            let mut slot = m.capture.lock();
            let ours = slot.as_ref().is_some_and(|s| Arc::ptr_eq(s, &session));
            let old = ours.then(|| slot.take());
            if ours {
                m.capturing.store(false, Ordering::Release);
            }
            drop(slot);
            drop(old);
        }
        drop(members);
        match session.end() {
            Ok(nodes) => Ok(Graph::new(
                nodes,
                self.0.exec.device(),
                self.0.exec.generation(),
            )),
            Err(unjoined) => Err(StreamError::Invalid(format!(
                "the capture begun on Stream#{} ended with {} not joined back: record an event on each and wait for it on a stream of the capture before end_capture(); the capture is discarded",
                self.0.id,
                unjoined
                    .iter()
                    .map(|s| format!("Stream#{s}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
            .into()),
        }
    }

    /// Replay `graph` on this stream as one command.
    pub fn launch_graph(&self, graph: &Graph) -> Result<()> {
        if self.enqueue_graph(graph)? {
            self.after_submit()?;
        }
        Ok(())
    }

    /// Queue a graph replay without waiting (see [`Stream::enqueue`]).
    pub(crate) fn enqueue_graph(&self, graph: &Graph) -> Result<bool> {
        let _submitting = self.enter()?;
        graph.check_for(&self.0.exec)?;
        if let Some(session) = self.session() {
            for node in &graph.0.nodes {
                session.push(self.0.id, node.clone());
            }
            return Ok(false);
        }
        // Records and waits are bound to record numbers now, at launch (`GraphInner::bind`).
        self.submit(Command::Graph(graph.0.bind(), 0));
        Ok(true)
    }

    /// Let queued work finish, then make the handle invalid. Reports a pending error.
    pub fn destroy(&self) -> Result<()> {
        self.check()?;
        if self.0.is_default {
            return Err(
                StreamError::Invalid("the default stream cannot be destroyed".into()).into(),
            );
        }
        let target = self.0.done.submitted();
        self.wait_for(target, None)?;
        self.0.destroyed.store(true, Ordering::Release);
        // Taken out under the lock, dropped after it: captured steps may own Python objects.
        let session = self.0.set_capture(None);
        if let Some(session) = &session {
            if session.origin() == self.0.id {
                for m in session.forked() {
                    let old = m.set_capture(None);
                    drop(old);
                }
                let _discarded = session.end();
            } else {
                session.leave(self.0.id);
            }
        }
        drop(session);
        self.take_error()
    }

    /// Whether `destroy` was called.
    pub fn is_destroyed(&self) -> bool {
        self.0.destroyed.load(Ordering::Acquire)
    }

    /// Commands submitted / completed so far (for tests and stats).
    pub fn counters(&self) -> (u64, u64) {
        (self.0.done.submitted(), self.0.done.completed())
    }

    /// Copy `src` into `dst` at byte `offset`, in stream order. The values are staged first,
    /// so this returns as soon as `src` may be reused (CUDA's rule for pageable host
    /// memory); the copy itself runs when the stream gets there.
    ///
    /// # Errors
    /// The range does not fit in `dst` (nothing is queued); stream errors as for
    /// [`Stream::launch`].
    pub fn copy_from_host<T: Element>(&self, dst: &Buffer, offset: u64, src: &[T]) -> Result<()> {
        copy::copy_from_host(self, dst, offset, src)
    }

    /// Copy `count` bytes of pinned `src` at `src_off` into `dst` at `dst_off`, in stream
    /// order and truly asynchronously: the command reads `src` when it runs (it holds a clone
    /// of the block until then), so writes to `src` before the stream reaches the copy are
    /// seen by it.
    ///
    /// # Errors
    /// A range does not fit; `src` was freed; stream errors as for [`Stream::launch`].
    pub fn copy_from_pinned(
        &self,
        dst: &Buffer,
        dst_off: u64,
        src: &PinnedBuffer,
        src_off: u64,
        count: u64,
    ) -> Result<()> {
        copy::copy_from_pinned(self, dst, dst_off, src, src_off, count)
    }

    /// Copy from `src` at byte `offset` into `dst` after the work queued so far on this
    /// stream, and wait for it (run at once when the stream is idle). Like any
    /// synchronisation it reports an error the stream's earlier work raised.
    ///
    /// # Errors
    /// The range does not fit in `src`; the stream is capturing (`Capturing`); the stream's
    /// pending error.
    pub fn copy_to_host<T: Element>(&self, src: &Buffer, offset: u64, dst: &mut [T]) -> Result<()> {
        copy::copy_to_host(self, src, offset, dst)
    }
}

/// The error of a wait that ran out of time.
pub(crate) fn timed_out(what: String, timeout: Option<Duration>) -> crate::error::Error {
    StreamError::Timeout {
        what,
        timeout_ms: timeout.map_or(f64::INFINITY, |t| t.as_secs_f64() * 1e3),
    }
    .into()
}

fn trace_enqueue(s: &StreamInner, cmd: &Command) {
    let name = match cmd {
        Command::Op(op) => op.name().to_string(),
        Command::Boxed(b) => b.op().map_or_else(String::new, |op| op.name().to_string()),
        Command::Record(ev, _) => format!("record(Event#{})", ev.id),
        Command::Wait(ev, _) => format!("wait(Event#{})", ev.id),
        Command::Graph(g, _) => format!("graph({} nodes)", g.nodes.len()),
    };
    trace_named(s, name);
}

/// Trace the enqueue of a command named `name`.
fn trace_named(s: &StreamInner, name: String) {
    trace::push(trace::Record {
        name,
        device: s.exec.device(),
        stream: s.id,
        ts_ns: now_ns(),
        phase: trace::Phase::Enqueue,
    });
}

/// Around `fork()` (see `runtime::install_fork_handlers`): hold the capture registry's lock.
pub(crate) fn before_fork(wait: Duration) {
    capture::before_fork(wait);
}

/// After `fork()`, in the parent or the child: release what [`before_fork`] took.
pub(crate) fn after_fork(child: bool) {
    capture::after_fork(child);
}

/// While the calling thread runs a command of a stream (an engine worker or a caller running
/// it inline), let threads that wait for that stream help with `help` (the blocks of a
/// launch) until the returned guard is dropped. `None` when the thread runs no stream.
pub(crate) fn offer_help(help: &Arc<dyn engine::Help>) -> Option<Offer> {
    let s = RUNNING_HERE.with(|r| r.borrow().last().cloned())?;
    *s.offer.lock() = Some(help.clone());
    s.offered.store(true, Ordering::SeqCst);
    Some(Offer(s))
}

/// An offer of [`offer_help`]; withdrawn when dropped.
pub(crate) struct Offer(Arc<StreamInner>);

impl Offer {
    /// Whether a thread waiting for the stream spins now, and will take blocks.
    pub(crate) fn waiter_spinning(&self) -> bool {
        self.0.done.waiter_spinning()
    }
}

impl Drop for Offer {
    fn drop(&mut self) {
        self.0.offered.store(false, Ordering::SeqCst);
        // Taken out under the lock, dropped after it.
        let old = self.0.offer.lock().take();
        drop(old);
    }
}

/// For a thread waiting for `s`: run the blocks of the launch `s` runs now, if it offered
/// them; true when it ran one. False when every block was taken already: the waiter then
/// pauses (and yields) as any spinning waiter does, rather than asking again at once, which
/// kept a core from the thread running the launch's last block (and took the offer's lock
/// from the op's thread) for as long as that block ran. The blocks run under the rules of a
/// runtime thread (a wait from them for a busy stream is refused, never a hang).
fn help_offered(s: &StreamInner) -> bool {
    // Sequentially consistent: see `Completion::wait_helping`'s last look.
    if !s.offered.load(Ordering::SeqCst) {
        return false;
    }
    let Some(help) = s.offer.lock().clone() else {
        return false;
    };
    if !help.wanted() {
        return false;
    }
    // Running blocks, this thread is busy with the device's work: off a busy worker's core.
    let _visit = spread::visit(s.exec.engines.spread(), Instant::now());
    crate::sync::as_runtime_thread(|| help.help())
}

/// After `fork()`, in the child (see `runtime::install_fork_handlers`).
pub(crate) fn after_fork_in_child() {
    engine::after_fork_in_child();
    RUNNING_HERE.with(|r| std::mem::forget(r.take()));
}

/// Queue a stream that just became ready on the engine its next command wants.
fn schedule(s: &Arc<StreamInner>, kind: Option<OpKind>) {
    let target = Engines::target(s.exec.options.pipelining(), kind).unwrap_or(EngineKind::Compute);
    s.exec.engines.get(target).push(s.clone());
}

/// Give up ownership of a stream; re-take it if commands arrived meanwhile.
/// Returns true when the caller owns it again.
fn release_stream(s: &Arc<StreamInner>) -> bool {
    s.state.store(IDLE, Ordering::SeqCst);
    if !s.queue.is_empty_trimming()
        && s.state
            .compare_exchange(IDLE, RUNNING, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    {
        return true;
    }
    false
}

thread_local! {
    /// Ids of the streams this thread is running commands of (innermost last: a runner that
    /// waits may run another stream inline).
    static RUNNING_HERE: std::cell::RefCell<Vec<Arc<StreamInner>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Whether this thread is running a command of stream `id` (a wait for it would wait for
/// itself).
pub(crate) fn running_here(id: u64) -> bool {
    RUNNING_HERE.with(|r| r.borrow().iter().any(|s| s.id == id))
}

/// Marks this thread as running a stream's commands while alive.
struct RunningGuard;

impl RunningGuard {
    fn enter(s: &Arc<StreamInner>) -> RunningGuard {
        RUNNING_HERE.with(|r| r.borrow_mut().push(s.clone()));
        RunningGuard
    }
}

impl Drop for RunningGuard {
    fn drop(&mut self) {
        // Dropped after the borrow: it may be the stream's last handle.
        let s = RUNNING_HERE.with(|r| r.borrow_mut().pop());
        drop(s);
    }
}

/// How [`Stream::enqueue_as`] holds an op: shared (`Arc<dyn Op>`, also for capture and
/// inline runs) or owned by the queue ([`Owned`]).
trait Queueable {
    fn shared(self) -> Arc<dyn Op>;
    fn submit_to(self, stream: &Stream);
}

impl Queueable for Arc<dyn Op> {
    fn shared(self) -> Arc<dyn Op> {
        self
    }
    fn submit_to(self, stream: &Stream) {
        stream.submit(Command::Op(self));
    }
}

/// An op the queue owns (in a reused box: [`command::Reusable`]), still in its caller's
/// slot: `Some` until one path takes it.
struct Owned<'a, T>(&'a mut Option<T>);

impl<T> Owned<'_, T> {
    fn get(&self) -> &T {
        self.0
            .as_ref()
            .expect("an owned op is taken once, by the path that queues it")
    }

    fn take(self) -> T {
        self.0
            .take()
            .expect("an owned op is taken once, by the path that queues it")
    }
}

impl<T: Op + 'static> Queueable for Owned<'_, T> {
    fn shared(self) -> Arc<dyn Op> {
        Arc::new(self.take())
    }
    fn submit_to(self, stream: &Stream) {
        stream.submit_owned(self);
    }
}

/// Run a stream that the caller has moved to `RUNNING`, until it is empty, blocked, handed
/// to another engine, or has used its time slice while others wait.
pub(crate) fn run_stream(s: &Arc<StreamInner>, runner: Runner) {
    if let Runner::Engine(_) = runner {
        if s.state
            .compare_exchange(QUEUED, RUNNING, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return; // stale entry: a caller already ran it
        }
    }
    let _running = RunningGuard::enter(s);
    if let Runner::Engine(_) = runner {
        s.done.note_runner();
    }
    let mut ran = 0u32;
    let mut linger = engine::Linger::new();
    // Boxes of the ops this run emptied, given back to the submitters with each batch taken.
    let mut emptied: Vec<Box<dyn command::Reusable>> = Vec::new();
    let mut clock = BusyClock::start(&s.exec.engines);
    let began = clock.mark;
    let mut settled = began;
    if let Runner::Engine(_) = runner {
        spread::settle(settled);
    }
    loop {
        let (cmd, first) = match s.queue.pop_ready() {
            Some(cmd) => (Some(cmd), 0),
            None => {
                // `ready` ran dry: the next batch is what arrived in `incoming` meanwhile.
                let first = linger.first_pause(s.done.awaited());
                if let Runner::Engine(mine) = runner {
                    if ran > 0 && s.exec.options.batching() && !s.done.submitter_shares_core() {
                        s.exec.engines.get(mine).gather(first, || s.done.awaited());
                    }
                }
                (s.queue.take_batch(&mut emptied), first)
            }
        };
        let Some(cmd) = cmd else {
            s.queue.give_back(&mut emptied);
            if let Runner::Engine(mine) = runner {
                // A command counted (`submitted`) but not yet pushed is microseconds away.
                let engine = s.exec.engines.get(mine);
                if engine.linger(
                    s.done.submitter_shares_core(),
                    first,
                    || !s.done.is_idle(),
                    || s.done.awaited(),
                ) {
                    // The linger may have moved this worker off its submitter's core: a
                    // waiter that still saw the old CPU would yield to a runner not there.
                    s.done.note_runner();
                    clock.idled();
                    continue;
                }
            }
            if release_stream(s) {
                clock.idled();
                continue;
            }
            return;
        };
        if let Runner::Caller(Some(until)) = runner {
            if clock.mark >= until {
                let kind = cmd.kind();
                s.queue.put_back(cmd);
                s.state.store(QUEUED, Ordering::SeqCst);
                schedule(s, kind);
                return;
            }
        }
        if let Runner::Engine(mine) = runner {
            if let Some(want) = Engines::target(s.exec.options.pipelining(), cmd.kind()) {
                if want != mine {
                    s.queue.put_back(cmd);
                    s.state.store(QUEUED, Ordering::SeqCst);
                    s.exec.engines.get(want).push(s.clone());
                    return;
                }
            }
            ran += 1;
            if (ran >= SLICE || clock.mark.duration_since(began) >= TIME_SLICE)
                && s.exec.engines.get(mine).has_waiting(s.level)
            {
                s.queue.put_back(cmd);
                s.state.store(QUEUED, Ordering::SeqCst);
                s.exec.engines.get(mine).push(s.clone());
                return;
            }
        }
        let compute = cmd.kind() == Some(OpKind::Compute);
        let step = execute(s, cmd, &mut emptied);
        clock.ran(compute);
        linger.ran();
        if clock.mark.duration_since(settled) >= spread::SETTLE_EVERY {
            settled = clock.mark;
            if let Runner::Engine(_) = runner {
                spread::settle(settled);
            }
        }
        match step {
            Step::Done => complete_one(s),
            Step::Blocked => return,
        }
    }
}

/// The device's compute busy time as one run of a stream sees it: one clock read per
/// command (its end is the next one's start), summed here and added to the device's total
/// ([`Engines::add_compute_busy`]) when the run ends, or once it has a millisecond to add.
/// Time between commands (taking the next from the queue) counts with the command after;
/// time spent lingering for more work does not count.
struct BusyClock<'a> {
    engines: &'a Engines,
    /// When the last command ended (or the run began, or stopped lingering).
    mark: Instant,
    /// Compute time not yet added to the device's total.
    busy: Duration,
}

impl<'a> BusyClock<'a> {
    fn start(engines: &'a Engines) -> BusyClock<'a> {
        BusyClock {
            engines,
            mark: Instant::now(),
            busy: Duration::ZERO,
        }
    }

    /// A command ended now; it was compute work when `compute`.
    fn ran(&mut self, compute: bool) {
        let now = Instant::now();
        if compute {
            self.busy += now.duration_since(self.mark);
            if self.busy >= TIME_SLICE {
                self.engines
                    .add_compute_busy(std::mem::take(&mut self.busy));
            }
        }
        self.mark = now;
    }

    /// The run waited for work: the time since the last command is not busy time.
    fn idled(&mut self) {
        self.mark = Instant::now();
    }
}

impl Drop for BusyClock<'_> {
    fn drop(&mut self) {
        if !self.busy.is_zero() {
            self.engines.add_compute_busy(self.busy);
        }
    }
}

fn complete_one(s: &StreamInner) {
    s.done.complete_one();
}

/// Put the stream in its error state with `e` (the first error since the last
/// synchronisation is kept), so that the ops behind are skipped until it is reported.
fn fail(s: &StreamInner, mut e: KernelFailure) {
    e.stream = s.id;
    let mut slot = s.error.lock();
    if slot.is_none() {
        *slot = Some(Box::new(e));
    }
    s.failed.store(true, Ordering::SeqCst);
    drop(slot);
}

/// A wait whose event completed without its work having run fails the waiting stream: a user
/// event completed as failed, or an interprocess event whose exporter (or recorder) died. The
/// work behind the wait is skipped until the error is reported, as behind a failing kernel.
fn check_wait(s: &StreamInner, ev: &crate::event::EventInner) {
    if let Some(why) = ev.failure() {
        fail(
            s,
            KernelFailure::new(format!("wait(UserEvent#{})", ev.id), why.to_string()),
        );
    } else if ev.shared.get().is_some() {
        if let Some(e) = ev.wait_failure() {
            let mut f = KernelFailure::new(format!("wait(Event#{})", ev.id), e.to_string());
            // Reported as the error itself (`InvalidHandle`), as a wait on the event would.
            f.payload = Some(Arc::new(e));
            fail(s, f);
        }
    }
}

fn run_op(s: &StreamInner, op: &dyn Op) {
    run_op_in(s, op, &panics::OpScope::enter());
}

/// [`run_op`] for one of the ops run in `scope` (a graph replay's nodes).
fn run_op_in(s: &StreamInner, op: &dyn Op, scope: &panics::OpScope) {
    if s.failed.load(Ordering::SeqCst) {
        return; // skipped behind an unreported error
    }
    let accesses = op.accesses();
    if accesses.is_empty() {
        // Nothing to hold (a no-op, a kernel of scalars only): no holding to build or drop.
        return run_unheld(s, op, scope);
    }
    match accesses.acquire() {
        Ok(_held) => run_held(s, op, scope),
        Err(e) => fail(s, KernelFailure::new(op.name(), e.to_string())),
    }
}

/// [`run_op_in`] for a graph replay's node, inlined into the loop over the nodes: an op that
/// holds nothing runs with no call between the loop and its own `run` (a replay runs a
/// hundred per command; as a chain of calls, each returning its `Result` through memory,
/// the path took about twice a no-op kernel's call). Tracing and ops that hold allocations
/// take [`run_op_in`]. Kept apart from the path of one command: inlined there too, it made a
/// batched no-op launch about a tenth slower.
#[inline(always)]
fn run_node(s: &StreamInner, op: &dyn Op, scope: &panics::OpScope) {
    if s.failed.load(Ordering::SeqCst) {
        return; // skipped behind an unreported error
    }
    if trace::enabled() || !op.accesses().is_empty() {
        return run_op_in(s, op, scope);
    }
    if let Err(e) = scope.run_node(op) {
        fail(s, e);
    }
}

/// Run `op`, whose allocations the caller holds (see [`crate::memory::access`]).
fn run_held(s: &StreamInner, op: &dyn Op, scope: &panics::OpScope) {
    if s.failed.load(Ordering::SeqCst) {
        return;
    }
    run_unheld(s, op, scope);
}

/// Run `op` (its allocations held, or none to hold), on a stream found not failed.
fn run_unheld(s: &StreamInner, op: &dyn Op, scope: &panics::OpScope) {
    let t0 = trace::enabled().then(now_ns);
    let result = scope.run(|| op.name(), || op.run());
    if let Some(t0) = t0 {
        trace::push(trace::Record {
            name: op.name().to_string(),
            device: s.exec.device(),
            stream: s.id,
            ts_ns: t0,
            phase: trace::Phase::Run {
                end_ns: now_ns(),
                engine: trace::thread_name(),
            },
        });
    }
    if let Err(e) = result {
        fail(s, e);
    }
}

/// Run `cmd`; the box of a [`Command::Boxed`] op, emptied once the op has run, goes to
/// `emptied` (the op's destructor runs here, as an `Arc`'d op's does when its last handle is
/// dropped).
fn execute(
    s: &Arc<StreamInner>,
    cmd: Command,
    emptied: &mut Vec<Box<dyn command::Reusable>>,
) -> Step {
    match cmd {
        Command::Op(op) => {
            run_op(s, op.as_ref());
            Step::Done
        }
        Command::Boxed(mut b) => {
            if let Some(op) = b.op() {
                run_op(s, op);
            }
            b.clear();
            emptied.push(b);
            Step::Done
        }
        Command::Record(ev, id) => {
            s.recording.store(s.done.completed() + 1, Ordering::SeqCst);
            ev.complete(id);
            if trace::enabled() {
                trace::push(trace::Record {
                    name: format!("record(Event#{})", ev.id),
                    device: s.exec.device(),
                    stream: s.id,
                    ts_ns: now_ns(),
                    phase: trace::Phase::Record,
                });
            }
            Step::Done
        }
        Command::Wait(ev, id) => {
            if ev.park_unless_complete(id, s.clone(), || {
                s.queue.put_back(Command::Wait(ev.clone(), id));
                s.state.store(BLOCKED, Ordering::SeqCst);
            }) {
                check_wait(s, &ev);
                Step::Done
            } else {
                Step::Blocked
            }
        }
        Command::Graph(g, start) => {
            // Consecutive ops run in one scope (see `panics`); records and waits, which may
            // call back into user code, run outside any.
            let mut scope = None;
            for (i, node) in g.nodes.iter().enumerate().skip(start) {
                if !matches!(node, Node::Op(_) | Node::Launch(_)) {
                    scope = None;
                }
                match node {
                    Node::Op(op) => run_node(
                        s,
                        op.as_ref(),
                        scope.get_or_insert_with(panics::OpScope::enter),
                    ),
                    // Not reached: every launch binds these (`GraphInner::bind`).
                    Node::Launch(l) => {
                        let op = l.bind();
                        run_op_in(
                            s,
                            op.as_ref(),
                            scope.get_or_insert_with(panics::OpScope::enter),
                        );
                    }
                    Node::Record(ev) => {
                        let id = ev.next_record();
                        ev.complete(id);
                    }
                    Node::Wait(ev) => {
                        let id = ev.recorded();
                        if id != 0
                            && !ev.park_unless_complete(id, s.clone(), || {
                                s.queue.put_back(Command::Graph(g.clone(), i));
                                s.state.store(BLOCKED, Ordering::SeqCst);
                            })
                        {
                            return Step::Blocked;
                        }
                        check_wait(s, ev);
                    }
                    // Records and waits bound at launch (`GraphInner::bind`).
                    Node::RecordId(ev, id) => ev.complete(*id),
                    Node::WaitId(ev, id) => {
                        if !ev.park_unless_complete(*id, s.clone(), || {
                            s.queue.put_back(Command::Graph(g.clone(), i));
                            s.state.store(BLOCKED, Ordering::SeqCst);
                        }) {
                            return Step::Blocked;
                        }
                        check_wait(s, ev);
                    }
                }
            }
            Step::Done
        }
    }
}

/// Called by an event when a stream blocked on it may continue.
pub(crate) fn unblock(s: &Arc<StreamInner>) {
    if s.state
        .compare_exchange(BLOCKED, QUEUED, Ordering::SeqCst, Ordering::SeqCst)
        .is_ok()
    {
        let kind = s.queue.first_kind();
        schedule(s, kind);
    }
}

/// A stream as the allocator sees it for `record_stream`: its submission and completion
/// counters (two atomics; no lock, so a free on any thread may read them).
impl PendingWork for StreamInner {
    fn work_id(&self) -> u64 {
        self.id
    }
    fn work_reached(&self, target: u64) -> bool {
        self.done.reached(target)
    }
    fn work_wait(self: Arc<Self>, target: u64) -> Result<()> {
        Stream(self).wait_for(target, None).map(|_| ())
    }
}

impl crate::memory::pool::sealed::Sealed for Stream {}

impl crate::memory::StreamFence for Stream {
    fn fence_id(&self) -> u64 {
        self.id()
    }

    fn submitted(&self) -> u64 {
        Stream::submitted(self)
    }

    fn reached(&self, target: u64) -> bool {
        Stream::reached(self, target)
    }

    fn check(&self) -> Result<()> {
        Stream::check(self)
    }
}
