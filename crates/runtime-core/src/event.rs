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

use std::collections::BTreeSet;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use crate::clock::now_ns;
use crate::error::{DeviceError, Result, StreamError};
use crate::sync::{AtomicU64, Condvar, Mutex, Ordering};

static NEXT_EVENT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

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
        self.cv.notify_all();
        ready.into_iter().map(|(_, w)| w).collect()
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
            match deadline {
                None => st = self.cv.wait(st),
                Some(d) => {
                    if Instant::now() >= d {
                        return false;
                    }
                    st = self.cv.wait_until(st, d);
                }
            }
        }
        true
    }

    /// The timestamp of the latest record if it is `recorded` (the latest handed out).
    pub(crate) fn timestamp_if(&self, recorded: u64) -> Option<u64> {
        let st = self.state.lock();
        st.timestamp_ns.filter(|_| st.latest >= recorded)
    }
}

/// What an event shared with other processes adds (`ipc_event`): publishing its records and
/// completions (an exported event), or mirroring the exporter's records as local ones (an
/// opened event).
pub(crate) trait Shared: Send + Sync {
    /// Record `id` was handed out.
    fn recorded(&self, id: u64);
    /// The highest completed record is now `latest`.
    fn completed(&self, latest: u64);
    /// Before `recorded` is read: take a local record for a new remote one.
    fn pull(&self, event: &EventInner);
    /// An error to report instead of success (the exporting process died).
    fn check(&self) -> Result<()>;
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
        let id = self.recorded.fetch_add(1, Ordering::SeqCst) + 1;
        if let Some(s) = self.shared.get() {
            s.recorded(id);
        }
        id
    }

    /// Complete record `id` now (stream order reached it).
    pub(crate) fn complete(&self, id: u64) {
        let ts = self.timing.then(now_ns);
        for w in self.gate.complete(id, ts) {
            w.wake();
        }
        if let Some(s) = self.shared.get() {
            s.completed(self.gate.latest());
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
            shared: std::sync::OnceLock::new(),
        }))
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
        Ok(self.0.gate.latest() >= self.0.recorded())
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
        self.check()?;
        let target = self.0.recorded();
        if self.0.gate.latest() >= target {
            return Ok(true);
        }
        if !self.0.blocking {
            let until = Instant::now() + Duration::from_micros(50);
            let backoff = crossbeam_utils::Backoff::new();
            while Instant::now() < until {
                if self.0.gate.latest() >= target {
                    return Ok(true);
                }
                backoff.spin();
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
        let done = self.0.gate.wait_latest(target, deadline);
        if done {
            // An opened event completes when its exporter died too: report that.
            self.check()?;
        }
        Ok(done)
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
