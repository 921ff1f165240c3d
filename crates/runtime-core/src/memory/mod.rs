//! Device memory: the allocator of one virtual device and the reference-counted buffers it
//! hands out.
//!
//! * `buddy` (crate-private): power-of-two blocks over the device's address space (large
//!   allocations, and the spans the slab carves up). Offsets only; no `unsafe`.
//! * `slab` (crate-private): size classes up to [`SMALL_MAX`] carved from buddy spans. No
//!   `unsafe`.
//! * `host` (crate-private): the reserved, lazily committed mapping behind a device; raw
//!   copies and typed views, every range checked against the mapping.
//!
//! The public API is [`DeviceMemory`] (one device's allocator), [`Buffer`] (a reference to
//! one allocation) and its methods, which check every range against the allocation, never
//! against the device: no safe call can reach outside a live allocation. The allocators and
//! the mapping are not reachable from outside the crate:
//!
//! ```compile_fail
//! use runtime_core::memory::host::Arena;
//! ```
//!
//! Invariants:
//! * Every byte the allocator hands out reads as zero. Free space in the buddy is zero
//!   (untouched pages, or pages released with `MADV_DONTNEED`); free slab slots are zeroed when
//!   freed (they are small); cached large blocks are zeroed by a background scrubber thread
//!   before they are reused, so zeroing stays off the allocating caller's path (blocks over
//!   [`SCRUB_FILL_MAX`] are released rather than filled, so RAM follows what was touched).
//! * A [`Buffer`] holds an `Arc` to its allocation; views, DLPack capsules and queued stream
//!   operations hold clones. The block returns to the allocator when the last one drops, and
//!   the mapping itself lives until the last allocation is gone, even after `shutdown`.
//! * `reserved` is everything taken from the buddy (live blocks, cached blocks, slab spans);
//!   `allocated` is what live buffers consume; `cached = reserved - allocated`.

pub(crate) mod buddy;
pub(crate) mod host;
pub(crate) mod slab;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::clock::now_ns;
use crate::config::Options;
use crate::error::{MemoryError, Result};
use crate::trace;
use buddy::Buddy;
use host::{Arena, PAGE};
use slab::{Slab, SlabAlloc, SLAB_MAX};

/// Largest request served from the slab's size classes; larger ones get page-multiple blocks.
pub const SMALL_MAX: u64 = SLAB_MAX;

/// Bytes the allocator consumes for a request of `size` bytes: its slab class, or its size
/// rounded up to whole pages.
pub fn block_size(size: u64) -> u64 {
    match slab::class_of(size) {
        Some(c) => slab::class_size(c),
        None => size.checked_next_multiple_of(PAGE).unwrap_or(u64::MAX),
    }
}

/// The smallest free block of the device's address space a request of `size` bytes needs
/// when no cached block or partly used slab span can serve it: a slab span for small
/// requests, the power-of-two block an exact allocation is carved from for large ones.
pub fn fresh_block_size(size: u64) -> u64 {
    match slab::class_of(size) {
        Some(c) => slab::span_size(c),
        None => block_size(size)
            .checked_next_power_of_two()
            .unwrap_or(u64::MAX),
    }
}

/// Element types a typed view of device memory may have: plain numbers, valid for every bit
/// pattern and without padding. Sealed: the list is the crate's.
pub trait Element: Copy + Send + Sync + 'static + sealed::Sealed {}

mod sealed {
    pub trait Sealed {}
}

macro_rules! elements {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {}
    )*};
}
elements!(u8, i8, u16, i16, u32, i32, u64, i64, f32, f64);

/// Largest cached block the scrubber zeroes by writing (keeping its pages committed); larger
/// blocks are zeroed by releasing their pages.
pub const SCRUB_FILL_MAX: u64 = 16 << 20;

/// Bytes of freed, not yet zeroed blocks above which an allocation reuses (and zeroes) one
/// itself instead of taking fresh memory.
const DIRTY_BACKLOG: u64 = 64 << 20;

