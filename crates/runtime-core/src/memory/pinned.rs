//! Pinned (page-locked) host memory, the virtual devices' `cudaMallocHost` / `aclrtMallocHost`.
//!
//! A [`PinnedBuffer`] is a reference to one block of host memory that the OS was asked to keep
//! resident (`mlock`). Stream-ordered copies know pinned blocks ([`find`]): a copy from pinned
//! memory reads the host bytes when the stream runs it (truly asynchronous, as CUDA does for
//! page-locked memory), holding a clone of the block so that it stays mapped until the copy is
//! done; a copy from any other host memory is staged when it is queued (see
//! `stream::copy::h2d_async`), into a block of this cache that the copy holds until it ran
//! (so staging buffers show in [`stats`] while copies are in flight, and are reused after).
//!
//! Blocks are cached process-wide, like PyTorch's `CachingHostAllocator`: a request is rounded
//! up to a power of two (whole pages; page multiples above [`ROUND_POW2_MAX`]), and a block
//! whose last reference is dropped goes back to the cache for the next request of that size,
//! still locked. [`empty_cache`] unmaps the cached blocks. Cached memory is not zeroed again
//! (as with `cudaMallocHost`); fresh mappings are zero.
//!
//! When `mlock` is refused (`RLIMIT_MEMLOCK` too low, no `CAP_IPC_LOCK`), the block is still
//! handed out, as ordinary pageable memory that copies nonetheless treat as pinned;
//! [`PinnedBuffer::is_locked`] says so, and the Python layer warns.
//!
//! [`PinnedBuffer::free`] is the explicit free (`free_host`): later stream-ordered copies that
//! use the block are refused, and the block returns to the cache once no clone (a numpy
//! array's, a queued copy's) is left, so freeing while a copy is in flight is safe.
//!
//! A zero-byte request maps nothing and is not counted (as `cudaMallocHost(0)` allocates
//! nothing); it can still be freed. The cache and the statistics belong to a runtime:
//! `shutdown` calls [`reset`], which unmaps the cached blocks and starts the statistics over;
//! a block still alive then (a numpy array over it) stays valid memory, is unmapped when its
//! last clone goes, and counts in no later statistics. A forked child starts over the same
//! way (`after_fork`), except that the parent's cached blocks are leaked there, not
//! unmapped (and the child's copies of them are not locked: `mlock` is not inherited).
//!
//! **Registered memory** (`cudaHostRegister`): a range of host memory made elsewhere (a numpy
//! array) can be [`register`]ed; copies then treat it as pinned ([`find_registered`]): a
//! stream-ordered copy reads or writes it when the stream runs, holding a clone of the
//! registration's keep-alive until then. The registration holds whatever the caller gave to
//! keep the memory valid (the Python bindings: the array's buffer export). [`unregister`]
//! refuses (`NotReady`) while a queued copy still holds the registration, so the memory is
//! never given back under a copy; registrations outlive a shutdown, as host memory does.
//!
//! Each block, and each registered range, has a tracker (`memory::access::HostTracker`):
//! stream ops that use its bytes name it, so two queued copies into one block take turns.
//!
//! The `unsafe` here is the mapping itself (mmap/mlock/munlock/munmap) and the raw reads and
//! writes of a block, each checked against the block's length.

use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use super::access::HostTracker;
use crate::error::{DeviceError, MemoryError, Result};

/// Requests up to this many bytes are rounded up to a power of two; larger ones to whole pages.
pub const ROUND_POW2_MAX: u64 = 1 << 30;

/// Bytes of the block that serves a request of `size` bytes (0 for 0).
pub fn block_size(size: u64) -> u64 {
    let page = super::host::PAGE;
    match size {
        0 => 0,
        s if s <= ROUND_POW2_MAX => s.next_power_of_two().max(page),
        s => s.checked_next_multiple_of(page).unwrap_or(u64::MAX),
    }
}

/// One anonymous mapping, locked in RAM when the OS allowed it.
struct Mapping {
    base: NonNull<u8>,
    len: usize,
    locked: bool,
}

