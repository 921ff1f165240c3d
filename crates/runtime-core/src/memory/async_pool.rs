//! Stream-ordered allocation (CUDA's `cudaMallocAsync`/`cudaFreeAsync` and memory pools,
//! CuPy's `MemoryAsyncPool`, ACL's `aclrtMallocAsync`): the device's *async pool* of blocks
//! that are handed out and taken back in a stream's order, without waiting for anything.
//!
//! A block of the pool is a whole allocation of the device's allocator (its *backing*,
//! rounded to its block size so that any request of that size class fits). A request gets a
//! *lease*: an allocation of its own over the backing's first bytes, sharing the backing's
//! tracker (one memory, one lock: see `access`), so that ops using an old lease and ops using
//! a new one over the same bytes take turns and never run at once, and a host access of either
//! waits for the work queued on both.
//!
//! * **free in stream order** (`Stream::free_async`): the block goes back to the pool
//!   at once, marked with the stream and that stream's submission count; the work already
//!   queued that uses it keeps its lease (and so the memory) until it has run.
//! * **reuse** (`Stream::malloc_async`): a request on the same stream may take such a
//!   block at once (every later op of that stream runs after the ops it was freed behind); a
//!   request on another stream only once the freeing stream has reached that point (asked
//!   without waiting). Otherwise a fresh block comes from the allocator. A reused block is
//!   dirty: the stream layer queues a zeroing op before anything else can use it, so every
//!   allocation still reads zero in stream order.
//! * a lease dropped without `free_async` (its last handle gone, so no work uses it any more)
//!   returns its block free for any stream.
//! * **release threshold**: free blocks beyond it are given back to the allocator at the next
//!   synchronisation of a stream or device ([`DeviceMemory::trim_async_pool`]), as CUDA's
//!   `cudaMemPoolAttrReleaseThreshold`; [`DeviceMemory::trim_async_pool_to`] trims now; before
//!   the allocator reports out of memory it releases them all. A released block stays mapped
//!   while an old lease still holds it (work queued before its free): nothing is ever freed
//!   under a user.
//!
//! Nothing here waits for a stream or takes a stream's lock: stream positions are read from
//! [`StreamFence`] (two atomic loads).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::sync::lock::Mutex;

use super::{block_size, Allocation, Arena, Buffer, DeviceMemory, Place, StreamFence};
use crate::error::{ArgError, DeviceError, Result};

/// Statistics of a device's async pool, in the manner of `cudaMemPoolGetAttribute`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AsyncPoolStats {
    /// Bytes of the blocks the pool holds, in use or free (`cudaMemPoolAttrReservedMemCurrent`).
    pub reserved: u64,
    /// Highest `reserved` since start or the last reset.
    pub reserved_high: u64,
    /// Bytes of blocks handed out and not freed (`cudaMemPoolAttrUsedMemCurrent`).
    pub used: u64,
    /// Highest `used` since start or the last reset.
    pub used_high: u64,
    /// Bytes of free blocks (`reserved - used`).
    pub free: u64,
    /// Free blocks.
    pub free_blocks: u64,
    /// Release threshold in bytes (`cudaMemPoolAttrReleaseThreshold`).
    pub release_threshold: u64,
    /// Allocations made so far.
    pub num_allocs: u64,
    /// Frees so far (`free_async`, or a lease dropped).
    pub num_frees: u64,
    /// Allocations served by a block freed on the same stream, without waiting.
    pub reuse_same_stream: u64,
    /// Allocations served by a block whose freeing stream had already passed the free.
    pub reuse_other_stream: u64,
    /// Blocks given back to the allocator.
    pub released: u64,
}

/// A free block of the pool.
struct Free {
    backing: Buffer,
    /// The stream it was freed on and that stream's submission count then; `None` when no work
    /// can use it any more.
    freed_on: Option<(Arc<dyn StreamFence>, u64)>,
}

#[derive(Default)]
struct State {
    /// Free blocks by block size, oldest first.
    free: HashMap<u64, Vec<Free>>,
    stats: AsyncPoolStats,
}

/// The async pool of one device's memory (see the module documentation).
#[derive(Default)]
pub(super) struct AsyncPool {
    state: Mutex<State>,
    threshold: AtomicU64,
    /// Whether any free block is held (read without the lock at synchronisation points).
    any_free: AtomicBool,
}

/// A block handed out by the async pool: the lease's place.
pub(super) struct PoolLease {
    backing: Buffer,
    /// Set by `free_async`: the block is the pool's again (the lease only keeps it mapped for
    /// work queued before the free).
    freed: AtomicBool,
}

impl PoolLease {
    pub(super) fn at(&self) -> (&Arena, u64) {
        self.backing.at()
    }

