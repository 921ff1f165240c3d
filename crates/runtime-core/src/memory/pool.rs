//! The pool face of a device's allocator (CuPy's `MemoryPool`): its limit, and the frees
//! that wait for streams (torch's `record_stream`).
//!
//! The built-in allocator of [`DeviceMemory`] *is* the device's memory pool; this module adds
//! what a pool object needs beyond the allocator's statistics:
//!
//! * A **limit** ([`DeviceMemory::set_limit`]): the bytes the pool may reserve (live blocks
//!   plus cached ones), at most the device's capacity. An allocation that would take
//!   `reserved` past it fails with `OutOfMemory` after the caches were flushed, as one past
//!   the capacity does. 0 means no limit (the capacity).
//! * **Stream-ordered frees** ([`Buffer::record_stream`](super::Buffer::record_stream)):
//!   an allocation with recorded streams is not freed when its last handle drops; its block
//!   is parked with, for each recorded stream, the stream's submission count at that moment,
//!   and goes back to the allocator once every one of those streams has completed that much
//!   work. Parked blocks still count as allocated. They are looked at (two atomic reads per
//!   stream, no lock on the stream) at the start of every allocation, before an allocation
//!   retries after waiting for queued work, by `empty_cache`, by
//!   [`DeviceMemory::process_deferred_frees`], and all released at shutdown (which drains
//!   the streams first).
//!
//! The memory layer sits below streams, so a stream is seen through [`StreamFence`], which
//! the stream layer implements.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::{DeviceMemory, Place};
use crate::error::{ArgError, Result};

/// What the allocator needs of a stream to defer a free until the stream's queued work is done.
///
/// Sealed: only the stream layer's `Stream` implements it. Its methods run under the pool's
/// locks, where no user code may run:
///
/// ```compile_fail
/// struct Mine;
/// impl runtime_core::memory::StreamFence for Mine {
///     fn fence_id(&self) -> u64 { 1 }
///     fn submitted(&self) -> u64 { 0 }
///     fn reached(&self, _: u64) -> bool { true }
/// }
/// ```
pub trait StreamFence: sealed::Sealed + Send + Sync {
    /// A stable id of the stream (recording one stream twice records it once).
    fn fence_id(&self) -> u64;
    /// Operations submitted to the stream so far.
    fn submitted(&self) -> u64;
    /// Whether the stream has completed its first `target` operations.
    fn reached(&self, target: u64) -> bool;
}

pub(crate) mod sealed {
    /// The seal of [`super::StreamFence`].
    pub trait Sealed {}
}

/// A freed block waiting for streams.
struct Deferred {
    place: Place,
    size: u64,
    block: u64,
    /// Each stream and its submission count at free time.
    waits: Vec<(Arc<dyn StreamFence>, u64)>,
}

/// The pool state of a device's memory beyond the allocator's own.
#[derive(Default)]
pub(super) struct PoolExt {
    /// Set limit in bytes; 0 = none.
    limit: AtomicU64,
    deferred: Mutex<Vec<Deferred>>,
    /// `deferred.len()`, read without the lock on the allocation path.
    n_deferred: AtomicUsize,
    /// The plugged allocator (see `allocator`).
    pub(super) plug: Mutex<Option<Arc<dyn super::Allocator>>>,
    /// Blocks given back to plugged allocators, waiting for `return_blocks` to pass them to
    /// `Allocator::free` (see `allocator`).
    #[allow(clippy::type_complexity)]
    pub(super) returned: Mutex<Vec<(Arc<dyn super::Allocator>, super::Block)>>,
}

impl DeviceMemory {
    /// Bytes the allocator may reserve: the limit if one is set, else the capacity.
    pub(super) fn pool_limit(&self) -> u64 {
        match self.pool.limit.load(Ordering::Relaxed) {
            0 => self.capacity,
            l => l.min(self.capacity),
        }
    }

    /// Limit the bytes the pool may reserve to `bytes` (`None` or `Some(0)`: no limit).
    /// Blocks already reserved stay; allocations that would pass the limit fail.
    ///
    /// # Errors
    /// `ArgError` when `bytes` exceeds the device's capacity (nothing changes).
    pub fn set_limit(&self, bytes: Option<u64>) -> Result<()> {
        let b = bytes.unwrap_or(0);
        if b > self.capacity {
            return Err(ArgError::new(
                "size",
                format!(
                    "a limit of {b} bytes exceeds the {}-byte capacity of device {}",
                    self.capacity, self.device
                ),
            )
            .into());
        }
        self.pool.limit.store(b, Ordering::Relaxed);
        Ok(())
    }

    /// The limit set with [`DeviceMemory::set_limit`], 0 when none.
    pub fn get_limit(&self) -> u64 {
        self.pool.limit.load(Ordering::Relaxed)
    }

    /// Park a freed allocation until its recorded streams have completed what is queued on
    /// them now; free it at once when they already have.
    pub(super) fn defer_free(
        self: &Arc<Self>,
        place: Place,
        size: u64,
        block: u64,
        recorded: Vec<Arc<dyn StreamFence>>,
    ) {
        let waits: Vec<_> = recorded
            .into_iter()
            .map(|s| {
                let target = s.submitted();
                (s, target)
            })
            .filter(|(s, t)| !s.reached(*t))
            .collect();
        if waits.is_empty() || self.closed.load(Ordering::Acquire) {
            self.free_allocation(place, size, block);
            return;
        }
        let mut d = self.pool.deferred.lock();
        d.push(Deferred {
            place,
            size,
            block,
            waits,
        });
        self.pool.n_deferred.store(d.len(), Ordering::Release);
    }

    /// Free the parked blocks whose streams have completed the work they waited for; returns
    /// how many were freed.
    pub fn process_deferred_frees(self: &Arc<Self>) -> usize {
        if self.pool.n_deferred.load(Ordering::Acquire) == 0 {
            return 0;
        }
        let ready: Vec<Deferred> = {
            let mut d = self.pool.deferred.lock();
            let (ready, waiting) = std::mem::take(&mut *d)
                .into_iter()
                .partition(|x| x.waits.iter().all(|(s, t)| s.reached(*t)));
            *d = waiting;
            self.pool.n_deferred.store(d.len(), Ordering::Release);
            ready
        };
        // Freed outside the lock (a plugged block goes back to its allocator).
        let n = ready.len();
        for x in ready {
            self.free_allocation(x.place, x.size, x.block);
        }
        n
    }

    /// Blocks parked until their recorded streams complete.
    pub fn deferred_frees(&self) -> usize {
        self.pool.n_deferred.load(Ordering::Acquire)
    }

    /// At shutdown (the streams were drained): free every parked block.
    pub(super) fn drop_deferred_frees(self: &Arc<Self>) {
        let all = std::mem::take(&mut *self.pool.deferred.lock());
        self.pool.n_deferred.store(0, Ordering::Release);
        for x in all {
            self.free_allocation(x.place, x.size, x.block);
        }
    }
}