/// Statistics of one device's allocator, in the manner of `torch.cuda.memory_stats`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct MemoryStats {
    /// Capacity of the device.
    pub total: u64,
    /// Bytes consumed by live allocations (rounded to their slab class or page multiple).
    pub allocated: u64,
    /// Bytes requested by live allocations.
    pub requested: u64,
    /// Bytes taken from the device's address space: allocated plus cached.
    pub reserved: u64,
    /// Bytes held in caches (`reserved - allocated`).
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
    /// Free blocks in the buddy allocator.
    pub free_blocks: u64,
    /// Largest block that can be handed out now.
    pub largest_free_block: u64,
    /// Bytes not reserved (`total - reserved`).
    pub free: u64,
    /// External fragmentation of the free space: `1 - largest_free_block / free`.
    pub fragmentation: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Slab,
    Large,
}

struct PoolState {
    buddy: Buddy,
    slab: Slab,
    /// Zeroed large blocks ready for reuse, by block size.
    clean: HashMap<u64, Vec<u64>>,
    /// Large blocks freed while reuse is on, waiting for the scrubber.
    dirty: Vec<(u64, u64)>,
    /// Bytes in `clean` and `dirty` and being scrubbed.
    cached_large: u64,
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

    fn note_peaks(&mut self) {
        self.peak_allocated = self.peak_allocated.max(self.allocated());
        self.peak_reserved = self.peak_reserved.max(self.buddy.used_bytes());
    }
}

/// Address space reserved for a device of `capacity` bytes: twice the next power of two (up
/// to 256 GiB of capacity), so that the buddy allocator's power-of-two blocks and alignment
/// almost never make an allocation fail while capacity is left. Only `capacity` bytes may be
/// reserved at once; the rest is untouched address space that costs nothing.
fn address_space(capacity: u64) -> u64 {
    let p = capacity.next_power_of_two();
    if p <= 256 << 30 {
        p * 2
    } else {
        p
    }
}

/// The memory of one virtual device.
pub struct DeviceMemory {
    device: usize,
    capacity: u64,
    arena: Arena,
    closed: AtomicBool,
    fault_countdown: AtomicU64,
    /// The fork count when the memory was made: in a child process (after `fork()`) the
    /// parent's memory is abandoned, since a thread that vanished in the fork may hold its lock.
    forks: u64,
    state: Mutex<PoolState>,
    options: Arc<Options>,
    scrub: Scrubber,
}

impl std::fmt::Debug for DeviceMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceMemory(device {}, {:?})", self.device, self.arena)
    }
}

/// Wakes the background scrubber only when it sleeps; it polls while there is recent work.
#[derive(Default)]
struct Scrubber {
    /// Held while a block is out of the caches being zeroed.
    busy: Mutex<()>,
    started: AtomicBool,
    sleeping: AtomicBool,
    lock: Mutex<bool>,
    cv: Condvar,
}

