//! Device memory: the allocator of one virtual device and the reference-counted buffers it
//! hands out.
//!
//! A virtual device's memory is host virtual memory, so address space is never what runs out:
//! the allocator spends it freely and enforces the device's capacity in bytes.
//!
//! * Large allocations (above [`SMALL_MAX`]) each get their own shared `MAP_NORESERVE`
//!   mapping of [`block_size`] bytes (whole pages). Nothing is carved from a shared range, so
//!   the free space cannot fragment: a large allocation fails only when `reserved + block`
//!   would exceed the capacity after the caches were flushed.
//! * Small allocations come from the slab's size classes, carved from spans of [`SLAB_SPAN`]
//!   bytes. Spans come from one mapping reserved per device (the capacity rounded up to whole
//!   spans) through a buddy allocator that only ever hands out blocks of that one size, so it
//!   cannot fragment either. The only capacity a live allocation can hold beyond its own bytes
//!   is the unused part of partly used slab spans ("slab rounding").
//! * Zero-byte allocations take no memory: they count as allocations (`active_allocations`,
//!   `num_allocs`) but add nothing to `allocated` or `reserved`; their pointer is valid but
//!   must not be dereferenced.
//! * With `enableMemoryReuse` on, a freed large block keeps its mapping: it goes to a *dirty*
//!   list, a per-device scrubber thread zeroes it and moves it to the *clean* cache (keyed by
//!   block size), and an allocation of that size takes it back without a system call. With
//!   reuse off, and on `empty_cache`, blocks are unmapped and empty slab spans released.
//! * When an allocation does not fit, the caches are flushed (waiting for a block the
//!   scrubber holds) and it is retried; if it still does not fit, the device's *reclaimer*
//!   ([`DeviceMemory::set_reclaimer`], installed by the device layer) waits once for queued
//!   work that may still hold freed blocks, and the allocation is retried again. Only then is
//!   `OutOfMemoryError` raised, naming the requested, free and total bytes.
//!
//! Modules:
//! * `buddy` (crate-private): power-of-two blocks over a range of offsets (here: the slab
//!   spans of a device). Offsets only; no `unsafe`.
//! * `slab` (crate-private): size classes up to [`SMALL_MAX`] carved from spans. No `unsafe`.
//! * `host` (crate-private): reserved, lazily committed mappings (`Arena`) of the process's
//!   shared device memory file; raw copies and typed views, every range checked against its
//!   mapping.
//! * [`pool`]: the pool face of the allocator: its limit ([`DeviceMemory::set_limit`]) and
//!   frees deferred by [`Buffer::record_stream`] until the recorded streams' work is done.
//! * [`allocator`]: pluggable allocation ([`Allocator`], [`DeviceMemory::malloc`]). A plugged
//!   allocator returns a [`Block`] holding a `Buffer` the core made (never an address),
//!   validated before use, so no allocator can make the core touch memory it did not
//!   allocate.
//! * [`layout`]: shapes and byte strides over a buffer ([`Layout`]): numpy's contiguity
//!   flags, strided views (step slices, transposes) and element copies between layouts.
//! * `ipc`: buffers shared with other processes ([`Buffer::ipc_handle`],
//!   [`DeviceMemory::open_ipc_handle`]); imported buffers map the exporter's memory and are
//!   accounted apart from the allocator.
//!
//! The public API is [`DeviceMemory`] (one device's allocator), [`Buffer`] (a reference to
//! one allocation) and its methods, which check every range against the allocation, never
//! against the device: no safe call can reach outside a live allocation. The allocators and
//! the mappings are not reachable from outside the crate:
//!
//! ```compile_fail
//! use runtime_core::memory::host::Arena;
//! ```
//!
//! Invariants:
//! * Every byte the allocator hands out reads as zero. A fresh mapping is zero-filled by the
//!   OS; free space in the slab arena is zero (untouched pages, or pages released with
//!   `MADV_REMOVE`); free slab slots are zeroed when freed (they are small); cached large
//!   blocks are zeroed by the scrubber before they are reused, or by the allocating caller
//!   when it takes one the scrubber has not reached (only the pages that were touched: an
//!   untouched block costs one `lseek` on the memory file), which it prefers to mapping fresh memory
//!   (blocks over [`SCRUB_FILL_MAX`] are released rather than filled, so RAM follows what was
//!   touched).
//! * RAM is spent only on touched pages: mappings are `MAP_NORESERVE` and committed on first
//!   touch, so a fresh 1 GiB allocation costs no RAM.
//! * A [`Buffer`] holds an `Arc` to its allocation and a range of it (the whole allocation, or
//!   a view made by [`Buffer::view`] / [`Buffer::shifted`], checked to lie inside it); views,
//!   DLPack capsules and queued stream operations hold clones. The block returns to the allocator when the last one drops.
//!   [`Buffer::as_ptr`] stays valid while the buffer lives: a large block's mapping is owned by
//!   its allocation, and the slab mapping lives until the last allocation is gone (each holds
//!   its `DeviceMemory`), even after `shutdown`.
//! * `reserved` is live large blocks, cached large blocks and slab spans, and never exceeds
//!   the capacity; `allocated` is what live buffers consume; `cached = reserved - allocated`.
//! * The reclaimer is never called with the allocator's state lock held.

pub mod access;
pub mod allocator;
pub mod async_pool;
pub(crate) mod buddy;
pub mod defer;
mod element;
mod fraction;
pub(crate) mod host;
pub mod ipc;
pub mod layout;
pub mod managed;
pub mod pinned;
pub mod pool;
pub(crate) mod slab;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::sync::lock::Mutex;

use crate::clock::now_ns;
use crate::config::Options;
use crate::error::{MemoryError, Result};
use crate::trace;
pub use allocator::{Allocator, Block};
pub use async_pool::AsyncPoolStats;
use buddy::Buddy;
pub use element::Element;
use host::{Arena, PAGE};
pub use layout::Layout;
pub use pool::StreamFence;
use slab::{Slab, SlabAlloc, SLAB_MAX, SPAN_SIZE};

/// Largest request served from the slab's size classes; larger ones get page-multiple blocks.
pub const SMALL_MAX: u64 = SLAB_MAX;

/// Size of the spans the slab carves small allocations from (one size for every class).
pub const SLAB_SPAN: u64 = SPAN_SIZE;

/// Bytes the allocator consumes for a request of `size` bytes: nothing for 0, its slab class,
/// or its size rounded up to whole pages.
pub fn block_size(size: u64) -> u64 {
    if size == 0 {
        return 0;
    }
    match slab::class_of(size) {
        Some(c) => slab::class_size(c),
        None => size.checked_next_multiple_of(PAGE).unwrap_or(u64::MAX),
    }
}

/// Unreserved capacity a request of `size` bytes needs when no cached block or partly used
/// slab span can serve it: a slab span for small requests, its block for large ones.
pub fn fresh_block_size(size: u64) -> u64 {
    match size {
        0 => 0,
        s if s <= SLAB_MAX => SLAB_SPAN,
        s => block_size(s),
    }
}

/// Waits for queued work that may still hold freed blocks; returns true if it waited (then
/// the allocation that called it is retried). See [`DeviceMemory::set_reclaimer`].
pub type Reclaimer = Arc<dyn Fn() -> bool + Send + Sync>;