// SAFETY: a mapping is plain memory owned by this value; access to its bytes goes through raw
// copies whose ordering the users establish (streams, events), as for device memory.
unsafe impl Send for Mapping {}
// SAFETY: as above; the struct itself is immutable after creation.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Map `len` (> 0) zeroed bytes and try to lock them. `None` when the mapping fails.
    fn new(len: usize) -> Option<Mapping> {
        // SAFETY: an anonymous private mapping at an address of the OS's choosing touches no
        // existing memory; the result is checked before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        let base = NonNull::new(p.cast::<u8>())?;
        // SAFETY: `[base, base + len)` is the mapping just made; locking it has no effect on
        // memory safety (it only faults the pages in and keeps them resident).
        let locked = unsafe { libc::mlock(p, len) } == 0;
        Some(Mapping { base, len, locked })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping is owned by this value and no block refers to it any more (a
        // mapping is dropped only from the cache or when a block failed to be built).
        unsafe {
            if self.locked {
                libc::munlock(self.base.as_ptr().cast(), self.len);
            }
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}

/// Counters of the pinned allocator, in the manner of `torch.cuda.host_memory_stats`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HostMemoryStats {
    /// Live blocks (handed out, not yet returned to the cache).
    pub allocations: u64,
    /// Highest `allocations`.
    pub allocations_peak: u64,
    /// Blocks handed out so far.
    pub allocations_total: u64,
    /// Blocks returned so far.
    pub frees_total: u64,
    /// Bytes of live blocks (block sizes).
    pub allocated_bytes: u64,
    /// Highest `allocated_bytes`.
    pub allocated_bytes_peak: u64,
    /// Bytes mapped: live and cached blocks.
    pub reserved_bytes: u64,
    /// Highest `reserved_bytes`.
    pub reserved_bytes_peak: u64,
    /// Mappings (segments) now: live and cached blocks.
    pub segments: u64,
    /// Of `reserved_bytes`, the bytes the OS locked.
    pub locked_bytes: u64,
    /// Mappings made (`mmap` calls).
    pub num_host_alloc: u64,
    /// Mappings released (`munmap` calls).
    pub num_host_free: u64,
    /// Requests served from the cache.
    pub cache_hits: u64,
}

struct Pool {
    /// Which runtime's pool this is ([`reset`] moves on): blocks of an earlier one are not
    /// cached or counted when they go.
    epoch: u64,
    /// Cached blocks by block size.
    cache: BTreeMap<usize, Vec<Mapping>>,
    /// Live blocks by start address (for [`find`]).
    live: BTreeMap<usize, Weak<Block>>,
    stats: HostMemoryStats,
    next_id: u64,
}

const NO_STATS: HostMemoryStats = HostMemoryStats {
    allocations: 0,
    allocations_peak: 0,
    allocations_total: 0,
    frees_total: 0,
    allocated_bytes: 0,
    allocated_bytes_peak: 0,
    reserved_bytes: 0,
    reserved_bytes_peak: 0,
    segments: 0,
    locked_bytes: 0,
    num_host_alloc: 0,
    num_host_free: 0,
    cache_hits: 0,
};

static POOL: crate::sync::StaticMutex<Pool> = crate::sync::StaticMutex::new(Pool {
    epoch: 0,
    cache: BTreeMap::new(),
    live: BTreeMap::new(),
    stats: NO_STATS,
    next_id: 1,
});

/// One handed-out block; returns its mapping to the cache when dropped.
struct Block {
    /// `None` only for a zero-byte block.
    mapping: Option<Mapping>,
    size: usize,
    id: u64,
    freed: AtomicBool,
    /// The pool's epoch when it was handed out.
    epoch: u64,
    /// Orders the stream ops that use the block (`stream::copy`).
    tracker: HostTracker,
}

impl Block {
    fn base(&self) -> *mut u8 {
        self.mapping
            .as_ref()
            .map_or(NonNull::dangling().as_ptr(), |m| m.base.as_ptr())
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        // A zero-byte block was never counted.
        let Some(m) = self.mapping.take() else {
            return;
        };
        let mut pool = POOL.lock();
        let addr = m.base.as_ptr() as usize;
        // Only this block's own entry: its Weak no longer upgrades.
        if pool.live.get(&addr).is_some_and(|w| w.strong_count() == 0) {
            pool.live.remove(&addr);
        }
        if pool.epoch != self.epoch {
            // Handed out before a shutdown: not this runtime's to cache or count.
            drop(pool);
            drop(m);
            return;
        }
        let s = &mut pool.stats;
        s.allocations -= 1;
        s.frees_total += 1;
        s.allocated_bytes -= m.len as u64;
        pool.cache.entry(m.len).or_default().push(m);
    }
}

/// A reference to a block of pinned host memory. Clones share the block; it returns to the
/// cache when the last clone is dropped.
#[derive(Clone)]
pub struct PinnedBuffer(Arc<Block>);

impl std::fmt::Debug for PinnedBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PinnedBuffer#{}({} bytes)", self.0.id, self.0.size)
    }
}