impl DeviceMemory {
    /// Reserve the address space of device `device` with `capacity` bytes.
    pub fn new(
        device: usize,
        capacity: u64,
        options: Arc<Options>,
    ) -> Result<DeviceMemory, crate::error::ConfigError> {
        let space = address_space(capacity);
        let arena = Arena::reserve(device, space)?;
        Ok(DeviceMemory {
            device,
            capacity,
            arena,
            closed: AtomicBool::new(false),
            fault_countdown: AtomicU64::new(0),
            forks: crate::generation::forks(),
            state: Mutex::new(PoolState {
                buddy: Buddy::new(space, PAGE),
                slab: Slab::new(),
                clean: HashMap::new(),
                dirty: Vec::new(),
                cached_large: 0,
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
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// Fault injection for tests: the `nth` allocation from now (1 = the next one) fails
    /// with `OutOfMemory` as if the device were full; 0 disarms it.
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
    /// # Errors
    /// `OutOfMemory` with requested, free, largest free block, fragmentation and total.
    pub fn allocate(self: &Arc<Self>, size: u64) -> Result<Buffer> {
        if self.closed.load(Ordering::Acquire) {
            return Err(crate::error::DeviceError::InvalidHandle {
                what: format!("the memory of device {}", self.device),
                why: "the runtime was shut down".into(),
            }
            .into());
        }
        let injected = self.injected_failure();
        let (offset, block, kind, dirty, id) = {
            let mut st = self.state.lock();
            let r = if injected {
                None
            } else {
                self.alloc_locked(&mut st, size)
            };
            let r = match r {
                Some(r) => Some(r),
                None => {
                    self.flush_caches_locked(&mut st);
                    st.cache_flushes += 1;
                    match (!injected)
                        .then(|| self.alloc_locked(&mut st, size))
                        .flatten()
                    {
                        Some(r) => Some(r),
                        None if st.cached_large > 0 && !injected => {
                            // A block is being zeroed by the scrubber: wait for it (the
                            // scrubber holds `scrub.busy` while zeroing), then flush again.
                            drop(st);
                            drop(self.scrub.busy.lock());
                            st = self.state.lock();
                            self.flush_caches_locked(&mut st);
                            self.alloc_locked(&mut st, size)
                        }
                        None => None,
                    }
                }
            };
            let Some(r) = r else {
                st.num_ooms += 1;
                let stats = self.stats_locked(&st);
                return Err(MemoryError::OutOfMemory {
                    device: self.device,
                    requested: size,
                    free: stats.free,
                    total: stats.total,
                    largest_free: stats.largest_free_block,
                    fragmentation: stats.fragmentation,
                    allocated: stats.allocated,
                    cached: stats.cached,
                }
                .into());
            };
            st.requested += size;
            st.active += 1;
            st.num_allocs += 1;
            // The allocation's id is its number (from 1): no atomic counter on this path.
            let id = st.num_allocs;
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
            let (offset, block, kind, dirty) = r;
            (offset, block, kind, dirty, id)
        };
        if dirty {
            // Ours now and not visible to anyone else: zero it before handing it out.
            if block <= SCRUB_FILL_MAX {
                self.arena.zero(offset, block);
            } else {
                self.arena.release(offset, block);
            }
        }
        Ok(Buffer(Arc::new(Allocation {
            mem: self.clone(),
            offset,
            size,
            block,
            kind,
            id,
        })))
    }

    /// Take a block for `size` bytes: `(offset, block size, kind, dirty)`. A dirty block (a
    /// freed block the scrubber has not reached yet, taken so that a tight allocate/free loop
    /// reuses memory instead of growing) must be zeroed by the caller, outside the lock.
    fn alloc_locked(&self, st: &mut PoolState, size: u64) -> Option<(u64, u64, Kind, bool)> {
        if size <= SLAB_MAX {
            loop {
                match st.slab.alloc(size) {
                    SlabAlloc::Ok(off) => {
                        let class = slab::class_size(slab::class_of(size)?);
                        return Some((off, class, Kind::Slab, false));
                    }
                    SlabAlloc::NeedSpan { class, span_size } => {
                        if st.buddy.used_bytes() + span_size > self.capacity {
                            return None;
                        }
                        let span = st.buddy.alloc_block(span_size)?;
                        st.slab.add_span(class, span);
                    }
                }
            }
        }
        let block = st.buddy.rounded_size(size);
        if self.reuse() {
            if let Some(off) = st.clean.get_mut(&block).and_then(Vec::pop) {
                st.cached_large -= block;
                st.cache_hits += 1;
                st.large_allocated += block;
                return Some((off, block, Kind::Large, false));
            }
            // Prefer fresh (untouched, free to zero) memory while the scrubber's backlog is
            // small; reuse a dirty block, zeroing it here, once the backlog passes
            // `DIRTY_BACKLOG` or the device is full, so a tight loop stays bounded.
            let backlog: u64 = st.dirty.iter().map(|&(_, b)| b).sum();
            let fresh_fits = st.buddy.used_bytes().saturating_add(block) <= self.capacity;
            let reuse_dirty = backlog >= DIRTY_BACKLOG || !fresh_fits;
            if let Some(i) = reuse_dirty
                .then(|| st.dirty.iter().rposition(|&(_, b)| b == block))
                .flatten()
            {
                let (off, _) = st.dirty.swap_remove(i);
                st.cached_large -= block;
                st.cache_hits += 1;
                st.large_allocated += block;
                return Some((off, block, Kind::Large, true));
            }
        }
        if st.buddy.used_bytes().saturating_add(block) > self.capacity {
            return None;
        }
        let off = st.buddy.alloc(size)?;
        st.large_allocated += block;
        Some((off, block, Kind::Large, false))
    }

    /// Give every cached block back to the buddy (dirty ones are released, which zeroes
    /// them; clean ones too, so `reserved` and RSS fall).
    fn flush_caches_locked(&self, st: &mut PoolState) {
        let mut blocks: Vec<(u64, u64)> = std::mem::take(&mut st.dirty);
        for (size, offs) in st.clean.drain() {
            blocks.extend(offs.into_iter().map(|o| (o, size)));
        }
        for (off, size) in blocks {
            self.arena.release(off, size);
            st.cached_large -= size;
            st.buddy
                .free(off, size)
                .expect("cached block belongs to the buddy");
        }
        for (off, size) in st.slab.take_empty_spans() {
            self.arena.release(off, size);
            st.buddy
                .free_block(off, size)
                .expect("slab span belongs to the buddy");
        }
    }

    /// Release all cached blocks (`empty_cache`), including one the scrubber is zeroing now
    /// (waited for, so that afterwards nothing freed before the call is still cached).
    pub fn empty_cache(&self) {
        let _busy = self.scrub.busy.lock();
        let mut st = self.state.lock();
        self.flush_caches_locked(&mut st);
    }

    fn free_allocation(self: &Arc<Self>, a: &Allocation) {
        if self.forks != crate::generation::forks() {
            return; // the parent's memory, abandoned in this forked child: leak the block
        }
        match a.kind {
            Kind::Slab => {
                // Small: zero in place now so the slot is clean when it is handed out again.
                self.arena.fill(a.offset, a.block, 0);
                let mut st = self.state.lock();
                st.slab
                    .free(a.offset, a.size)
                    .expect("slab object freed once");
                st.requested -= a.size;
                st.active -= 1;
                st.num_frees += 1;
                self.trace_free(&st, a.size);
                if !self.reuse() {
                    for (off, size) in st.slab.take_empty_spans() {
                        self.arena.release(off, size);
                        st.buddy
                            .free_block(off, size)
                            .expect("slab span belongs to the buddy");
                    }
                }
            }
            Kind::Large => {
                let reuse = self.reuse();
                if !reuse {
                    self.arena.release(a.offset, a.block);
                }
                let mut st = self.state.lock();
                st.large_allocated -= a.block;
                st.requested -= a.size;
                st.active -= 1;
                st.num_frees += 1;
                self.trace_free(&st, a.size);
                if reuse {
                    st.dirty.push((a.offset, a.block));
                    st.cached_large += a.block;
                    drop(st);
                    self.wake_scrubber();
                } else {
                    st.buddy
                        .free(a.offset, a.size)
                        .expect("large block freed once");
                }
            }
        }
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
            let mut pending = self.scrub.lock.lock();
            *pending = true;
            self.scrub.cv.notify_one();
        }
    }

    /// Zero one dirty block and move it to the clean cache. Returns false when none waits.
    ///
    /// Blocks up to [`SCRUB_FILL_MAX`] are zeroed in place, so their pages stay committed and
    /// reuse costs no page faults. Larger ones are released to the OS instead: filling would
    /// commit every page of the block, so a mostly untouched multi-GiB buffer would cost its
    /// full size in RAM after `device_free`.
    fn scrub_one(&self) -> bool {
        let _busy = self.scrub.busy.lock();
        let Some((off, size)) = self.state.lock().dirty.pop() else {
            return false;
        };
        if size <= SCRUB_FILL_MAX {
            self.arena.zero(off, size);
        } else {
            self.arena.release(off, size);
        }
        let mut st = self.state.lock();
        if self.reuse() {
            st.clean.entry(size).or_default().push(off);
        } else {
            st.cached_large -= size;
            st.buddy
                .free(off, size)
                .expect("scrubbed block belongs to the buddy");
        }
        true
    }

    /// Current statistics.
    pub fn stats(&self) -> MemoryStats {
        let st = self.state.lock();
        self.stats_locked(&st)
    }

    fn stats_locked(&self, st: &PoolState) -> MemoryStats {
        let total = self.capacity;
        let reserved = st.buddy.used_bytes();
        let allocated = st.allocated();
        let free = total.saturating_sub(reserved);
        let largest = st.buddy.largest_free_block().min(free);
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
            free_blocks: st.buddy.free_block_count() as u64,
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
        st.peak_reserved = st.buddy.used_bytes();
    }
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
            let mut pending = m.scrub.lock.lock();
            if !*pending {
                m.scrub.cv.wait_for(&mut pending, Duration::from_millis(1));
            }
            *pending = false;
        } else {
            m.scrub.sleeping.store(true, Ordering::Release);
            let mut pending = m.scrub.lock.lock();
            // Re-check after announcing sleep, so a free that missed the flag is not lost.
            if !*pending && m.state.lock().dirty.is_empty() {
                // Bounded so the thread notices when the device memory goes away.
                m.scrub
                    .cv
                    .wait_for(&mut pending, Duration::from_millis(200));
            }
            *pending = false;
            m.scrub.sleeping.store(false, Ordering::Release);
            idle = 0;
        }
    }
}

/// After `fork()`, in the child: the copy helpers are made afresh on next use.
pub(crate) fn after_fork_in_child() {
    host::after_fork_in_child();
}

/// One allocation; returns its block to the allocator when dropped.
pub struct Allocation {
    mem: Arc<DeviceMemory>,
    offset: u64,
    size: u64,
    block: u64,
    kind: Kind,
    id: u64,
}

impl Drop for Allocation {
    fn drop(&mut self) {
        self.mem.free_allocation(self);
    }
}

/// A reference-counted handle to device memory. Clones share the allocation; the memory
/// returns to the allocator when the last clone is dropped.
#[derive(Clone)]
pub struct Buffer(Arc<Allocation>);

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Buffer#{}(device {}, {} bytes)",
            self.0.id,
            self.device(),
            self.0.size
        )
    }
}

