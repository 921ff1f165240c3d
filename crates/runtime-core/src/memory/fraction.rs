//! The per-process memory fraction of a device (`torch.cuda.set_per_process_memory_fraction`):
//! a limit below the capacity on the bytes the allocator may reserve. An allocation that would
//! take `reserved` past `fraction × capacity` (after the caches were flushed and the
//! reclaimer had its chance, as for the capacity) fails with [`MemoryError::OverFraction`],
//! an out-of-memory error. Lowering the limit below what is reserved frees nothing: later
//! allocations fail until enough is freed.

use std::sync::atomic::Ordering;

use super::{fresh_block_size, DeviceMemory, PoolState};
use crate::error::{arg_error, MemoryError, Result};

/// The body of [`DeviceMemory::set_memory_fraction`].
pub(super) fn set_memory_fraction(mem: &DeviceMemory, fraction: f64) -> Result<()> {
    if !(0.0..=1.0).contains(&fraction) {
        return Err(arg_error(
            "fraction",
            format!("must be a number between 0 and 1, got {fraction}"),
        ));
    }
    // Exact for 1.0; below it, f64 rounding may cost the limit a byte or so of a 2^53+
    // capacity, which only ever makes it stricter.
    let limit = if fraction == 1.0 {
        mem.capacity
    } else {
        (fraction * mem.capacity as f64) as u64
    };
    mem.limit.store(limit.min(mem.capacity), Ordering::Relaxed);
    Ok(())
}

/// The body of [`DeviceMemory::memory_fraction`].
pub(super) fn memory_fraction(mem: &DeviceMemory) -> f64 {
    if mem.capacity == 0 {
        return 1.0;
    }
    mem.fraction_limit() as f64 / mem.capacity as f64
}

/// The body of [`DeviceMemory::fraction_limit`].
pub(super) fn fraction_limit(mem: &DeviceMemory) -> u64 {
    mem.limit.load(Ordering::Relaxed)
}

/// The error for a request of `size` bytes that failed only because of the fraction: it
/// would have fit in the capacity. `None` when the capacity itself is the reason.
pub(super) fn over_fraction_locked(
    mem: &DeviceMemory,
    st: &PoolState,
    size: u64,
) -> Option<MemoryError> {
    let limit = mem.fraction_limit();
    let reserved = st.reserved();
    let fits_capacity = reserved.saturating_add(fresh_block_size(size)) <= mem.capacity;
    (limit < mem.capacity && fits_capacity).then(|| MemoryError::OverFraction {
        device: mem.device,
        requested: size,
        reserved,
        limit,
        total: mem.capacity,
        fraction: mem.memory_fraction(),
    })
}