/// Largest cached block the scrubber zeroes by writing (keeping its pages committed); larger
/// blocks are zeroed by releasing their pages.
pub const SCRUB_FILL_MAX: u64 = 16 << 20;

/// Statistics of one device's allocator, in the manner of `torch.cuda.memory_stats`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct MemoryStats {
    /// Capacity of the device.
    pub total: u64,
    /// Bytes consumed by live allocations (rounded to their slab class or page multiple;
    /// zero-byte allocations consume nothing).
    pub allocated: u64,
    /// Bytes requested by live allocations.
    pub requested: u64,
    /// Bytes taken from the capacity: allocated plus cached.
    pub reserved: u64,
    /// Bytes held in caches (`reserved - allocated`): cached large blocks, empty slab spans
    /// and the unused slots of partly used ones.
    pub cached: u64,
    /// Highest `allocated` since start or the last peak reset.
    pub peak_allocated: u64,
    /// Highest `reserved` since start or the last peak reset.
    pub peak_reserved: u64,
    /// Live allocations.
    pub active_allocations: u64,
    /// Allocations made so far.
    pub num_allocs: u64,
    /// Frees so far (blocks that went back to the allocator).
    pub num_frees: u64,
    /// Allocations served from a cache.
    pub cache_hits: u64,
    /// Times the caches were flushed to satisfy an allocation.
    pub cache_flushes: u64,
    /// Allocations refused for lack of memory.
    pub num_ooms: u64,
    /// Free blocks held for reuse: cached large blocks and empty slab spans.
    pub free_blocks: u64,
    /// Largest block that can be handed out now: the unreserved capacity in whole pages (free
    /// space is not carved from a shared range, so it does not fragment).
    pub largest_free_block: u64,
    /// Bytes not reserved (`total - reserved`).
    pub free: u64,
    /// External fragmentation of the free space: `1 - largest_free_block / free` (0 but for
    /// a capacity that is not a whole number of pages).
    pub fragmentation: f64,
}

/// Where an allocation's bytes are.
enum Place {
    /// A zero-byte allocation: no memory.
    Empty,
    /// A slot at this offset of the device's slab arena.
    Slab(u64),
    /// A large block: its own mapping.
    Large(Arena),
    /// A block a plugged allocator handed out (see [`allocator`]): a range of a buffer the
    /// core made, given back to that allocator when the allocation is freed.
    Plugged(allocator::Lease),
    /// Another process's block, mapped here (`ipc`); not part of the allocator.
    Imported(ipc::Imported),
    /// A block of the async pool handed out by `malloc_async` (see [`async_pool`]): a range of
    /// a buffer the core made, given back to the pool when the allocation is freed.
    Pooled(async_pool::PoolLease),
}

/// A block [`DeviceMemory::take_locked`] found for a request.
enum Take {
    /// A slab slot at this offset.
    Slab(u64),
    /// A cached large block; `true` when it was freed but not yet zeroed (the caller zeroes
    /// it outside the lock).
    Cached(Arena, bool),
    /// Capacity was claimed for a fresh large block; the caller maps it.
    Fresh,
}

struct PoolState {
    /// Span-sized blocks of the slab arena.
    spans: Buddy,
    slab: Slab,
    /// Zeroed large blocks ready for reuse, by block size.
    clean: HashMap<u64, Vec<Arena>>,
    /// Large blocks freed while reuse is on, waiting for the scrubber.
    dirty: Vec<Arena>,
    /// Bytes in `dirty`.
    dirty_bytes: u64,
    /// Bytes in `clean`.
    clean_bytes: u64,
    /// Bytes of the block the scrubber is zeroing (out of the lists, still cached).
    scrubbing: u64,
    /// Bytes of live large blocks, and of fresh ones being mapped.
    large_allocated: u64,
    requested: u64,
    active: u64,
    peak_allocated: u64,
    peak_reserved: u64,
    num_allocs: u64,
    num_frees: u64,
    cache_hits: u64,
    cache_flushes: u64,
    num_ooms: u64,
}

impl PoolState {
    fn allocated(&self) -> u64 {
        self.large_allocated + self.slab.allocated_bytes()
    }

    /// Bytes of cached large blocks.
    fn cached_large(&self) -> u64 {
        self.dirty_bytes + self.clean_bytes + self.scrubbing
    }

    fn reserved(&self) -> u64 {
        self.large_allocated + self.cached_large() + self.spans.used_bytes()
    }

    fn note_peaks(&mut self) {
        self.peak_allocated = self.peak_allocated.max(self.allocated());
        self.peak_reserved = self.peak_reserved.max(self.reserved());
    }
}

/// The memory of one virtual device.
pub struct DeviceMemory {
    device: usize,
    capacity: u64,
    /// Bytes this process may reserve: the capacity, or less under a memory fraction
    /// (`fraction` module).
    limit: AtomicU64,
    /// The mapping slab spans are carved from.
    slab_arena: Arena,
    closed: AtomicBool,
    fault_countdown: AtomicU64,
    /// The fork count when the memory was made: in a child process (after `fork()`) the
    /// parent's memory is abandoned, since a thread that vanished in the fork may hold its lock.
    forks: u64,
    state: Mutex<PoolState>,
    options: Arc<Options>,
    scrub: Scrubber,
    reclaimer: Mutex<Option<Reclaimer>>,
    /// The plugged allocator, the pool's limit and the frees waiting for streams.
    pool: pool::PoolExt,
    /// Stream-ordered allocation (`malloc_async`/`free_async`).
    async_pool: async_pool::AsyncPool,
}

impl std::fmt::Debug for DeviceMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceMemory(device {}, {} bytes, slab spans in {:?})",
            self.device, self.capacity, self.slab_arena
        )
    }
}

/// Wakes the background scrubber only when it sleeps; it polls while there is recent work.
#[derive(Default)]
struct Scrubber {
    /// Held while a block is out of the caches being zeroed.
    busy: Mutex<()>,
    started: AtomicBool,
    sleeping: AtomicBool,
    /// The scrubber's sleep: std's futex-based lock and condvar rather than parking_lot's,
    /// whose process-wide table a `fork()` can leave locked (the scrubber polls every
    /// millisecond while frees come in).
    lock: std::sync::Mutex<bool>,
    cv: std::sync::Condvar,
}

impl DeviceMemory {
    /// The memory of device `device` with `capacity` bytes: reserves the address space of its
    /// slab spans (large blocks are mapped when allocated).
    pub fn new(
        device: usize,
        capacity: u64,
        options: Arc<Options>,
    ) -> Result<DeviceMemory, crate::error::ConfigError> {
        let slab_space = capacity
            .checked_next_multiple_of(SLAB_SPAN)
            .unwrap_or(capacity)
            .max(SLAB_SPAN);
        let slab_arena = Arena::reserve(device, slab_space)?;
        Ok(DeviceMemory {
            device,
            capacity,
            limit: AtomicU64::new(capacity),
            slab_arena,
            closed: AtomicBool::new(false),
            fault_countdown: AtomicU64::new(0),
            forks: crate::generation::forks(),
            state: Mutex::new(PoolState {
                spans: Buddy::new(slab_space, SLAB_SPAN),
                slab: Slab::new(),
                clean: HashMap::new(),
                dirty: Vec::new(),
                dirty_bytes: 0,
                clean_bytes: 0,
                scrubbing: 0,
                large_allocated: 0,
                requested: 0,
                active: 0,
                peak_allocated: 0,
                peak_reserved: 0,
                num_allocs: 0,
                num_frees: 0,
                cache_hits: 0,
                cache_flushes: 0,
                num_ooms: 0,
            }),
            options,
            scrub: Scrubber::default(),
            reclaimer: Mutex::new(None),
            pool: pool::PoolExt::default(),
            async_pool: async_pool::AsyncPool::default(),
        })
    }