impl PartialEq for Buffer {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Buffer {
    /// Size in bytes as requested.
    pub fn size(&self) -> u64 {
        self.0.size
    }

    /// Unique id (per device).
    pub fn id(&self) -> u64 {
        self.0.id
    }

    /// Device index.
    pub fn device(&self) -> usize {
        self.0.mem.device
    }

    /// Offset of the allocation in its device's address space.
    pub fn device_offset(&self) -> u64 {
        self.0.offset
    }

    /// The device memory this buffer lives in.
    pub fn memory(&self) -> &Arc<DeviceMemory> {
        &self.0.mem
    }

    /// Host address of byte 0 (the device is host-backed). Valid while this buffer lives.
    pub fn as_ptr(&self) -> *mut u8 {
        self.0.mem.arena.ptr(self.0.offset)
    }

    /// Number of live clones of this handle (views, queued operations).
    pub fn ref_count(&self) -> usize {
        Arc::strong_count(&self.0)
    }

    /// Fails with `InvalidHandle` once the runtime the buffer was allocated under has been
    /// shut down (its memory stays mapped while the buffer lives, but is no longer usable).
    pub fn check(&self) -> Result<()> {
        if self.0.mem.closed.load(Ordering::Acquire) {
            return Err(crate::error::DeviceError::InvalidHandle {
                what: format!(
                    "DeviceBuffer#{} (device {}, {} bytes)",
                    self.0.id,
                    self.device(),
                    self.0.size
                ),
                why: "the runtime was shut down since it was allocated".into(),
            }
            .into());
        }
        Ok(())
    }