impl PartialEq for PinnedBuffer {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// Allocate `size` bytes of pinned host memory (from the cache when a block of that size is
/// there; fresh mappings are zero, cached ones keep their old bytes).
///
/// # Errors
/// `OutOfMemory`-like `MemoryError::HostAlloc` when the OS refuses the mapping.
pub fn allocate(size: u64) -> Result<PinnedBuffer> {
    let block = block_size(size);
    let len = usize::try_from(block).map_err(|_| too_large(size))?;
    let size_usize = usize::try_from(size).map_err(|_| too_large(size))?;
    let mut pool = POOL.lock();
    let cached = if len == 0 {
        None
    } else {
        pool.cache.get_mut(&len).and_then(Vec::pop)
    };
    let mapping = match cached {
        Some(m) => {
            pool.stats.cache_hits += 1;
            Some(m)
        }
        None if len == 0 => None,
        None => {
            // Mapped without the pool's lock: mlock faults in every page.
            drop(pool);
            let m = Mapping::new(len).ok_or_else(|| too_large(size))?;
            pool = POOL.lock();
            let s = &mut pool.stats;
            s.num_host_alloc += 1;
            s.segments += 1;
            s.reserved_bytes += len as u64;
            s.reserved_bytes_peak = s.reserved_bytes_peak.max(s.reserved_bytes);
            if m.locked {
                s.locked_bytes += len as u64;
            }
            Some(m)
        }
    };
    let id = pool.next_id;
    pool.next_id += 1;
    if len > 0 {
        let s = &mut pool.stats;
        s.allocations += 1;
        s.allocations_peak = s.allocations_peak.max(s.allocations);
        s.allocations_total += 1;
        s.allocated_bytes += len as u64;
        s.allocated_bytes_peak = s.allocated_bytes_peak.max(s.allocated_bytes);
    }
    let b = Arc::new(Block {
        mapping,
        size: size_usize,
        id,
        freed: AtomicBool::new(false),
        epoch: pool.epoch,
        tracker: HostTracker::new(),
    });
    if len > 0 {
        pool.live.insert(b.base() as usize, Arc::downgrade(&b));
    }
    Ok(PinnedBuffer(b))
}

fn too_large(size: u64) -> crate::error::Error {
    MemoryError::HostAlloc {
        requested: size,
        block: block_size(size),
    }
    .into()
}

/// The live pinned block holding all of `[ptr, ptr + len)`, if any (`len` > 0).
pub fn find(ptr: *const u8, len: usize) -> Option<PinnedBuffer> {
    if len == 0 {
        return None;
    }
    let start = ptr as usize;
    let end = start.checked_add(len)?;
    let pool = POOL.lock();
    let (_, weak) = pool.live.range(..=start).next_back()?;
    let b = weak.upgrade()?;
    let base = b.base() as usize;
    // Checked against the block's mapping (what the OS locked), not the requested size: a
    // numpy array over the block never reaches past the requested size anyway.
    let mapped = b.mapping.as_ref().map_or(0, |m| m.len);
    let inside = end <= base + mapped;
    // Dropped after the lock: the last clone's drop takes the pool's lock.
    drop(pool);
    inside.then_some(PinnedBuffer(b))
}

/// The pinned block (its base and mapped length) with a byte in `[start, end)`, if any.
fn block_overlapping(start: usize, end: usize) -> Option<(usize, usize)> {
    let pool = POOL.lock();
    // Blocks are disjoint: the last one starting before `end` is the only candidate.
    let b = pool.live.range(..end).next_back()?.1.upgrade();
    // Dropped after the lock: the last clone's drop takes the pool's lock.
    drop(pool);
    let b = b?;
    let base = b.base() as usize;
    let mapped = b.mapping.as_ref().map_or(0, |m| m.len);
    (base + mapped > start).then_some((base, mapped))
}

/// What keeps registered memory valid while it is registered (and while queued copies use
/// it).
pub type KeepAlive = Arc<dyn std::any::Any + Send + Sync>;

/// One registered range. `held` is the registry's own handle on the registrant's keep-alive:
/// its clones are the copies using the range (the registrant's other references to what it
/// gave do not count).
struct Registration {
    len: usize,
    held: Arc<KeepAlive>,
    /// Orders the stream ops that use the range (`stream::copy`).
    tracker: HostTracker,
}

/// Registered ranges by start address.
static REGISTERED: crate::sync::StaticMutex<BTreeMap<usize, Registration>> =
    crate::sync::StaticMutex::new(BTreeMap::new());

/// Register `[ptr, ptr + len)` as pinned memory (`cudaHostRegister`), holding `keep` (which
/// must keep the range valid) until [`unregister`].
///
/// # Errors
/// `ArgError` (argument `arr`) for an empty range, one that overlaps a registered range
/// (registering twice), memory of this allocator's own pinned blocks (`malloc_host`), or
/// device memory: one memory has one tracker.
pub fn register(ptr: *const u8, len: usize, keep: KeepAlive) -> Result<()> {
    let start = ptr as usize;
    if len == 0 {
        return Err(crate::error::arg_error(
            "arr",
            "is empty: there is no memory to register",
        ));
    }
    let Some(end) = start.checked_add(len) else {
        return Err(crate::error::arg_error(
            "arr",
            "its range overflows the address space",
        ));
    };
    // Any byte of a pinned block: one memory has one tracker, and copies would find the
    // block's for ranges inside it and the registration's for ranges reaching past it.
    if let Some((base, blen)) = block_overlapping(start, end) {
        return Err(crate::error::arg_error(
            "arr",
            format!(
                "[{start:#x}, {end:#x}) overlaps the pinned block [{base:#x}, {:#x}) \
                 (malloc_host), which is pinned memory already",
                base + blen
            ),
        ));
    }
    // Device memory has its allocations' trackers (and `cudaHostRegister` refuses it too).
    if let Some((base, mlen)) = super::host::mapping_overlapping(start, len) {
        return Err(crate::error::arg_error(
            "arr",
            format!(
                "[{start:#x}, {end:#x}) overlaps device memory [{base:#x}, {:#x}); only host \
                 memory is registered",
                base + mlen
            ),
        ));
    }
    let mut reg = REGISTERED.lock();
    let before = reg.range(..end).next_back().map(|(&s, r)| (s, r.len));
    if let Some((s, l)) = before.filter(|&(s, l)| s + l > start) {
        return Err(crate::error::arg_error(
            "arr",
            format!(
                "[{start:#x}, {end:#x}) overlaps the registered range [{s:#x}, {:#x}): memory is registered once (host_unregister first)",
                s + l
            ),
        ));
    }
    reg.insert(
        start,
        Registration {
            len,
            held: Arc::new(keep),
            tracker: HostTracker::new(),
        },
    );
    Ok(())
}

/// Unregister the range registered at `ptr` (`cudaHostUnregister`); its keep-alive is dropped
/// here, outside the registry's lock.
///
/// # Errors
/// `ArgError` (argument `arr`) when no range is registered at `ptr`; `NotReady` while a
/// queued copy still uses the range (synchronize its stream first; nothing changes).
pub fn unregister(ptr: *const u8) -> Result<()> {
    let start = ptr as usize;
    let mut reg = REGISTERED.lock();
    let Some(r) = reg.get(&start) else {
        return Err(crate::error::arg_error(
            "arr",
            format!("no memory is registered at {start:#x} (host_register it first)"),
        ));
    };
    if Arc::strong_count(&r.held) > 1 {
        return Err(crate::error::StreamError::NotReady {
            what: format!(
                "a copy queued on the registered host memory at {start:#x} ({} bytes)",
                r.len
            ),
        }
        .into());
    }
    let gone = reg.remove(&start);
    drop(reg);
    drop(gone);
    Ok(())
}

/// `f` of the registered range holding all of `[ptr, ptr + len)`, if any (`len` > 0), under
/// the registry's lock.
fn registered<R>(ptr: *const u8, len: usize, f: impl FnOnce(&Registration) -> R) -> Option<R> {
    if len == 0 {
        return None;
    }
    let start = ptr as usize;
    let end = start.checked_add(len)?;
    let reg = REGISTERED.lock();
    let (&s, r) = reg.range(..=start).next_back()?;
    (end <= s + r.len).then(|| f(r))
}

/// The keep-alive of the registered range holding all of `[ptr, ptr + len)`, if any (`len`
/// > 0): a copy that holds it keeps [`unregister`] from giving the memory back under it.
pub fn find_registered(ptr: *const u8, len: usize) -> Option<KeepAlive> {
    registered(ptr, len, |r| r.held.clone() as KeepAlive)
}

/// The tracker of the registered range holding all of `[ptr, ptr + len)`, if any (`len` > 0).
pub fn registered_tracker(ptr: *const u8, len: usize) -> Option<HostTracker> {
    registered(ptr, len, |r| r.tracker.clone())
}

/// Whether a range is registered at exactly `ptr`.
pub fn is_registered(ptr: *const u8) -> bool {
    REGISTERED.lock().contains_key(&(ptr as usize))
}

/// Counters of the pinned allocator.
pub fn stats() -> HostMemoryStats {
    POOL.lock().stats
}

/// Start over, for a new runtime (called by `shutdown`): unmap the cached blocks and zero the
/// statistics. Blocks alive now stay valid; they are unmapped when they go and counted in no
/// later statistics.
pub fn reset() {
    let mut pool = POOL.lock();
    pool.epoch += 1;
    pool.stats = NO_STATS;
    let cached = std::mem::take(&mut pool.cache);
    // Unmapped after the lock.
    drop(pool);
    drop(cached);
}

/// Unmap every cached block (live blocks are untouched).
pub fn empty_cache() {
    let mut pool = POOL.lock();
    let cached: Vec<Mapping> = std::mem::take(&mut pool.cache)
        .into_values()
        .flatten()
        .collect();
    let s = &mut pool.stats;
    for m in &cached {
        s.num_host_free += 1;
        s.segments -= 1;
        s.reserved_bytes -= m.len as u64;
        if m.locked {
            s.locked_bytes -= m.len as u64;
        }
    }
    drop(pool);
    drop(cached);
}

impl PinnedBuffer {
    /// Bytes as requested.
    pub fn len(&self) -> u64 {
        self.0.size as u64
    }