    /// Device index.
    pub fn device(&self) -> usize {
        self.device
    }

    /// Capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Refuse further allocations (the runtime was shut down). Live buffers stay valid.
    pub(crate) fn close(self: &Arc<Self>) {
        self.closed.store(true, Ordering::Release);
        pool::drop_deferred_frees(self);
        self.trim_async_pool_to(0);
        self.return_blocks();
    }

    /// Install the hook an allocation calls once before it fails with `OutOfMemory`, after
    /// flushing the caches: it waits for queued work that may still hold freed blocks (a
    /// buffer whose handles were dropped while a queued operation still uses it) and returns
    /// true if it waited, and the allocation is retried. It is called without any allocator
    /// lock held, on the allocating thread; it must return false at once where waiting could
    /// deadlock. Replaces any earlier hook.
    pub fn set_reclaimer(&self, reclaimer: Reclaimer) {
        *self.reclaimer.lock() = Some(reclaimer);
    }

    /// Fault injection for tests (cargo feature `testing`): the `nth` allocation from now
    /// (1 = the next one) fails with `OutOfMemory` as if the device were full; 0 disarms it.
    #[cfg(feature = "testing")]
    pub fn inject_alloc_failure(&self, nth: u64) {
        self.fault_countdown.store(nth, Ordering::SeqCst);
    }

    /// Whether an injected failure fires for this allocation.
    fn injected_failure(&self) -> bool {
        let mut n = self.fault_countdown.load(Ordering::Relaxed);
        while n > 0 {
            match self.fault_countdown.compare_exchange(
                n,
                n - 1,
                Ordering::SeqCst,
                Ordering::Relaxed,
            ) {
                Ok(_) => return n == 1,
                Err(cur) => n = cur,
            }
        }
        false
    }

    fn reuse(&self) -> bool {
        self.options.memory_reuse()
    }

    /// Allocate `size` zeroed bytes.
    ///
    /// Fails only when the request does not fit in the capacity: after the caches were
    /// flushed and the reclaimer ([`DeviceMemory::set_reclaimer`]) had its chance, `reserved +
    /// fresh_block_size(size)` exceeds the capacity, where `reserved` is then the live blocks
    /// and the partly used slab spans.
    ///
    /// # Errors
    /// `OutOfMemory` with requested, free, largest free block, fragmentation and total;
    /// `InvalidHandle` after shutdown.
    pub fn allocate(self: &Arc<Self>, size: u64) -> Result<Buffer> {
        if self.closed.load(Ordering::Acquire) {
            return Err(crate::error::DeviceError::InvalidHandle {
                what: format!("the memory of device {}", self.device),
                why: "the runtime was shut down".into(),
            }
            .into());
        }
        self.process_deferred_frees();
        let injected = self.injected_failure();
        if size == 0 && !injected {
            let id = self.commit_locked(&mut self.state.lock(), 0);
            return Ok(self.buffer(Place::Empty, 0, 0, id));
        }
        if let Some(b) = self.try_allocate(size, injected) {
            return Ok(b);
        }
        if !injected && self.release_async_free() {
            // Free blocks of the async pool went back to the allocator.
            if let Some(b) = self.try_allocate(size, false) {
                return Ok(b);
            }
        }
        if !injected {
            // Cloned out, so that the hook runs without the allocator's locks.
            let reclaimer = self.reclaimer.lock().clone();
            if reclaimer.is_some_and(|r| r()) {
                self.process_deferred_frees();
                if let Some(b) = self.try_allocate(size, false) {
                    return Ok(b);
                }
            }
        }
        let mut st = self.state.lock();
        st.num_ooms += 1;
        if let Some(e) = fraction::over_fraction_locked(self, &st, size) {
            return Err(e.into());
        }
        let stats = self.stats_locked(&st);
        Err(MemoryError::OutOfMemory {
            device: self.device,
            requested: size,
            free: stats.free,
            total: stats.total,
            largest_free: stats.largest_free_block,
            fragmentation: stats.fragmentation,
            allocated: stats.allocated,
            cached: stats.cached,
        }
        .into())
    }

    fn buffer(self: &Arc<Self>, place: Place, size: u64, block: u64, id: u64) -> Buffer {
        Buffer {
            alloc: Arc::new(Allocation {
                mem: self.clone(),
                place,
                size,
                block,
                id,
                recorded: Mutex::new(Vec::new()),
                export: std::sync::OnceLock::new(),
                tracker: access::Tracker::new(),
            }),
            offset: 0,
            len: size,
        }
    }

    /// One attempt at allocating `size` bytes (non-zero, or an injected failure): from the
    /// caches or fresh capacity, else after flushing the caches. `None` when it does not fit.
    fn try_allocate(self: &Arc<Self>, size: u64, injected: bool) -> Option<Buffer> {
        let block = block_size(size);
        // Unmapped after the lock is released (declared first, so dropped last).
        let mut flushed: Vec<Arena> = Vec::new();
        let mut st = self.state.lock();
        let mut taken = if injected {
            None
        } else {
            self.take_locked(&mut st, size, block)
        };
        if taken.is_none() {
            self.flush_caches_locked(&mut st, &mut flushed);
            st.cache_flushes += 1;
            if !injected {
                taken = self.take_locked(&mut st, size, block);
                if taken.is_none() && st.scrubbing > 0 {
                    // A block is being zeroed by the scrubber: wait for it (the scrubber holds
                    // `scrub.busy` while zeroing), then flush again.
                    drop(st);
                    drop(self.scrub.busy.lock());
                    st = self.state.lock();
                    self.flush_caches_locked(&mut st, &mut flushed);
                    taken = self.take_locked(&mut st, size, block);
                }
            }
        }
        let place = match taken? {
            Take::Slab(offset) => Place::Slab(offset),
            Take::Cached(arena, dirty) => {
                if dirty {
                    // Ours now and not visible to anyone else: zero it before handing it out,
                    // outside the lock.
                    drop(st);
                    if block <= SCRUB_FILL_MAX {
                        arena.zero(0, block);
                    } else {
                        arena.release(0, block);
                    }
                    st = self.state.lock();
                }
                Place::Large(arena)
            }
            Take::Fresh => {
                drop(st);
                let arena = Arena::map(block);
                st = self.state.lock();
                match arena {
                    Some(arena) => Place::Large(arena),
                    None => {
                        st.large_allocated -= block;
                        return None;
                    }
                }
            }
        };
        let id = self.commit_locked(&mut st, size);
        drop(st);
        Some(self.buffer(place, size, block, id))
    }

    /// Count an allocation of `size` bytes whose block is taken; returns its id.
    fn commit_locked(&self, st: &mut PoolState, size: u64) -> u64 {
        st.requested += size;
        st.active += 1;
        st.num_allocs += 1;
        st.note_peaks();
        if trace::enabled() {
            trace::push(trace::Record {
                name: format!("alloc {size} B"),
                device: self.device,
                stream: 0,
                ts_ns: now_ns(),
                phase: trace::Phase::Alloc {
                    bytes: size,
                    allocated: st.allocated(),
                },
            });
        }
        // The allocation's id is its number (from 1): no atomic counter on this path.
        st.num_allocs
    }