    /// Check that the buffer is live ([`Buffer::check`]) and that `[offset, offset + count)`
    /// lies inside it, overflow included.
    pub fn check_range(&self, arg: &'static str, offset: u64, count: u64) -> Result<()> {
        self.check()?;
        match offset.checked_add(count) {
            Some(end) if end <= self.0.size => Ok(()),
            _ => Err(MemoryError::OutOfBounds {
                arg,
                offset,
                count,
                size: self.0.size,
                what: "device buffer",
            }
            .into()),
        }
    }

    /// Copy `src` into the buffer at `offset` (synchronous, not stream ordered).
    pub fn write(&self, offset: u64, src: &[u8]) -> Result<()> {
        self.check_range("offset", offset, src.len() as u64)?;
        self.0.mem.arena.write(self.0.offset + offset, src);
        Ok(())
    }

    /// Copy buffer bytes at `offset` into `dst` (synchronous, not stream ordered).
    pub fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        self.check_range("offset", offset, dst.len() as u64)?;
        self.0.mem.arena.read(self.0.offset + offset, dst);
        Ok(())
    }

    /// Copy `count` bytes from `src` at `src_off` to `self` at `dst_off` (any devices).
    pub fn copy_from(&self, dst_off: u64, src: &Buffer, src_off: u64, count: u64) -> Result<()> {
        self.check_range("dst_offset", dst_off, count)?;
        src.check_range("src_offset", src_off, count)?;
        self.0.mem.arena.copy_from(
            self.0.offset + dst_off,
            &src.0.mem.arena,
            src.0.offset + src_off,
            count,
        );
        Ok(())
    }