    /// Whether the block is zero bytes.
    pub fn is_empty(&self) -> bool {
        self.0.size == 0
    }

    /// Unique id (per process).
    pub fn id(&self) -> u64 {
        self.0.id
    }

    /// Start address (dangling, never dereferenced, for a zero-byte block). Valid while a
    /// clone lives.
    pub fn as_ptr(&self) -> *mut u8 {
        self.0.base()
    }

    /// The tracker that orders the stream ops using the block (shared by its clones).
    pub fn tracker(&self) -> &HostTracker {
        &self.0.tracker
    }

    /// Whether the OS locked the block's pages (false when `mlock` was refused).
    pub fn is_locked(&self) -> bool {
        self.0.mapping.as_ref().is_some_and(|m| m.locked)
    }

    /// Number of live clones (arrays over it, queued copies).
    pub fn ref_count(&self) -> usize {
        Arc::strong_count(&self.0)
    }

    /// Whether [`PinnedBuffer::free`] was called.
    pub fn is_freed(&self) -> bool {
        self.0.freed.load(Ordering::Acquire)
    }

    /// The explicit free (`free_host`): later stream-ordered copies using the block are
    /// refused; the block returns to the cache once its last clone is dropped.
    ///
    /// # Errors
    /// `InvalidHandle` when it was freed already.
    pub fn free(&self) -> Result<()> {
        if self.0.freed.swap(true, Ordering::AcqRel) {
            return Err(self.freed_error());
        }
        Ok(())
    }

