//! Host access ordered by the executor: which stream work is pending on an allocation, and
//! the lock that keeps stream work, host copies and other host threads from touching the same
//! allocation at once.
//!
//! Every allocation has a tracker:
//!
//! * **Pending work.** When a command that declares its buffers ([`AccessSet`], carried by
//!   every op the core builds: kernels, copies, memsets, collectives, Python kernels) is
//!   queued, each of its allocations notes the stream and the command's submission number:
//!   as its *last writer* (a write access) or among its *readers*. Safe host access waits for
//!   that work first: a read for the last writer, a write for the writer and every reader
//!   (wgpu-core's trackers and cudarc's `CudaSlice` events keep the same facts). Streams are
//!   held weakly: a stream that is gone has nothing pending.
//! * **Exclusion.** A reader-writer lock per allocation. A running op holds the locks of its
//!   allocations (shared for reads, exclusive for writes) for as long as it runs; a safe host
//!   access holds them for its copy. Two unordered ops on one allocation, or an op and a host
//!   thread, therefore take turns instead of racing: in Rust's model that race would be
//!   undefined behaviour (a kernel holds `&mut [T]` over the bytes). Locks are always taken in
//!   one global order (the allocations' never-reused ids), so lock waits alone cannot form a
//!   cycle.
//! * **Re-entry.** The thread running an op already holds its allocations: code the op runs
//!   (a Python kernel's copy, a Rust kernel's `Tensor::to_vec`)
//!   reaches them without waiting or locking again; needing a write where the op holds only a
//!   read is refused (`NotPermitted`), as is a lock taken out of order that does not come
//!   within [`OUT_OF_ORDER_WAIT`].
//! * **Lending.** The blocks of a multi-block launch run on several threads while the op's
//!   thread holds the locks. Each block thread borrows the op's holdings for the block's
//!   duration (`lend`, `Lending::enter`): it counts as a holder (never taking the locks
//!   again, which would deadlock against the op that waits for it), and safe host accesses
//!   of borrowed allocations take the launch's own mutex instead, so two blocks never copy
//!   into the same bytes at once through safe calls. An access nested in one that holds that
//!   mutex on the same thread (a block's host read that runs a queued stream's kernel inline)
//!   is covered by it and does not take it again.
//!
//! Host memory that stream ops use has a tracker too ([`HostTracker`]: a `HostVec`, a pinned
//! block, a registered range), named in the copies' sets beside their device side, so two
//! queued copies into one host array take turns as two kernels on one buffer do.
//!
//! What stays unordered is explicit: [`Buffer`]'s `unsafe fn …_unsynchronized`
//! methods (and raw pointers), whose callers promise no conflicting access. The Python
//! package's numpy views are such a path, documented as numpy's semantics over device memory.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::lock_api::{ArcRwLockReadGuard, ArcRwLockWriteGuard};
use parking_lot::{Mutex, RawRwLock, RwLock};

use super::Buffer;
use crate::error::{Result, StreamError};

/// How an op or a host call uses an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Access {
    /// Reads only.
    Read,
    /// Writes (and may read).
    Write,
}

/// Longest a lock taken out of the global order (by a thread that already holds a later one)
/// waits before the access is refused: such a wait could close a cycle.
pub const OUT_OF_ORDER_WAIT: Duration = Duration::from_secs(10);

/// Never-reused tracker ids, process-wide: the global lock order.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// What the tracker needs of a stream: implemented by the stream layer only (crate-private,
/// so no user code runs when a host access waits).
pub(crate) trait PendingWork: Send + Sync {
    /// A stable id of the stream.
    fn work_id(&self) -> u64;
    /// Whether the stream has completed its first `target` commands.
    fn work_reached(&self, target: u64) -> bool;
    /// Wait until it has, following the rules for waits from runtime threads (run the
    /// stream inline when it is merely queued, else `NotPermitted`).
    fn work_wait(self: Arc<Self>, target: u64) -> Result<()>;
}

/// A stream and the submission number of the command that uses the allocation.
struct Use {
    stream: Weak<dyn PendingWork>,
    id: u64,
    target: u64,
}

impl Use {
    fn done(&self) -> bool {
        self.stream
            .upgrade()
            .is_none_or(|s| s.work_reached(self.target))
    }
}