    /// Find a block for `size` (non-zero) bytes of block size `block`, or claim the capacity
    /// for a fresh one. `None` when neither a cache nor the unreserved capacity can serve it.
    /// The bytes allocations may reserve: the smaller of the per-process fraction
    /// (`fraction`) and the pool's limit (`pool`), never more than the capacity.
    pub fn limit(&self) -> u64 {
        self.fraction_limit().min(pool::pool_limit(self))
    }

    fn take_locked(&self, st: &mut PoolState, size: u64, block: u64) -> Option<Take> {
        let limit = self.limit();
        if size <= SLAB_MAX {
            loop {
                match st.slab.alloc(size) {
                    SlabAlloc::Ok(off) => return Some(Take::Slab(off)),
                    SlabAlloc::NeedSpan { class, span_size } => {
                        if st.reserved().saturating_add(span_size) > limit {
                            return None;
                        }
                        let span = st.spans.alloc_block(span_size)?;
                        st.slab.add_span(class, span);
                    }
                }
            }
        }
        if self.reuse() {
            if let Some(arena) = st.clean.get_mut(&block).and_then(Vec::pop) {
                st.clean_bytes -= block;
                st.cache_hits += 1;
                st.large_allocated += block;
                return Some(Take::Cached(arena, false));
            }
            // The scrubber is behind: reuse a dirty block of this size, zeroing it here
            // (`Arena::zero`: one `lseek` for a block nobody touched, and a fill of only the
            // pages that were touched), rather than map fresh memory. A fresh mapping costs a system call now
            // and a page fault per page at first touch, and which of the two an allocation got
            // depended on whether the scrubber had a core in time (1 MiB: 0.4-14 us between
            // runs of one benchmark).
            if let Some(i) = st.dirty.iter().rposition(|a| a.len() == block) {
                let arena = st.dirty.swap_remove(i);
                st.dirty_bytes -= block;
                st.cache_hits += 1;
                st.large_allocated += block;
                return Some(Take::Cached(arena, true));
            }
        }
        if st.reserved().saturating_add(block) > limit {
            return None;
        }
        st.large_allocated += block;
        Some(Take::Fresh)
    }

    /// Take every cached large block out of the caches (into `out`, to be unmapped once the
    /// lock is released) and release the empty slab spans, so `reserved` and RSS fall.
    fn flush_caches_locked(&self, st: &mut PoolState, out: &mut Vec<Arena>) {
        out.append(&mut st.dirty);
        st.dirty_bytes = 0;
        for (_, blocks) in st.clean.drain() {
            out.extend(blocks);
        }
        st.clean_bytes = 0;
        self.release_empty_spans_locked(st);
    }

    fn release_empty_spans_locked(&self, st: &mut PoolState) {
        for (off, size) in st.slab.take_empty_spans() {
            self.slab_arena.release(off, size);
            st.spans
                .free_block(off, size)
                .expect("slab span belongs to the span allocator");
        }
    }

    /// Release all cached blocks (`empty_cache`), including one the scrubber is zeroing now
    /// (waited for, so that afterwards nothing freed before the call is still cached).
    pub fn empty_cache(self: &Arc<Self>) {
        self.process_deferred_frees();
        self.return_blocks();
        let mut flushed = Vec::new();
        let _busy = self.scrub.busy.lock();
        let mut st = self.state.lock();
        self.flush_caches_locked(&mut st, &mut flushed);
        drop(st);
        drop(flushed);
    }

    fn free_allocation(self: &Arc<Self>, place: Place, size: u64, block: u64) {
        if self.forks != crate::generation::forks() {
            // The parent's memory, abandoned in this forked child (a thread that vanished in
            // the fork may hold its lock): leak the block.
            std::mem::forget(place);
            return;
        }
        match place {
            Place::Imported(mapping) => drop(mapping),
            Place::Empty => {
                let mut st = self.state.lock();
                self.uncommit_locked(&mut st, 0);
            }
            Place::Slab(offset) => {
                // Small: zero in place now so the slot is clean when it is handed out again.
                self.slab_arena.fill(offset, block, 0);
                let mut st = self.state.lock();
                st.slab.free(offset, size).expect("slab object freed once");
                self.uncommit_locked(&mut st, size);
                if !self.reuse() {
                    self.release_empty_spans_locked(&mut st);
                }
            }
            Place::Large(arena) => {
                let reuse = self.reuse();
                let arena = if reuse {
                    Some(arena)
                } else {
                    // Unmapped before the capacity is offered again.
                    drop(arena);
                    None
                };
                let mut st = self.state.lock();
                st.large_allocated -= block;
                self.uncommit_locked(&mut st, size);
                if let Some(arena) = arena {
                    st.dirty.push(arena);
                    st.dirty_bytes += block;
                    drop(st);
                    self.wake_scrubber();
                }
            }
            Place::Plugged(lease) => lease.give_back(),
            Place::Pooled(lease) => lease.give_back(),
        }
    }

    /// Count the free of an allocation of `size` bytes (the mirror of `commit_locked`).
    fn uncommit_locked(&self, st: &mut PoolState, size: u64) {
        st.requested -= size;
        st.active -= 1;
        st.num_frees += 1;
        self.trace_free(st, size);
    }

    fn trace_free(&self, st: &PoolState, size: u64) {
        if trace::enabled() {
            trace::push(trace::Record {
                name: format!("free {size} B"),
                device: self.device,
                stream: 0,
                ts_ns: now_ns(),
                phase: trace::Phase::Free {
                    bytes: size,
                    allocated: st.allocated(),
                },
            });
        }
    }

    fn wake_scrubber(self: &Arc<Self>) {
        if !self.scrub.started.swap(true, Ordering::AcqRel) {
            let weak = Arc::downgrade(self);
            let name = format!("runtime-scrub-{}", self.device);
            if crate::sync::spawn_thread(name, move || scrub_loop(weak)).is_err() {
                // No background thread: zero the dirty blocks here, and try to start the
                // scrubber again at the next free.
                self.scrub.started.store(false, Ordering::Release);
                while self.scrub_one() {}
            }
            return;
        }
        if self.scrub.sleeping.load(Ordering::Acquire) {
            let mut pending = self
                .scrub
                .lock
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            *pending = true;
            self.scrub.cv.notify_one();
        }
    }

    /// Zero one dirty block and move it to the clean cache. Returns false when none waits.
    ///
    /// Blocks up to [`SCRUB_FILL_MAX`] are zeroed in place, so their pages stay committed and
    /// reuse costs no page faults. Larger ones are released to the OS instead: filling would
    /// commit every page of the block, so a mostly untouched multi-GiB buffer would cost its
    /// full size in RAM after `device_free`. With reuse switched off meanwhile, the block is
    /// unmapped instead.
    fn scrub_one(&self) -> bool {
        let _busy = self.scrub.busy.lock();
        let arena = {
            let mut st = self.state.lock();
            let Some(arena) = st.dirty.pop() else {
                return false;
            };
            st.dirty_bytes -= arena.len();
            st.scrubbing = arena.len();
            arena
        };
        let size = arena.len();
        if !self.reuse() {
            drop(arena);
            self.state.lock().scrubbing = 0;
            return true;
        }
        if size <= SCRUB_FILL_MAX {
            arena.zero(0, size);
        } else {
            arena.release(0, size);
        }
        let mut st = self.state.lock();
        st.scrubbing = 0;
        st.clean_bytes += size;
        st.clean.entry(size).or_default().push(arena);
        true
    }