    /// Fill `count` bytes at `offset` with `byte`.
    pub fn fill(&self, offset: u64, count: u64, byte: u8) -> Result<()> {
        self.check_range("offset", offset, count)?;
        self.0.mem.arena.fill(self.0.offset + offset, count, byte);
        Ok(())
    }

    /// Copy from raw host memory.
    ///
    /// # Safety
    /// `src` valid for `len` reads and not overlapping this buffer.
    pub unsafe fn write_raw(&self, offset: u64, src: *const u8, len: usize) -> Result<()> {
        self.check_range("offset", offset, len as u64)?;
        // SAFETY: range checked above; the caller vouches for `src`.
        unsafe { self.0.mem.arena.write_raw(self.0.offset + offset, src, len) };
        Ok(())
    }

    /// Copy to raw host memory.
    ///
    /// # Safety
    /// `dst` valid for `len` writes and not overlapping this buffer.
    pub unsafe fn read_raw(&self, offset: u64, dst: *mut u8, len: usize) -> Result<()> {
        self.check_range("offset", offset, len as u64)?;
        // SAFETY: range checked above; the caller vouches for `dst`.
        unsafe { self.0.mem.arena.read_raw(self.0.offset + offset, dst, len) };
        Ok(())
    }

    /// Check that a typed view of `count` elements of `T` at byte `offset` lies inside this
    /// allocation and is aligned for `T`, and return its byte length.
    fn view_range<T: Element>(&self, offset: u64, count: usize) -> u64 {
        let bytes = count
            .checked_mul(size_of::<T>())
            .and_then(|b| u64::try_from(b).ok());
        let inside = bytes.is_some_and(|b| offset.checked_add(b).is_some_and(|e| e <= self.0.size));
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

    /// Typed shared view of `count` elements at byte `offset`.
    ///
    /// # Panics
    /// When the range is not inside this allocation or not aligned for `T` (checked in every
    /// build).
    ///
    /// # Safety
    /// No exclusive reference to any byte of the range may exist while the slice lives, and
    /// nothing may write those bytes meanwhile (another stream, a host view, a copy): the
    /// caller orders its accesses with streams and events.
    pub unsafe fn slice<T: Element>(&self, offset: u64, count: usize) -> &[T] {
        let bytes = self.view_range::<T>(offset, count);
        // SAFETY: the range is inside this live allocation and aligned (checked above); `T`
        // is valid for every bit pattern (`Element`); the caller guarantees no aliasing write.
        unsafe { self.0.mem.arena.slice(self.0.offset + offset, bytes, count) }
    }

    /// Typed exclusive view of `count` elements at byte `offset`.
    ///
    /// # Panics
    /// As for [`Buffer::slice`].
    ///
    /// # Safety
    /// No other reference to any byte of the range may exist while the slice lives, and
    /// nothing else may read or write those bytes meanwhile.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut<T: Element>(&self, offset: u64, count: usize) -> &mut [T] {
        let bytes = self.view_range::<T>(offset, count);
        // SAFETY: as for `slice`, and the caller guarantees exclusivity.
        unsafe {
            self.0
                .mem
                .arena
                .slice_mut(self.0.offset + offset, bytes, count)
        }
    }
}
