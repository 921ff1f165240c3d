//! Timeline tracing: while on, every command's enqueue, start and end (per stream and
//! device), every event record, every allocation and free, and advice about managed memory
//! are recorded with timestamps
//! from the shared clock ([`crate::clock::now_ns`]).
//!
//! When tracing is off the hot paths pay one relaxed atomic load. The Python layer turns the
//! records into a Chrome / Perfetto trace-event file (`runtime.profile("trace.json")`).
//!
//! Tracing belongs to the process that started it: a forked child starts with tracing off
//! and an empty log (`after_fork`); the parent's records stay the parent's.

use std::sync::atomic::{AtomicBool, Ordering};

static ON: AtomicBool = AtomicBool::new(false);
static LOG: crate::sync::StaticMutex<Vec<Record>> = crate::sync::StaticMutex::new(Vec::new());

/// Around `fork()`: hold the log's lock so no other thread is inside it when the process
/// is copied (see `runtime::before_fork`).
pub(crate) fn before_fork(wait: std::time::Duration) {
    LOG_FORK.before_fork(wait);
}

/// After `fork()`, in the parent or the child: release what [`before_fork`] took; in the
/// child, turn tracing off and start an empty log. The parent's records are leaked, not
/// freed: the fork handler does no more than it must. The log's lock is only tried: if a
/// thread that vanished in the fork holds it past the fork handler's wait, the records stay
/// (nothing here may block in the child).
pub(crate) fn after_fork(child: bool) {
    LOG_FORK.after_fork(child);
    if child {
        ON.store(false, Ordering::SeqCst);
        if let Some(mut log) = LOG.try_lock() {
            std::mem::forget(std::mem::take(&mut *log));
        }
    }
}

static LOG_FORK: crate::sync::ForkGuarded<crate::sync::StaticMutex<Vec<Record>>> =
    crate::sync::ForkGuarded::new(|| &LOG);

/// What happened.
#[derive(Debug, Clone, PartialEq)]
pub enum Phase {
    /// A command was queued on a stream.
    Enqueue,
    /// A command ran from `ts_ns` to `end_ns` on `engine`.
    Run {
        /// End time.
        end_ns: u64,
        /// The engine thread's name.
        engine: String,
    },
    /// An event record completed.
    Record,
    /// An allocation of `bytes`; `allocated` is the device total after it.
    Alloc {
        /// Size.
        bytes: u64,
        /// Device total allocated afterwards.
        allocated: u64,
    },
    /// Advice about a managed allocation of `bytes` (`mem_advise`).
    Advise {
        /// Size of the allocation.
        bytes: u64,
    },
    /// A free of `bytes`; `allocated` is the device total after it.
    Free {
        /// Size.
        bytes: u64,
        /// Device total allocated afterwards.
        allocated: u64,
    },
}

/// One trace record.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// Command, kernel or buffer name.
    pub name: String,
    /// Device index.
    pub device: usize,
    /// Stream id (0 for memory records).
    pub stream: u64,
    /// Timestamp (start for `Run`).
    pub ts_ns: u64,
    /// What happened.
    pub phase: Phase,
}

/// Whether tracing is on.
#[inline]
pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Clear the log and start recording.
pub fn start() {
    LOG.lock().clear();
    ON.store(true, Ordering::SeqCst);
}

/// Stop recording and return what was recorded, in the order it was logged.
pub fn stop() -> Vec<Record> {
    ON.store(false, Ordering::SeqCst);
    std::mem::take(&mut *LOG.lock())
}

/// Log a record (callers check [`enabled`] first to keep the off path free).
pub(crate) fn push(r: Record) {
    if enabled() {
        LOG.lock().push(r);
    }
}

/// The calling thread's name, for engine lanes.
pub(crate) fn thread_name() -> String {
    std::thread::current()
        .name()
        .unwrap_or("caller")
        .to_string()
}