    /// Current statistics.
    pub fn stats(&self) -> MemoryStats {
        let st = self.state.lock();
        self.stats_locked(&st)
    }

    fn stats_locked(&self, st: &PoolState) -> MemoryStats {
        let total = self.capacity;
        let reserved = st.reserved();
        let allocated = st.allocated();
        let free = total.saturating_sub(reserved);
        let largest = free / PAGE * PAGE;
        let cached_blocks = st.dirty.len()
            + st.clean.values().map(Vec::len).sum::<usize>()
            + usize::from(st.scrubbing > 0)
            + st.slab.empty_span_count();
        MemoryStats {
            total,
            allocated,
            requested: st.requested,
            reserved,
            cached: reserved - allocated,
            peak_allocated: st.peak_allocated,
            peak_reserved: st.peak_reserved,
            active_allocations: st.active,
            num_allocs: st.num_allocs,
            num_frees: st.num_frees,
            cache_hits: st.cache_hits,
            cache_flushes: st.cache_flushes,
            num_ooms: st.num_ooms,
            free_blocks: cached_blocks as u64,
            largest_free_block: largest,
            free,
            fragmentation: if free == 0 {
                0.0
            } else {
                1.0 - largest as f64 / free as f64
            },
        }
    }

    /// Reset `peak_allocated` and `peak_reserved` to the current values.
    pub fn reset_peak_stats(&self) {
        let mut st = self.state.lock();
        st.peak_allocated = st.allocated();
        st.peak_reserved = st.reserved();
    }

    /// Plug `allocator` in (or, `None`, go back to the built-in pool) for the allocations
    /// made through [`DeviceMemory::malloc`] from now on. Live allocations keep the allocator
    /// that made them.
    pub fn set_allocator(&self, allocator: Option<Arc<dyn Allocator>>) {
        allocator::set_allocator(self, allocator)
    }

    /// The plugged allocator, if any.
    pub fn allocator(&self) -> Option<Arc<dyn Allocator>> {
        allocator::allocator(self)
    }

    /// Pass the blocks given back since the last call to their allocators' `free`, on this
    /// thread, with no runtime lock held; returns how many. A panicking `free` is contained
    /// (the panic hook reports it; the block is dropped). [`DeviceMemory::malloc`],
    /// `set_allocator`, `empty_cache` and shutdown call it; callers that want blocks back
    /// sooner (a pool's statistics, `device_free`) may too.
    pub fn return_blocks(&self) -> usize {
        allocator::return_blocks(self)
    }

    /// Allocate `size` zeroed bytes through the plugged allocator, or the built-in pool when
    /// none is plugged (or this thread is inside the plugged allocator already).
    ///
    /// # Errors
    /// The plugged allocator's error; `ArgError` (argument `allocator`) when the block it
    /// returned is not a live buffer of this device holding `size` bytes (the block is then
    /// given back to it); as [`DeviceMemory::allocate`] for the built-in pool.
    pub fn malloc(self: &Arc<Self>, size: u64) -> Result<Buffer> {
        allocator::malloc(self, size)
    }

    /// Limit this device's reserved bytes to `fraction` of its capacity (rounded down to a
    /// whole byte); 1.0 lifts the limit.
    ///
    /// # Errors
    /// `fraction` is not a number in `[0, 1]` (nothing changes).
    pub fn set_memory_fraction(&self, fraction: f64) -> Result<()> {
        fraction::set_memory_fraction(self, fraction)
    }

    /// The fraction of the capacity this process may reserve (1.0 unless limited).
    pub fn memory_fraction(&self) -> f64 {
        fraction::memory_fraction(self)
    }

    /// Bytes this process may reserve on the device under its fraction (see
    /// [`DeviceMemory::limit`] for the limit allocations obey).
    pub fn fraction_limit(&self) -> u64 {
        fraction::fraction_limit(self)
    }

    /// Limit the bytes the pool may reserve to `bytes` (`None` or `Some(0)`: no limit).
    /// Blocks already reserved stay; allocations that would pass the limit fail.
    ///
    /// # Errors
    /// `ArgError` when `bytes` exceeds the device's capacity (nothing changes).
    pub fn set_limit(&self, bytes: Option<u64>) -> Result<()> {
        pool::set_limit(self, bytes)
    }

    /// The limit set with [`DeviceMemory::set_limit`], 0 when none.
    pub fn get_limit(&self) -> u64 {
        pool::get_limit(self)
    }

    /// Free the parked blocks whose streams have completed the work they waited for; returns
    /// how many were freed.
    pub fn process_deferred_frees(self: &Arc<Self>) -> usize {
        pool::process_deferred_frees(self)
    }

    /// Blocks parked until their recorded streams complete.
    pub fn deferred_frees(&self) -> usize {
        pool::deferred_frees(self)
    }

    /// Map the buffer `handle` names (made by [`Buffer::ipc_handle`] in another process of
    /// the same user, or in this one) as a buffer of this device, zero-copy. Only the pages
    /// covering the exported block are mapped, and the buffer's bounds are exactly the block.
    ///
    /// A process never holds two allocations over the same memory: a handle this process
    /// exported opens as the exported allocation itself, and a block it has open already
    /// opens as that allocation (both on the device they belong to, which may differ from
    /// this one). So a copy between a buffer and "its alias" is a copy within one allocation.
    ///
    /// # Errors
    /// An argument error for bytes that are not a handle; `InvalidHandle` when the exporting
    /// process has exited, the buffer was freed, or the handle does not match the exporter's
    /// memory (forged or corrupted); `InvalidHandle` after shutdown.
    pub fn open_ipc_handle(self: &Arc<Self>, handle: &[u8]) -> Result<Buffer> {
        ipc::open_ipc_handle(self, handle)
    }
}

