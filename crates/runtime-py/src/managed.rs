//! Managed memory: `malloc_managed`, `prefetch`, `mem_advise`, `mem_range_attributes`.
//! Validation, the advice record and the prefetch op are the core's
//! (`runtime_core::memory::managed`, `runtime_core::stream::copy::prefetch`).

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyInt, PyString};
use runtime_core::memory::managed::{self, Advice, Location};

use crate::convert::{buffer_arg, nonneg, resolve, stream_or_current, type_name};
use crate::errors::RtErr;
use crate::handles::PyDeviceBuffer;
use crate::wait;

/// Allocate `nbytes` zeroed bytes of managed memory on `device` (the current device when
/// None): a `DeviceBuffer` that kernels and copies use like any other, and that the host
/// reads and writes through `buf.host_view()`.
#[pyfunction]
#[pyo3(signature = (nbytes, device=None))]
pub fn malloc_managed(
    py: Python<'_>,
    nbytes: &Bound<'_, PyAny>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyDeviceBuffer> {
    let n = nonneg(nbytes, "nbytes")?;
    let d = resolve(py, device, "device")?;
    let b = py
        .detach(|| managed::allocate(d.memory(), n))
        .map_err(RtErr)?;
    Ok(PyDeviceBuffer::raw(b))
}

/// A location argument: None (the current device), a Device, device index or device string
/// (`"npu:0"`), or -1 / "cpu"
/// for the host (`cudaCpuDeviceId`).
fn location(py: Python<'_>, obj: Option<&Bound<'_, PyAny>>) -> PyResult<Location> {
    if let Some(o) = obj {
        if o.is_instance_of::<PyString>() {
            let s: String = o.extract()?;
            if s == "cpu" || s == "host" {
                return Ok(Location::Host);
            }
        }
        if o.is_instance_of::<PyInt>() && o.extract::<i64>().ok() == Some(-1) {
            return Ok(Location::Host);
        }
    }
    Ok(Location::Device(resolve(py, obj, "device")?.index()))
}

/// Prefetch managed buffer `buf` to `device` (None: the current device; -1 or "cpu": the
/// host) in stream order on `stream` (None: the current stream), as `cudaMemPrefetchAsync`.
/// Device memory is host memory here, so nothing moves: the prefetch orders like a copy and
/// shows in traces.
#[pyfunction]
#[pyo3(signature = (buf, device=None, stream=None))]
pub fn prefetch(
    py: Python<'_>,
    buf: &Bound<'_, PyAny>,
    device: Option<&Bound<'_, PyAny>>,
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let b = buffer_arg(buf, "buf")?.get().buffer(py)?;
    let loc = location(py, device)?;
    let s = stream_or_current(py, stream)?;
    let op = runtime_core::stream::copy::prefetch(&b, loc).map_err(RtErr)?;
    wait::submit(py, &s, op)
}

/// Advise how managed buffer `buf` will be used (`cudaMemAdvise`): `advice` is a name
/// (`"set_read_mostly"`, `"unset_read_mostly"`, `"set_preferred_location"`,
/// `"unset_preferred_location"`, `"set_accessed_by"`, `"unset_accessed_by"`) or CUDA's number
/// (1..6); `device` as for `prefetch`. The advice is recorded (see `mem_range_attributes`)
/// and traced.
#[pyfunction]
#[pyo3(signature = (buf, advice, device=None))]
pub fn mem_advise(
    py: Python<'_>,
    buf: &Bound<'_, PyAny>,
    advice: &Bound<'_, PyAny>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let b = buffer_arg(buf, "buf")?.get().buffer(py)?;
    let a = if advice.is_instance_of::<PyString>() {
        Advice::parse(&advice.extract::<String>()?)
    } else if advice.is_instance_of::<PyInt>() {
        Advice::from_code(advice.extract::<i64>().unwrap_or(i64::MAX))
    } else {
        return Err(PyTypeError::new_err(format!(
            "advice must be a str or an int, got {}",
            type_name(advice)
        )));
    }
    .map_err(RtErr)?;
    let loc = location(py, device)?;
    managed::advise(&b, a, loc).map_err(RtErr)?;
    Ok(())
}

fn location_obj(py: Python<'_>, l: Option<Location>) -> PyResult<Py<PyAny>> {
    Ok(match l {
        None => py.None(),
        Some(Location::Host) => (-1i64).into_pyobject(py)?.into_any().unbind(),
        Some(Location::Device(d)) => d.into_pyobject(py)?.into_any().unbind(),
    })
}

/// What was advised and prefetched for managed buffer `buf` (`cudaMemRangeGetAttributes`):
/// `read_mostly`, `preferred_location`, `accessed_by` (a list) and `last_prefetch_location`;
/// locations are device indices, -1 for the host, None when unset.
#[pyfunction]
pub fn mem_range_attributes<'py>(
    py: Python<'py>,
    buf: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyDict>> {
    let b = buffer_arg(buf, "buf")?.get().buffer(py)?;
    managed::check_managed(&b, "buf").map_err(RtErr)?;
    let st = managed::state(&b).unwrap_or_default();
    let d = PyDict::new(py);
    d.set_item("read_mostly", st.read_mostly)?;
    d.set_item(
        "preferred_location",
        location_obj(py, st.preferred_location)?,
    )?;
    let acc: Vec<Py<PyAny>> = st
        .accessed_by
        .iter()
        .map(|l| location_obj(py, Some(*l)))
        .collect::<PyResult<_>>()?;
    d.set_item("accessed_by", acc)?;
    d.set_item(
        "last_prefetch_location",
        location_obj(py, st.last_prefetch)?,
    )?;
    Ok(d)
}