    /// Fails with `InvalidHandle` once the block was freed with [`PinnedBuffer::free`].
    pub fn check(&self) -> Result<()> {
        if self.is_freed() {
            return Err(self.freed_error());
        }
        Ok(())
    }

    fn freed_error(&self) -> crate::error::Error {
        DeviceError::InvalidHandle {
            what: format!("pinned host memory #{} ({} bytes)", self.0.id, self.0.size),
            why: "it was freed with free_host".into(),
        }
        .into()
    }

    /// Check `[offset, offset + count)` against the block; the offset as a host `usize`.
    fn range(&self, arg: &'static str, offset: u64, count: usize) -> Result<usize> {
        match offset.checked_add(count as u64) {
            Some(end) if end <= self.0.size as u64 => Ok(offset as usize),
            _ => Err(MemoryError::OutOfBounds {
                arg,
                offset,
                count: count as u64,
                size: self.0.size as u64,
                what: "pinned host buffer",
            }
            .into()),
        }
    }

    /// Copy `src` into the block at `offset` (not stream ordered).
    ///
    /// # Safety
    /// Pinned memory is the program's to order, as in CUDA: the block has no lock, and its
    /// clones, `as_ptr` and the stream copies queued from or to it reach the same bytes.
    /// While this call runs nothing else may read or write `offset..offset + src.len()`: no
    /// other thread through this block, its clones or a pointer from it, and no stream copy
    /// from or to the block (a queued one may start at any moment: synchronize its stream
    /// first, unless something the caller holds keeps it from starting).
    ///
    /// # Errors
    /// The range is outside the block.
    pub unsafe fn write(&self, offset: u64, src: &[u8]) -> Result<()> {
        let offset = self.range("offset", offset, src.len())?;
        // SAFETY: the range is inside the block's mapping (checked), which lives while `self`
        // does; nothing else accesses it meanwhile (the caller's contract); `src` is a Rust
        // slice and cannot overlap a block handed out as raw memory unless the caller made
        // one from `as_ptr`, which a copy (memmove) tolerates.
        unsafe { std::ptr::copy(src.as_ptr(), self.as_ptr().add(offset), src.len()) };
        Ok(())
    }