/// A std lock result, poisoning ignored (nothing the scrubber guards can be left half-done).
fn relock<T>(r: std::sync::LockResult<T>) -> T {
    r.unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn scrub_loop(mem: std::sync::Weak<DeviceMemory>) {
    // Poll every millisecond while frees keep coming; after 50 idle polls sleep until woken.
    let mut idle = 0u32;
    loop {
        let Some(m) = mem.upgrade() else { return };
        let mut did = false;
        while m.scrub_one() {
            did = true;
        }
        idle = if did { 0 } else { idle + 1 };
        if idle < 50 {
            let mut pending = relock(m.scrub.lock.lock());
            if !*pending {
                pending = relock(m.scrub.cv.wait_timeout(pending, Duration::from_millis(1))).0;
            }
            *pending = false;
        } else {
            m.scrub.sleeping.store(true, Ordering::Release);
            let mut pending = relock(m.scrub.lock.lock());
            // Re-check after announcing sleep, so a free that missed the flag is not lost.
            if !*pending && m.state.lock().dirty.is_empty() {
                // Bounded so the thread notices when the device memory goes away.
                pending = relock(m.scrub.cv.wait_timeout(pending, Duration::from_millis(200))).0;
            }
            *pending = false;
            m.scrub.sleeping.store(false, Ordering::Release);
            idle = 0;
        }
    }
}

/// Around `fork()` (see `runtime::install_fork_handlers`): hold the memory layer's
/// process-wide locks (the pinned cache, managed memory, the IPC tables, defer scopes, the
/// device memory file and the copy pool's start).
pub(crate) fn before_fork(wait: std::time::Duration) {
    pinned::before_fork(wait);
    managed::before_fork(wait);
    ipc::before_fork(wait);
    defer::before_fork(wait);
    host::before_fork(wait);
}

/// After `fork()`, in the parent or the child: release what [`before_fork`] took.
pub(crate) fn after_fork(child: bool) {
    host::after_fork(child);
    defer::after_fork(child);
    ipc::after_fork(child);
    managed::after_fork(child);
    pinned::after_fork(child);
}

/// After `fork()`, in the child: the copy helpers are made afresh on next use.
pub(crate) fn after_fork_in_child() {
    host::after_fork_in_child();
}

/// The device-memory mapping of this process (any device's slab arena or large block, live
/// or cached for reuse, or an imported block) that overlaps `[start, start + len)`, as
/// `(base, length)`; `None` when the range touches no device memory. For callers that
/// receive raw addresses (the ACL C ABI): an address inside device memory that no live
/// allocation of theirs covers is a stale or bogus device pointer, not host memory.
pub fn device_mapping_overlapping(start: usize, len: usize) -> Option<(usize, usize)> {
    host::mapping_overlapping(start, len)
}

/// One allocation; returns its block to the allocator when dropped (or, once streams were
/// recorded on it with [`Buffer::record_stream`], when the work queued on them at that point
/// has completed).
pub(crate) struct Allocation {
    mem: Arc<DeviceMemory>,
    place: Place,
    size: u64,
    block: u64,
    id: u64,
    /// Streams recorded with [`Buffer::record_stream`].
    recorded: Mutex<Vec<Arc<dyn StreamFence>>>,
    /// Its export-table slot once shared with other processes (`ipc`); cleared when freed.
    export: std::sync::OnceLock<ipc::Export>,
    /// The work pending on its memory and the lock that orders host access (`access`).
    tracker: Arc<access::Tracker>,
}

impl Allocation {
    /// The mapping the allocation's bytes are in, and the offset of byte 0 in it. A zero-byte
    /// allocation points at the start of the slab mapping (a valid address, never accessed:
    /// every range of it is empty).
    fn at(&self) -> (&Arena, u64) {
        match &self.place {
            Place::Large(arena) => (arena, 0),
            Place::Slab(offset) => (&self.mem.slab_arena, *offset),
            Place::Empty => (&self.mem.slab_arena, 0),
            Place::Plugged(lease) => lease.at(),
            Place::Pooled(lease) => lease.at(),
            Place::Imported(mapping) => mapping.at(),
        }
    }

    /// What byte 0 of the allocation *is*: the device memory file it lives in (its nonce) and
    /// the offset in that file; `(0, 0)` for a zero-byte allocation. Two mappings of one
    /// block (an imported buffer, a plugged allocator's block) give the same answer.
    fn memory(&self) -> (u64, u64) {
        match &self.place {
            Place::Empty => (0, 0),
            Place::Imported(imported) => imported.memory(),
            _ => {
                let (arena, base) = self.at();
                match arena.file_range() {
                    Some((file, offset)) => (file.nonce(), offset + base),
                    // Not reached: only imported arenas lack a file range of ours.
                    None => (0, arena.ptr(base) as u64),
                }
            }
        }
    }
}

/// Where a range of device memory is: the device memory file (its nonce) and byte offsets in
/// it. Overlap is decided on this, never on addresses, so two mappings of the same memory
/// (another process's block imported here) are seen as the same bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MemorySpan {
    /// The file: 0 for zero-byte ranges, which overlap nothing.
    pub file: u64,
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
}

impl MemorySpan {
    /// Whether the two ranges share a byte.
    pub fn overlaps(&self, other: &MemorySpan) -> bool {
        self.file == other.file
            && self.file != 0
            && self.start < other.end
            && other.start < self.end
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        // Refuse new imports before the block can be handed out again.
        let exported = self.export.take().is_some();
        let place = std::mem::replace(&mut self.place, Place::Empty);
        if exported && self.mem.closed.load(Ordering::Acquire) {
            // Freed after shutdown (the process is usually exiting): other processes may still
            // map the block, so its content stays (`ipc`); nothing is reused any more.
            ipc::keep_after_shutdown(&self.mem, place);
            return;
        }
        let recorded = std::mem::take(self.recorded.get_mut());
        if recorded.is_empty() {
            self.mem.free_allocation(place, self.size, self.block);
        } else {
            pool::defer_free(&self.mem, place, self.size, self.block, recorded);
        }
    }
}

/// A reference-counted handle to a range of one allocation of device memory: the whole
/// allocation as [`DeviceMemory::allocate`] returns it, or a view ([`Buffer::view`],
/// [`Buffer::shifted`]). Clones and views share the allocation; its memory returns to the
/// allocator when the last of them is dropped. Every range a method takes is relative to the
/// view and checked against it.
#[derive(Clone)]
pub struct Buffer {
    alloc: Arc<Allocation>,
    /// Start of the view in the allocation.
    offset: u64,
    /// Bytes of the view.
    len: u64,
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Buffer#{}(device {}, {} bytes",
            self.alloc.id,
            self.device(),
            self.len
        )?;
        if self.offset != 0 || self.len != self.alloc.size {
            write!(f, " at offset {} of {}", self.offset, self.alloc.size)?;
        }
        write!(f, ")")
    }
}

impl PartialEq for Buffer {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.alloc, &other.alloc)
            && self.offset == other.offset
            && self.len == other.len
    }
}

impl Buffer {
    /// Size in bytes of this buffer (the requested size, or the view's length).
    pub fn size(&self) -> u64 {
        self.len
    }

    /// Start of this view in its allocation (0 for a whole allocation).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Size in bytes of the whole allocation this buffer is a view of.
    pub fn allocation_size(&self) -> u64 {
        self.alloc.size
    }

    /// Unique id (per device) of the allocation; views share it.
    pub fn id(&self) -> u64 {
        self.alloc.id
    }

    /// Device index.
    pub fn device(&self) -> usize {
        self.alloc.mem.device
    }

    /// Address of the buffer in its device's address space, which is the host's (a large
    /// block has its own mapping): live allocations of a device never overlap.
    pub fn device_offset(&self) -> u64 {
        self.as_ptr() as u64
    }

    /// The device memory this buffer lives in.
    pub fn memory(&self) -> &Arc<DeviceMemory> {
        &self.alloc.mem
    }

    /// Where byte 0 of this view is: its allocation's mapping and the offset in it.
    fn at(&self) -> (&Arena, u64) {
        let (arena, base) = self.alloc.at();
        (arena, base + self.offset)
    }

    /// Host address of byte 0 (the device is host-backed). Valid while this buffer lives.
    pub fn as_ptr(&self) -> *mut u8 {
        let (arena, base) = self.at();
        arena.ptr(base)
    }

    /// Number of live clones of this handle and its views (and of queued operations').
    pub fn ref_count(&self) -> usize {
        Arc::strong_count(&self.alloc)
    }