#[derive(Default)]
struct Pending {
    writer: Option<Use>,
    readers: Vec<Use>,
}

/// The pending work and the lock of one allocation's memory. Shared by every allocation
/// that is a range of it (a plugged allocator's blocks are ranges of buffers the core made),
/// so one piece of memory has one lock.
pub(crate) struct Tracker {
    /// Never reused: the global lock order.
    id: u64,
    lock: Arc<RwLock<()>>,
    pending: Mutex<Pending>,
}

impl Tracker {
    pub(crate) fn new() -> Arc<Tracker> {
        Arc::new(Tracker {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            lock: Arc::new(RwLock::new(())),
            pending: Mutex::new(Pending::default()),
        })
    }
}

impl Tracker {
    /// Note that command `target` of `stream` uses the allocation with `access`.
    /// `id` is the stream's [`PendingWork::work_id`]; `stream` makes a handle on it, asked
    /// only when the tracker does not hold one of that stream already (a launch loop on one
    /// stream then changes no reference count of the stream: each such change was a cache
    /// line shared with the stream's worker).
    fn note(
        &self,
        id: u64,
        stream: &impl Fn() -> Weak<dyn PendingWork>,
        target: u64,
        access: Access,
    ) {
        let mut p = self.pending.lock();
        match access {
            Access::Write => {
                // The new writer is ordered after this stream's earlier uses; other streams'
                // readers are not, so those stay until done.
                p.readers.retain(|r| r.id != id && !r.done());
                match &mut p.writer {
                    // Stream ids are never reused: the handle names this very stream.
                    Some(w) if w.id == id => w.target = target,
                    w => {
                        *w = Some(Use {
                            stream: stream(),
                            id,
                            target,
                        })
                    }
                }
            }
            Access::Read => {
                if let Some(r) = p.readers.iter_mut().find(|r| r.id == id) {
                    r.target = target;
                } else {
                    if p.readers.len() >= 4 {
                        p.readers.retain(|r| !r.done());
                    }
                    p.readers.push(Use {
                        stream: stream(),
                        id,
                        target,
                    });
                }
            }
        }
    }

    /// The work a host access of kind `access` must wait for.
    fn to_wait(&self, access: Access) -> Vec<(Arc<dyn PendingWork>, u64)> {
        let p = self.pending.lock();
        let writer = p.writer.iter();
        let uses: Vec<&Use> = match access {
            Access::Read => writer.collect(),
            Access::Write => writer.chain(p.readers.iter()).collect(),
        };
        uses.into_iter()
            .filter_map(|u| {
                let s = u.stream.upgrade()?;
                (!s.work_reached(u.target)).then_some((s, u.target))
            })
            .collect()
    }
}

/// The tracker of a piece of host memory that stream ops use: a `HostVec`, a pinned block,
/// a registered range, a Rust caller's own host memory type (`HostMemory::tracker`, in
/// `stream::copy`), or host memory that is a view of a device allocation (whose tracker it
/// then is: [`Buffer::host_tracker`]). Copies name it in their [`AccessSet`] beside the device side,
/// so two queued ops that write the same host memory (two device-to-host copies on two
/// streams), or one that writes it while another reads it, take turns instead of racing, as
/// ops on one device allocation do. It has a lock and pending work like an allocation's, in
/// the same global lock order.
#[derive(Clone)]
pub struct HostTracker(Arc<Tracker>);

impl HostTracker {
    /// A tracker for one piece of host memory (one per piece: two trackers over the same
    /// bytes order nothing between them).
    pub fn new() -> HostTracker {
        HostTracker(Tracker::new())
    }

    /// An allocation's own tracker, for host memory that views it (`Buffer::host_tracker`).
    pub(super) fn of(tracker: &Arc<Tracker>) -> HostTracker {
        HostTracker(tracker.clone())
    }
}

impl Default for HostTracker {
    fn default() -> Self {
        HostTracker::new()
    }
}

impl std::fmt::Debug for HostTracker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostTracker#{}", self.0.id)
    }
}

/// The allocations an op uses and how: sorted by allocation id, one entry per allocation
/// (a write wins over a read of the same allocation).
#[derive(Default, Clone)]
pub struct AccessSet(Uses);