    /// The lease's allocation is gone: unless `free_async` took its block back already, it is
    /// free for any stream now (nothing can use it any more).
    pub(super) fn give_back(self) {
        if self.freed.load(Ordering::Acquire) {
            return;
        }
        let mem = self.backing.memory().clone();
        if mem.closed.load(Ordering::Acquire) {
            // After shutdown nothing is pooled: the block goes back with its backing.
            let block = self.backing.size();
            let mut st = mem.async_pool.state.lock();
            st.stats.used -= block;
            st.stats.reserved -= block;
            st.stats.num_frees += 1;
            return;
        }
        let block = self.backing.size();
        mem.async_pool.put(
            Free {
                backing: self.backing,
                freed_on: None,
            },
            block,
        );
    }
}

impl AsyncPool {
    fn put(&self, f: Free, block: u64) {
        let mut st = self.state.lock();
        st.stats.used -= block;
        st.stats.free += block;
        st.stats.free_blocks += 1;
        st.stats.num_frees += 1;
        st.free.entry(block).or_default().push(f);
        self.any_free.store(true, Ordering::Release);
    }

    /// A free block of `block` bytes that `stream` may use now: one freed on it (newest
    /// first), or one no work uses, or one whose stream has passed its free.
    fn take(&self, block: u64, stream: &Arc<dyn StreamFence>) -> Option<Buffer> {
        let mut st = self.state.lock();
        let list = st.free.get_mut(&block)?;
        let id = stream.fence_id();
        let same = list
            .iter()
            .rposition(|f| f.freed_on.as_ref().is_some_and(|(s, _)| s.fence_id() == id));
        let (i, same) = match same {
            Some(i) => (i, true),
            None => (
                list.iter().rposition(|f| {
                    f.freed_on
                        .as_ref()
                        .is_none_or(|(s, target)| s.reached(*target))
                })?,
                false,
            ),
        };
        let f = list.remove(i);
        st.stats.free -= block;
        st.stats.free_blocks -= 1;
        st.stats.used += block;
        st.stats.used_high = st.stats.used_high.max(st.stats.used);
        st.stats.num_allocs += 1;
        if same {
            st.stats.reuse_same_stream += 1;
        } else {
            st.stats.reuse_other_stream += 1;
        }
        self.any_free
            .store(st.stats.free_blocks > 0, Ordering::Release);
        // The freeing stream's handle is dropped after the lock.
        drop(st);
        Some(f.backing)
    }

    /// Take free blocks out until at most `keep` free bytes remain, oldest first; they are
    /// dropped by the caller outside the lock.
    fn trim(&self, keep: u64) -> Vec<Free> {
        let mut st = self.state.lock();
        let mut out = Vec::new();
        if st.stats.free <= keep {
            return out;
        }
        let mut sizes: Vec<u64> = st.free.keys().copied().collect();
        // Largest sizes first: fewer blocks released for the same bytes.
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        for size in sizes {
            while st.stats.free > keep {
                let Some(list) = st.free.get_mut(&size) else {
                    break;
                };
                if list.is_empty() {
                    break;
                }
                let f = list.remove(0);
                st.stats.free -= size;
                st.stats.free_blocks -= 1;
                st.stats.reserved -= size;
                st.stats.released += 1;
                out.push(f);
            }
        }
        st.free.retain(|_, l| !l.is_empty());
        self.any_free
            .store(st.stats.free_blocks > 0, Ordering::Release);
        out
    }

    /// Take out every free block freed on the stream with fence id `stream` (CuPy's
    /// `free_all_blocks(stream=)`: that stream's arena); they are dropped by the caller
    /// outside the lock.
    fn trim_of(&self, stream: u64) -> Vec<Free> {
        let mut st = self.state.lock();
        let mut out = Vec::new();
        let mut released = 0u64;
        for (&size, list) in st.free.iter_mut() {
            let mut i = 0;
            while i < list.len() {
                if list[i]
                    .freed_on
                    .as_ref()
                    .is_some_and(|(s, _)| s.fence_id() == stream)
                {
                    out.push(list.remove(i));
                    released += size;
                } else {
                    i += 1;
                }
            }
        }
        st.free.retain(|_, l| !l.is_empty());
        st.stats.free -= released;
        st.stats.free_blocks -= out.len() as u64;
        st.stats.reserved -= released;
        st.stats.released += out.len() as u64;
        self.any_free
            .store(st.stats.free_blocks > 0, Ordering::Release);
        out
    }
}

