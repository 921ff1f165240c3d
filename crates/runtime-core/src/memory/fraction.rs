//! The per-process memory fraction of a device (`torch.cuda.set_per_process_memory_fraction`):
//! a limit below the capacity on the bytes the allocator may reserve. An allocation that would
//! take `reserved` past `fraction × capacity` (after the caches were flushed and the
//! reclaimer had its chance, as for the capacity) fails with [`MemoryError::OverFraction`],
//! an out-of-memory error. Lowering the limit below what is reserved frees nothing: later
//! allocations fail until enough is freed.

use std::sync::atomic::Ordering;

use super::{fresh_block_size, DeviceMemory, PoolState};
use crate::error::{arg_error, MemoryError, Result};

impl DeviceMemory {
    /// Limit this device's reserved bytes to `fraction` of its capacity (rounded down to a
    /// whole byte); 1.0 lifts the limit.
    ///
    /// # Errors
    /// `fraction` is not a number in `[0, 1]` (nothing changes).
    pub fn set_memory_fraction(&self, fraction: f64) -> Result<()> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(arg_error(
                "fraction",
                format!("must be a number between 0 and 1, got {fraction}"),
            ));
        }
        // Exact for 1.0; below it, f64 rounding may cost the limit a byte or so of a 2^53+
        // capacity, which only ever makes it stricter.
        let limit = if fraction == 1.0 {
            self.capacity
        } else {
            (fraction * self.capacity as f64) as u64
        };
        self.limit
            .store(limit.min(self.capacity), Ordering::Relaxed);
        Ok(())
    }

    /// The fraction of the capacity this process may reserve (1.0 unless limited).
    pub fn memory_fraction(&self) -> f64 {
        if self.capacity == 0 {
            return 1.0;
        }
        self.fraction_limit() as f64 / self.capacity as f64
    }

    /// Bytes this process may reserve on the device under its fraction (see
    /// [`DeviceMemory::limit`] for the limit allocations obey).
    pub fn fraction_limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    /// The error for a request of `size` bytes that failed only because of the fraction: it
    /// would have fit in the capacity. `None` when the capacity itself is the reason.
    pub(super) fn over_fraction_locked(&self, st: &PoolState, size: u64) -> Option<MemoryError> {
        let limit = self.fraction_limit();
        let reserved = st.reserved();
        let fits_capacity = reserved.saturating_add(fresh_block_size(size)) <= self.capacity;
        (limit < self.capacity && fits_capacity).then(|| MemoryError::OverFraction {
            device: self.device,
            requested: size,
            reserved,
            limit,
            total: self.capacity,
            fraction: self.memory_fraction(),
        })
    }
}