/// An op's uses, inline up to four allocations (a launch's set lives in its op, and a heap
/// buffer there would be freed by the worker, across threads).
type Uses = smallvec::SmallVec<[(Arc<Tracker>, Access); 4]>;

impl std::fmt::Debug for AccessSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(a, m)| (a.id, *m)))
            .finish()
    }
}

/// The set that names nothing (ops that touch no device memory).
static EMPTY: AccessSet = AccessSet(Uses::new_const());

impl AccessSet {
    /// The set that names nothing.
    pub fn empty() -> &'static AccessSet {
        &EMPTY
    }

    /// The set of `uses` (buffers or views; views of one allocation merge).
    pub fn new<'a>(uses: impl IntoIterator<Item = (&'a Buffer, Access)>) -> AccessSet {
        AccessSet::from_vec(
            uses.into_iter()
                .map(|(b, m)| (b.alloc.tracker.clone(), m))
                .collect(),
        )
    }

    /// This set and host memory `uses` (see [`HostTracker`]), merged as [`AccessSet::union`].
    pub fn with_host<'a>(
        self,
        uses: impl IntoIterator<Item = (&'a HostTracker, Access)>,
    ) -> AccessSet {
        let mut v = self.0;
        v.extend(uses.into_iter().map(|(t, m)| (t.0.clone(), m)));
        AccessSet::from_vec(v)
    }

    fn from_vec(mut v: Uses) -> AccessSet {
        if v.len() < 2 {
            return AccessSet(v); // sorted, and nothing to merge (most launches' sets)
        }
        v.sort_by(|a, b| a.0.id.cmp(&b.0.id).then(b.1.cmp(&a.1)));
        v.dedup_by(|later, first| later.0.id == first.0.id);
        AccessSet(v)
    }

    /// Whether the set names no allocation.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Number of allocations in the set.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The union of several sets.
    pub fn union<'a>(sets: impl IntoIterator<Item = &'a AccessSet>) -> AccessSet {
        AccessSet::from_vec(sets.into_iter().flat_map(|s| s.0.iter().cloned()).collect())
    }

    /// Note that command `target` of `stream` uses these allocations (when it is queued).
    pub(crate) fn note(&self, id: u64, stream: impl Fn() -> Weak<dyn PendingWork>, target: u64) {
        for (a, m) in &self.0 {
            a.note(id, &stream, target, *m);
        }
    }

    /// Wait for the queued work a host access of these allocations must follow.
    fn wait_pending(&self) -> Result<()> {
        for (a, m) in &self.0 {
            if held_mode(a.id).is_some() {
                continue; // this thread's op is that work, or follows it in stream order
            }
            for (s, target) in a.to_wait(*m) {
                s.work_wait(target)?;
            }
        }
        Ok(())
    }

    /// Take the locks, blocking (an op about to run, or a host access after its wait).
    pub(crate) fn acquire(&self) -> Result<Held> {
        self.take(Wait::Block)
    }

    /// Take the locks only if none is contended (an op run inline by a caller that may hold
    /// a lock of its own, such as the Python interpreter's: it queues the op instead).
    pub(crate) fn try_acquire(&self) -> Option<Held> {
        self.take(Wait::No).ok()
    }

    fn take(&self, wait: Wait) -> Result<Held> {
        let mut held = Held {
            guards: Vec::with_capacity(self.0.len()),
            blocks: None,
        };
        for (a, m) in &self.0 {
            if let Some((mine, lent)) = held_entry(a.id) {
                if *m == Access::Write && mine == Access::Read {
                    return Err(refused(format!(
                        "writing device memory (lock #{}) from an op that holds it only for \
                         reading",
                        a.id
                    )));
                }
                if let (Some(lending), None) = (lent, &held.blocks) {
                    // Borrowed by a block: the other blocks of the launch hold it too. An
                    // access nested in one that holds the launch's mutex on this thread (an
                    // op a block's host access ran inline) is covered by it: the mutex is not
                    // re-entrant.
                    let key = lending.launch;
                    if HOST_MUTEXES.with(|m| m.borrow().contains(&key)) {
                        continue;
                    }
                    let guard = match wait {
                        Wait::Block => lending.host.lock_arc(),
                        Wait::No => lending.host.try_lock_arc().ok_or_else(|| {
                            refused(format!(
                                "device memory (lock #{}) is in use by another block of the \
                                 same launch",
                                a.id
                            ))
                        })?,
                    };
                    HOST_MUTEXES.with(|m| m.borrow_mut().push(key));
                    held.blocks = Some((guard, key));
                }
                continue;
            }
            let in_order = HELD.with(|h| h.borrow().iter().all(|e| e.id < a.id));
            let lock = &a.lock;
            let guard = match (wait, in_order, m) {
                (Wait::Block, true, Access::Read) => Some(Guard::Read(lock.read_arc())),
                (Wait::Block, true, Access::Write) => Some(Guard::Write(lock.write_arc())),
                (Wait::Block, false, Access::Read) => {
                    lock.try_read_arc_for(OUT_OF_ORDER_WAIT).map(Guard::Read)
                }
                (Wait::Block, false, Access::Write) => {
                    lock.try_write_arc_for(OUT_OF_ORDER_WAIT).map(Guard::Write)
                }
                (Wait::No, _, Access::Read) => lock.try_read_arc().map(Guard::Read),
                (Wait::No, _, Access::Write) => lock.try_write_arc().map(Guard::Write),
            };
            let Some(guard) = guard else {
                return Err(refused(format!(
                    "device memory (lock #{}) is in use by other work, and waiting for it \
                     from here could deadlock",
                    a.id
                )));
            };
            HELD.with(|h| {
                h.borrow_mut().push(HeldEntry {
                    id: a.id,
                    mode: *m,
                    lent: None,
                })
            });
            held.guards.push((a.id, guard));
        }
        Ok(held)
    }

    /// Run `f` as a safe host access of these allocations: after the queued work it must
    /// follow, holding their locks (what [`Buffer::read`] does for one buffer; for callers
    /// that copy host memory with trackers themselves, such as the ACL face's blocking
    /// host-to-host copy).
    ///
    /// # Errors
    /// As [`Buffer::read`]'s wait: a wait a runtime thread may not make is refused
    /// (`NotPermitted`); a lock taken out of order that does not come within
    /// [`OUT_OF_ORDER_WAIT`] is refused.
    pub fn host<R>(&self, f: impl FnOnce() -> R) -> Result<R> {
        self.wait_pending()?;
        let _held = self.acquire()?;
        Ok(f())
    }
}