impl DeviceMemory {
    /// Allocate `size` bytes in the order of `stream` (the stream layer's
    /// `Stream::malloc_async`): a free block the stream may use now, or a fresh one. Returns
    /// the buffer and whether it must be zeroed in stream order before use (a reused block).
    ///
    /// # Errors
    /// As for [`DeviceMemory::allocate`].
    pub(crate) fn malloc_async(
        self: &Arc<Self>,
        size: u64,
        stream: &Arc<dyn StreamFence>,
    ) -> Result<(Buffer, bool)> {
        let block = block_size(size);
        if block == 0 {
            // Zero bytes take no memory: not pooled.
            return Ok((self.allocate(0)?, false));
        }
        let (backing, dirty) = match self.async_pool.take(block, stream) {
            Some(b) => (b, true),
            None => {
                let b = self.allocate(block)?;
                let mut st = self.async_pool.state.lock();
                st.stats.reserved += block;
                st.stats.used += block;
                st.stats.num_allocs += 1;
                st.stats.reserved_high = st.stats.reserved_high.max(st.stats.reserved);
                st.stats.used_high = st.stats.used_high.max(st.stats.used);
                (b, false)
            }
        };
        let (id, tracker) = (backing.id(), backing.alloc.tracker.clone());
        let buf = Buffer {
            alloc: Arc::new(Allocation {
                mem: self.clone(),
                place: Place::Pooled(PoolLease {
                    backing,
                    freed: AtomicBool::new(false),
                }),
                size,
                block: 0,
                id,
                recorded: Mutex::new(Vec::new()),
                export: std::sync::OnceLock::new(),
                // The lease is a range of the backing: one memory, one lock.
                tracker,
            }),
            offset: 0,
            len: size,
        };
        Ok((buf, dirty))
    }

    /// Give `buf`'s block back to the pool in the order of `stream` (the stream layer's
    /// `Stream::free_async`): free at once for later work on `stream`, for other streams once
    /// `stream` has run what is queued on it now. The work already queued keeps the memory.
    ///
    /// # Errors
    /// `ArgError` (argument `buf`) when `buf` is not the start of an allocation made by
    /// `malloc_async` on this device; `InvalidHandle` when it was freed already.
    pub(crate) fn free_async(
        self: &Arc<Self>,
        buf: &Buffer,
        stream: Arc<dyn StreamFence>,
    ) -> Result<()> {
        buf.check()?;
        let Place::Pooled(lease) = &buf.alloc.place else {
            return Err(ArgError::new(
                "buf",
                format!("{buf:?} was not allocated by malloc_async (free it with device_free)"),
            )
            .into());
        };
        if !Arc::ptr_eq(buf.memory(), self) {
            return Err(ArgError::new(
                "buf",
                format!("{buf:?} is not memory of device {}", self.device),
            )
            .into());
        }
        if buf.offset() != 0 {
            return Err(ArgError::new(
                "buf",
                format!(
                    "{buf:?} is a view at offset {}; free_async takes what malloc_async returned",
                    buf.offset()
                ),
            )
            .into());
        }
        if lease.freed.swap(true, Ordering::AcqRel) {
            return Err(DeviceError::InvalidHandle {
                what: format!("{buf:?}"),
                why: "it was freed with free_async already".into(),
            }
            .into());
        }
        let target = stream.submitted();
        let block = lease.backing.size();
        self.async_pool.put(
            Free {
                backing: lease.backing.clone(),
                freed_on: Some((stream, target)),
            },
            block,
        );
        Ok(())
    }

    /// Statistics of the async pool.
    pub fn async_pool_stats(&self) -> AsyncPoolStats {
        let mut s = self.async_pool.state.lock().stats;
        s.release_threshold = self.async_pool.threshold.load(Ordering::Relaxed);
        s
    }

    /// Free bytes the async pool keeps at synchronisation points
    /// (`cudaMemPoolAttrReleaseThreshold`; 0, the default, keeps none).
    pub fn set_async_release_threshold(&self, bytes: u64) {
        self.async_pool.threshold.store(bytes, Ordering::Relaxed);
    }

    /// Give free blocks of the async pool back to the allocator until at most `keep` free
    /// bytes remain (`cudaMemPoolTrimTo`); returns how many blocks went. Never waits: a block
    /// still held by work queued before its free stays mapped until that work has run.
    pub fn trim_async_pool_to(&self, keep: u64) -> usize {
        let out = self.async_pool.trim(keep);
        let n = out.len();
        drop(out);
        n
    }

    /// Give back to the allocator every free block of the async pool that was freed on the
    /// stream whose fence id is `stream` (the stream layer's
    /// `Stream::release_async_free_blocks`); returns how many blocks went. Blocks freed on
    /// other streams, and those no stream holds, stay. Never waits, as
    /// [`DeviceMemory::trim_async_pool_to`].
    pub(crate) fn trim_async_pool_of(&self, stream: u64) -> usize {
        let out = self.async_pool.trim_of(stream);
        let n = out.len();
        drop(out);
        n
    }

    /// A synchronisation point: trim the async pool to its release threshold.
    pub fn trim_async_pool(&self) {
        if self.async_pool.any_free.load(Ordering::Acquire) {
            self.trim_async_pool_to(self.async_pool.threshold.load(Ordering::Relaxed));
        }
    }

    /// Reset the high-water marks of the async pool to the current values.
    pub fn reset_async_pool_peaks(&self) {
        let mut st = self.async_pool.state.lock();
        st.stats.used_high = st.stats.used;
        st.stats.reserved_high = st.stats.reserved;
    }

    /// Before reporting out of memory: give every free block of the async pool back; true
    /// if any went.
    pub(super) fn release_async_free(&self) -> bool {
        self.async_pool.any_free.load(Ordering::Acquire) && self.trim_async_pool_to(0) > 0
    }
}