    /// Whether two buffers are views of the same allocation.
    pub fn same_allocation(&self, other: &Buffer) -> bool {
        Arc::ptr_eq(&self.alloc, &other.alloc)
    }

    /// The memory `count` bytes at `offset` of this view occupy (see [`MemorySpan`]); the
    /// range is not checked (it is for overlap questions only).
    pub fn memory_span(&self, offset: u64, count: u64) -> MemorySpan {
        if count == 0 || self.alloc.size == 0 {
            return MemorySpan {
                file: 0,
                start: 0,
                end: 0,
            };
        }
        let (file, base) = self.alloc.memory();
        let start = base + self.offset + offset;
        MemorySpan {
            file,
            start,
            end: start.saturating_add(count),
        }
    }

    /// Whether `[offset, offset + count)` of this view and `[other_offset, other_offset +
    /// other_count)` of `other` share a byte of memory (whatever addresses they are mapped at).
    pub fn overlaps(
        &self,
        offset: u64,
        count: u64,
        other: &Buffer,
        other_offset: u64,
        other_count: u64,
    ) -> bool {
        self.memory_span(offset, count)
            .overlaps(&other.memory_span(other_offset, other_count))
    }

    /// A view of `len` bytes at `offset` of this buffer, sharing (and keeping alive) its
    /// allocation.
    ///
    /// # Errors
    /// `OutOfBounds` when `[offset, offset + len)` is not inside this buffer; `InvalidHandle`
    /// after shutdown.
    pub fn view(&self, offset: u64, len: u64) -> Result<Buffer> {
        self.check_range("offset", offset, len)?;
        Ok(Buffer {
            alloc: self.alloc.clone(),
            offset: self.offset + offset,
            len,
        })
    }

    /// Pointer arithmetic: the view that starts `delta` bytes after (or, negative, before)
    /// this one and ends where this one ends. It may reach back before this view, but never
    /// outside the allocation.
    ///
    /// # Errors
    /// `ArgError` (argument `offset`) when the new start is before the allocation or after
    /// this view's end; `InvalidHandle` after shutdown.
    pub fn shifted(&self, delta: i64) -> Result<Buffer> {
        self.check()?;
        let end = self.offset + self.len;
        let start = i128::from(self.offset) + i128::from(delta);
        if start < 0 || start > i128::from(end) {
            return Err(crate::error::ArgError::new(
                "offset",
                format!(
                    "moving {delta} bytes from offset {} leaves the view [0, {end}] of {self:?}: pointer arithmetic stays inside the allocation",
                    self.offset
                ),
            )
            .into());
        }
        let start = start as u64;
        Ok(Buffer {
            alloc: self.alloc.clone(),
            offset: start,
            len: end - start,
        })
    }

    /// Torch's `record_stream`: when the allocation is freed (its last handle dropped), its
    /// block is not reused until the work queued on `stream` at that moment has completed.
    /// Recording the same stream twice records it once.
    ///
    /// # Errors
    /// `InvalidHandle` for a buffer of a shut-down runtime, or a destroyed stream.
    pub fn record_stream(&self, stream: Arc<dyn StreamFence>) -> Result<()> {
        self.check()?;
        stream.check()?;
        let mut rec = self.alloc.recorded.lock();
        if !rec.iter().any(|s| s.fence_id() == stream.fence_id()) {
            rec.push(stream);
        }
        Ok(())
    }

    /// Fails with `InvalidHandle` once the runtime the buffer was allocated under has been
    /// shut down (its memory stays mapped while the buffer lives, but is no longer usable),
    /// and in a process forked after the allocation.
    pub fn check(&self) -> Result<()> {
        let why = if self.alloc.mem.forks != crate::generation::forks() {
            "it belongs to the runtime of the parent process (fork)"
        } else if self.alloc.mem.closed.load(Ordering::Acquire) {
            "the runtime was shut down since it was allocated"
        } else {
            return Ok(());
        };
        Err(crate::error::DeviceError::InvalidHandle {
            what: format!(
                "DeviceBuffer#{} (device {}, {} bytes)",
                self.alloc.id,
                self.device(),
                self.len
            ),
            why: why.into(),
        }
        .into())
    }

