//! The host probe the bench samples beside its rows (private: `runtime._runtime._cross_core_ns`).

use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// One-way nanoseconds of a cache line between two busy threads (`runtime_core::probe`),
/// over `round_trips` round trips or `limit_s` seconds, whichever ends first; None on a
/// single-CPU host. The interpreter lock is released meanwhile.
#[pyfunction]
#[pyo3(signature = (round_trips=1000, limit_s=0.005))]
pub fn _cross_core_ns(py: Python<'_>, round_trips: u32, limit_s: f64) -> PyResult<Option<f64>> {
    let limit = Duration::try_from_secs_f64(limit_s)
        .ok()
        .filter(|d| *d <= Duration::from_secs(10))
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "limit_s must be between 0 and 10 seconds, got {limit_s}"
            ))
        })?;
    Ok(py.detach(|| runtime_core::probe::cross_core_ns(round_trips, limit)))
}