    /// Copy bytes of the block at `offset` into `dst` (not stream ordered).
    ///
    /// # Safety
    /// As [`PinnedBuffer::write`], except that other reads may run at the same time: nothing
    /// may write `offset..offset + dst.len()` while this call runs.
    ///
    /// # Errors
    /// The range is outside the block.
    pub unsafe fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        let offset = self.range("offset", offset, dst.len())?;
        // SAFETY: as for `write`: inside the mapping, and nothing writes it meanwhile (the
        // caller's contract).
        unsafe { std::ptr::copy(self.as_ptr().add(offset), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }
}

static FORK: crate::sync::ForkGuarded<crate::sync::StaticMutex<Pool>> =
    crate::sync::ForkGuarded::new(|| &POOL);

/// The registry of registered ranges, around `fork()` as the pool (every queued copy looks
/// it up, so a thread queueing one may hold it when another thread forks).
static FORK_REGISTERED: crate::sync::ForkGuarded<
    crate::sync::StaticMutex<BTreeMap<usize, Registration>>,
> = crate::sync::ForkGuarded::new(|| &REGISTERED);

/// Around `fork()`: hold the locks so that no other thread is inside them when the process
/// is copied (see `runtime::install_fork_handlers`).
pub(crate) fn before_fork(wait: std::time::Duration) {
    FORK.before_fork(wait);
    FORK_REGISTERED.before_fork(wait);
}

/// After `fork()`, in the parent or the child: release what [`before_fork`] took; in the
/// child, start the cache and the statistics over, as [`reset`] does for a new runtime, but
/// leak the parent's cached blocks instead of unmapping them (the child's runtime is a new
/// one, and the parent's blocks are not locked in the child). The pool's lock is only tried:
/// if a thread that vanished in the fork holds it past the fork handler's wait, the pool
/// stays as it was (nothing here may block in the child).
pub(crate) fn after_fork(child: bool) {
    FORK_REGISTERED.after_fork(child);
    FORK.after_fork(child);
    if child {
        if let Some(mut pool) = POOL.try_lock() {
            pool.epoch += 1;
            pool.stats = NO_STATS;
            std::mem::forget(std::mem::take(&mut pool.cache));
        }
    }
}