    /// Check that the buffer is live ([`Buffer::check`]) and that `[offset, offset + count)`
    /// lies inside it, overflow included.
    pub fn check_range(&self, arg: &'static str, offset: u64, count: u64) -> Result<()> {
        self.check()?;
        match offset.checked_add(count) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(MemoryError::OutOfBounds {
                arg,
                offset,
                count,
                size: self.len,
                what: "device buffer",
            }
            .into()),
        }
    }

    /// The access set of this buffer alone.
    pub fn access(&self, access: access::Access) -> access::AccessSet {
        access::AccessSet::new([(self, access)])
    }

    /// Whether the calling thread may use this buffer's allocation as `access` says without
    /// taking its lock ([`access::holds`]): how a launch's op checks each of its tensors as
    /// it runs, without making an access set of them.
    pub(crate) fn held_here(&self, access: access::Access, launch: u64) -> bool {
        access::holds(&self.alloc.tracker, access, launch)
    }

    /// This allocation's tracker, for host memory that is a view of it (the Python package's
    /// numpy views of a `DeviceBuffer`): a copy through that view names it
    /// (`stream::copy::HostMemory::tracker`), so it takes turns with the buffer's own ops.
    pub fn host_tracker(&self) -> access::HostTracker {
        access::HostTracker::of(&self.alloc.tracker)
    }

    /// Copy `src` into the buffer at `offset`. Ordered by the executor: waits for the stream
    /// work queued on this allocation (its last writer and its readers) and holds the
    /// allocation's lock for the copy, so no queued op or other thread touches the bytes
    /// meanwhile (see [`access`]). From an op that holds the allocation it writes at once.
    ///
    /// # Errors
    /// `OutOfBounds`; `InvalidHandle` after shutdown; `NotPermitted` when waiting for the
    /// pending work would need the runtime thread making the call (see [`access`]).
    pub fn write(&self, offset: u64, src: &[u8]) -> Result<()> {
        self.check_range("offset", offset, src.len() as u64)?;
        self.access(access::Access::Write).host(|| {
            let (arena, base) = self.at();
            arena.write(base + offset, src);
        })
    }

    /// Copy buffer bytes at `offset` into `dst`. Ordered by the executor: waits for the last
    /// writer queued on this allocation and holds its lock (shared) for the copy.
    ///
    /// # Errors
    /// As [`Buffer::write`].
    pub fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        self.check_range("offset", offset, dst.len() as u64)?;
        self.access(access::Access::Read).host(|| {
            let (arena, base) = self.at();
            arena.read(base + offset, dst);
        })
    }

    /// The buffer's bytes at `offset` as `count` elements of `T`, read as [`Buffer::read`]
    /// reads.
    ///
    /// # Errors
    /// As [`Buffer::read`].
    pub fn to_vec<T: Element + Default>(&self, offset: u64, count: usize) -> Result<Vec<T>> {
        let mut out = vec![T::default(); count];
        self.read(offset, T::as_bytes_mut(&mut out))?;
        Ok(out)
    }

    /// Copy `count` bytes from `src` at `src_off` to `self` at `dst_off` (any devices; the
    /// ranges may overlap when both are views of one allocation: moved as by `memmove`).
    /// Ordered by the executor as [`Buffer::write`] (for `self`) and [`Buffer::read`] (for
    /// `src`).
    ///
    /// # Errors
    /// As [`Buffer::write`].
    pub fn copy_from(&self, dst_off: u64, src: &Buffer, src_off: u64, count: u64) -> Result<()> {
        self.check_range("dst_offset", dst_off, count)?;
        src.check_range("src_offset", src_off, count)?;
        access::AccessSet::new([(self, access::Access::Write), (src, access::Access::Read)])
            .host(|| self.copy_held(dst_off, src, src_off, count))
    }

    /// The copy of [`Buffer::copy_from`], its locks held. Within one allocation the mapping
    /// is one, so the arena's own overlap test (by address) is right; two allocations that
    /// are the same memory under two mappings are copied through a staging buffer (their
    /// addresses say nothing about how the bytes overlap). A process holds no such pair
    /// (`ipc`), so that path is a guard.
    fn copy_held(&self, dst_off: u64, src: &Buffer, src_off: u64, count: u64) {
        let ((dst_arena, dst_base), (src_arena, src_base)) = (self.at(), src.at());
        if !self.same_allocation(src) && self.overlaps(dst_off, count, src, src_off, count) {
            let mut staged = vec![0u8; count as usize];
            src_arena.read(src_base + src_off, &mut staged);
            dst_arena.write(dst_base + dst_off, &staged);
        } else {
            dst_arena.copy_from(dst_base + dst_off, src_arena, src_base + src_off, count);
        }
    }

    /// Make the buffer's bytes read zero as the scrubber zeroes cached blocks (writing the
    /// resident pages up to [`SCRUB_FILL_MAX`] bytes, giving the pages back above), ordered as
    /// [`Buffer::write`]: a reused block of the async pool (`async_pool`).
    pub(crate) fn scrub(&self) -> Result<()> {
        self.check()?;
        self.access(access::Access::Write).host(|| {
            let (arena, base) = self.at();
            if self.len <= SCRUB_FILL_MAX {
                arena.zero(base, self.len);
            } else {
                arena.release(base, self.len);
            }
        })
    }

    /// Fill `count` bytes at `offset` with `byte`, ordered as [`Buffer::write`].
    ///
    /// # Errors
    /// As [`Buffer::write`].
    pub fn fill(&self, offset: u64, count: u64, byte: u8) -> Result<()> {
        self.check_range("offset", offset, count)?;
        self.access(access::Access::Write).host(|| {
            let (arena, base) = self.at();
            arena.fill(base + offset, count, byte);
        })
    }

    /// Copy from raw host memory, without waiting for queued work or taking the
    /// allocation's lock.
    ///
    /// # Safety
    /// `src` valid for `len` reads and not overlapping this buffer; no other access to the
    /// range runs meanwhile (the caller runs as an op whose [`access::AccessSet`] holds this
    /// allocation, or orders the access itself).
    pub unsafe fn write_raw_unsynchronized(
        &self,
        offset: u64,
        src: *const u8,
        len: usize,
    ) -> Result<()> {
        self.check_range("offset", offset, len as u64)?;
        let (arena, base) = self.at();
        // SAFETY: range checked above; the caller vouches for `src` and for exclusivity.
        unsafe { arena.write_raw(base + offset, src, len) };
        Ok(())
    }

    /// Copy to raw host memory, without waiting for queued work or taking the allocation's
    /// lock.
    ///
    /// # Safety
    /// `dst` valid for `len` writes and not overlapping this buffer; nothing writes the
    /// range meanwhile (as for [`Buffer::write_raw_unsynchronized`]).
    pub unsafe fn read_raw_unsynchronized(
        &self,
        offset: u64,
        dst: *mut u8,
        len: usize,
    ) -> Result<()> {
        self.check_range("offset", offset, len as u64)?;
        let (arena, base) = self.at();
        // SAFETY: range checked above; the caller vouches for `dst` and for exclusivity.
        unsafe { arena.read_raw(base + offset, dst, len) };
        Ok(())
    }

    /// Check that a typed view of `count` elements of `T` at byte `offset` lies inside this
    /// allocation and is aligned for `T`, and return its byte length.
    fn view_range<T: Element>(&self, offset: u64, count: usize) -> u64 {
        let bytes = count
            .checked_mul(size_of::<T>())
            .and_then(|b| u64::try_from(b).ok());
        let inside = bytes.is_some_and(|b| offset.checked_add(b).is_some_and(|e| e <= self.len));
        assert!(
            inside,
            "typed view of {count} x {} bytes at offset {offset} outside {:?}",
            size_of::<T>(),
            self
        );
        let addr = self.as_ptr() as usize + offset as usize;
        assert!(
            addr.is_multiple_of(align_of::<T>()),
            "typed view at offset {offset} of {self:?} is not aligned to {} bytes",
            align_of::<T>()
        );
        bytes.unwrap_or(0)
    }

    /// Typed shared view of `count` elements at byte `offset`, outside the executor's order.
    ///
    /// # Panics
    /// When the range is not inside this allocation or not aligned for `T` (checked in every
    /// build).
    ///
    /// # Safety
    /// No exclusive reference to any byte of the range may exist while the slice lives, and
    /// nothing may write those bytes meanwhile (another stream, a host view, a copy): the
    /// caller holds the allocation for reading (an op whose [`access::AccessSet`] names it)
    /// or orders its accesses with streams and events.
    pub unsafe fn slice_unsynchronized<T: Element>(&self, offset: u64, count: usize) -> &[T] {
        let bytes = self.view_range::<T>(offset, count);
        let (arena, base) = self.at();
        // SAFETY: the range is inside this live allocation and aligned (checked above); `T`
        // is valid for every bit pattern (`Element`); the caller guarantees no aliasing write.
        unsafe { arena.slice(base + offset, bytes, count) }
    }

    /// Typed exclusive view of `count` elements at byte `offset`, outside the executor's
    /// order.
    ///
    /// # Panics
    /// As for [`Buffer::slice_unsynchronized`].
    ///
    /// # Safety
    /// No other reference to any byte of the range may exist while the slice lives, and
    /// nothing else may read or write those bytes meanwhile (the caller holds the allocation
    /// for writing, or orders its accesses with streams and events).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut_unsynchronized<T: Element>(
        &self,
        offset: u64,
        count: usize,
    ) -> &mut [T] {
        let bytes = self.view_range::<T>(offset, count);
        let (arena, base) = self.at();
        // SAFETY: as for `slice`, and the caller guarantees exclusivity.
        unsafe { arena.slice_mut(base + offset, bytes, count) }
    }

    /// A handle another process (or this one) opens with [`DeviceMemory::open_ipc_handle`]
    /// to map this buffer's memory zero-copy. Repeated calls return the same handle; a handle
    /// of an imported buffer is the one it was opened from.
    ///
    /// # Errors
    /// `InvalidHandle` for a buffer of a shut-down runtime or of the parent process (fork);
    /// an argument error for a zero-byte buffer, or when [`ipc::MAX_EXPORTS`] buffers are exported
    /// at once.
    pub fn ipc_handle(&self) -> Result<Vec<u8>> {
        ipc::ipc_handle(self)
    }

    /// Whether this buffer maps another process's memory ([`DeviceMemory::open_ipc_handle`]).
    pub fn is_imported(&self) -> bool {
        ipc::is_imported(self)
    }
}