#[derive(Clone, Copy)]
enum Wait {
    Block,
    No,
}

fn refused(what: String) -> crate::error::Error {
    StreamError::NotPermitted { what }.into()
}

enum Guard {
    Read(#[allow(dead_code)] ArcRwLockReadGuard<RawRwLock, ()>),
    Write(#[allow(dead_code)] ArcRwLockWriteGuard<RawRwLock, ()>),
}

/// Locks taken by [`AccessSet::acquire`]; released (in reverse order) when dropped.
pub(crate) struct Held {
    guards: Vec<(u64, Guard)>,
    /// The launch's mutex, when some of the allocations are borrowed by a block, and its
    /// key in [`HOST_MUTEXES`].
    blocks: Option<(parking_lot::ArcMutexGuard<parking_lot::RawMutex, ()>, u64)>,
}

impl Drop for Held {
    fn drop(&mut self) {
        while let Some((id, guard)) = self.guards.pop() {
            drop(guard);
            HELD.with(|h| {
                let mut h = h.borrow_mut();
                if let Some(i) = h.iter().rposition(|e| e.id == id) {
                    h.remove(i);
                }
            });
        }
        if let Some((guard, key)) = self.blocks.take() {
            drop(guard);
            HOST_MUTEXES.with(|m| {
                let mut m = m.borrow_mut();
                if let Some(i) = m.iter().rposition(|&k| k == key) {
                    m.remove(i);
                }
            });
        }
    }
}

/// One allocation a thread holds: locked by this thread (`lent: None`), or borrowed from the
/// op whose block it runs.
struct HeldEntry {
    id: u64,
    mode: Access,
    lent: Option<Arc<Lending>>,
}

thread_local! {
    /// The launches (by their never-reused ids, `Lending::launch`) whose host mutex this
    /// thread holds, innermost last.
    static HOST_MUTEXES: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };

    /// The allocations this thread holds (the op it runs, or its host access, or the
    /// holdings a block borrowed), in the order taken.
    static HELD: RefCell<Vec<HeldEntry>> = const { RefCell::new(Vec::new()) };
}

/// How this thread holds allocation `id`, if it does (the strongest mode it holds it in),
/// and the launch it borrowed it from when its innermost holding is a block's borrow.
fn held_entry(id: u64) -> Option<(Access, Option<Arc<Lending>>)> {
    with_holding(id, |mode, innermost| (mode, innermost.lent.clone()))
}

/// Whether the calling thread may use the allocation tracked by `tracker` as `access` says
/// without taking anything: it holds it in that mode or a stronger one, itself (the op it
/// runs: no other thread touches it meanwhile), or borrowed from the blocks of launch
/// `launch` (not 0), whose blocks share out the work between them. Looks only: no reference
/// count of a lending is changed.
pub(super) fn holds(tracker: &Tracker, access: Access, launch: u64) -> bool {
    with_holding(tracker.id, |mine, innermost| {
        mine >= access
            && innermost
                .lent
                .as_ref()
                .is_none_or(|l| launch != 0 && l.launch == launch)
    })
    .unwrap_or(false)
}

/// `f` of the strongest mode this thread holds allocation `id` in and of its innermost
/// holding of it; `None` when it holds it in none.
fn with_holding<R>(id: u64, f: impl FnOnce(Access, &HeldEntry) -> R) -> Option<R> {
    HELD.with(|h| {
        let h = h.borrow();
        let mode = h.iter().filter(|e| e.id == id).map(|e| e.mode).max()?;
        let innermost = h.iter().rev().find(|e| e.id == id)?;
        Some(f(mode, innermost))
    })
}

/// How this thread holds allocation `id`, if it does.
fn held_mode(id: u64) -> Option<Access> {
    HELD.with(|h| {
        h.borrow()
            .iter()
            .filter(|e| e.id == id)
            .map(|e| e.mode)
            .max()
    })
}

/// What a multi-block launch lends its blocks: the holdings of the thread that runs the op
/// (taken when the launch begins), and the mutex that safe host accesses of those
/// allocations take from a block (the op holds the allocations' own locks, so blocks cannot
/// take them; this one keeps blocks of the launch from touching the same bytes at once).
pub(crate) struct Lending {
    entries: Vec<(u64, Access)>,
    host: Arc<Mutex<()>>,
    /// The launch (`kernel::block`) whose blocks borrow.
    launch: u64,
}

/// Snapshot the calling thread's holdings (the op it runs) for the blocks of launch
/// `launch`.
pub(crate) fn lend(launch: u64) -> Arc<Lending> {
    let entries = HELD.with(|h| h.borrow().iter().map(|e| (e.id, e.mode)).collect());
    Arc::new(Lending {
        entries,
        host: Arc::new(Mutex::new(())),
        launch,
    })
}

impl Lending {
    /// Borrow the holdings on the calling thread (a block's thread: a helper, or the op's own
    /// thread while it runs a block) until the guard is dropped. Takes no lock.
    pub(crate) fn enter(self: &Arc<Self>) -> Borrowed {
        let depth = HELD.with(|h| {
            let mut h = h.borrow_mut();
            let depth = h.len();
            h.extend(self.entries.iter().map(|&(id, mode)| HeldEntry {
                id,
                mode,
                lent: Some(self.clone()),
            }));
            depth
        });
        Borrowed {
            depth,
            _thread: std::marker::PhantomData,
        }
    }
}

/// A block's borrow of its launch's holdings ([`Lending::enter`]); ends when dropped.
pub(crate) struct Borrowed {
    depth: usize,
    /// Bound to the thread whose holdings list it changed.
    _thread: std::marker::PhantomData<*const ()>,
}

impl Drop for Borrowed {
    fn drop(&mut self) {
        // Holdings taken inside the borrow were dropped first (guards nest).
        let rest = HELD.with(|h| h.borrow_mut().split_off(self.depth));
        drop(rest);
    }
}
