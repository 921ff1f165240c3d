//! Allocator statistics and cache control: `memory_stats`, `empty_cache`,
//! `reset_peak_memory_stats`.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use runtime_core::runtime as rt;

use crate::convert::{device_arg, resolve};
use crate::errors::RtErr;

/// The device of `dev`, or every device when None.
fn devices_of(dev: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<runtime_core::device::Device>> {
    let r = rt::get().map_err(RtErr)?;
    match dev {
        Some(o) if !o.is_none() => Ok(vec![runtime_core::bindings::device(
            &r,
            device_arg(o, "device")?,
        )
        .map_err(RtErr)?
        .clone()]),
        _ => Ok(r.devices().to_vec()),
    }
}

/// Limit the bytes this process may reserve on `device` (the current device when None) to
/// `fraction` (0..=1) of its capacity, as `torch.cuda.set_per_process_memory_fraction`;
/// allocations beyond it raise `OutOfMemoryError`.
#[pyfunction]
#[pyo3(signature = (fraction, device=None))]
pub fn set_per_process_memory_fraction(
    py: Python<'_>,
    fraction: &Bound<'_, PyAny>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    // A float, as torch requires (an int such as 1 is refused there too).
    if !fraction.is_instance_of::<pyo3::types::PyFloat>() {
        return Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "fraction must be a float, got {}",
            crate::convert::type_name(fraction)
        )));
    }
    let f: f64 = fraction.extract()?;
    let d = resolve(py, device, "device")?;
    d.memory().set_memory_fraction(f).map_err(RtErr)?;
    Ok(())
}

/// The fraction of `device`'s capacity (the current device when None) this process may
/// reserve (1.0 unless `set_per_process_memory_fraction` lowered it).
#[pyfunction]
#[pyo3(signature = (device=None))]
pub fn get_per_process_memory_fraction(
    py: Python<'_>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<f64> {
    Ok(resolve(py, device, "device")?.memory().memory_fraction())
}

/// Release cached blocks of `device` (all devices when None).
#[pyfunction]
#[pyo3(signature = (device=None))]
pub fn empty_cache(device: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
    for d in devices_of(device)? {
        d.memory().empty_cache();
    }
    Ok(())
}

/// Allocator statistics of `device` (the current device when None) as a dict.
#[pyfunction]
#[pyo3(signature = (device=None))]
pub fn memory_stats<'py>(
    py: Python<'py>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<Bound<'py, PyDict>> {
    let d = resolve(py, device, "device")?;
    let s = d.memory().stats();
    let out = PyDict::new(py);
    out.set_item("device", d.index())?;
    out.set_item("total", s.total)?;
    out.set_item("allocated", s.allocated)?;
    out.set_item("requested", s.requested)?;
    out.set_item("reserved", s.reserved)?;
    out.set_item("cached", s.cached)?;
    out.set_item("free", s.free)?;
    out.set_item("peak_allocated", s.peak_allocated)?;
    out.set_item("peak_reserved", s.peak_reserved)?;
    out.set_item("active_allocations", s.active_allocations)?;
    out.set_item("num_allocs", s.num_allocs)?;
    out.set_item("num_frees", s.num_frees)?;
    out.set_item("cache_hits", s.cache_hits)?;
    out.set_item("cache_flushes", s.cache_flushes)?;
    out.set_item("num_ooms", s.num_ooms)?;
    out.set_item("free_blocks", s.free_blocks)?;
    out.set_item("largest_free_block", s.largest_free_block)?;
    out.set_item("fragmentation", s.fragmentation)?;
    Ok(out)
}

/// Reset the peak statistics of `device` (all devices when None).
#[pyfunction]
#[pyo3(signature = (device=None))]
pub fn reset_peak_memory_stats(device: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
    for d in devices_of(device)? {
        d.memory().reset_peak_stats();
    }
    Ok(())
}
