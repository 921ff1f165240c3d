//! Pointer arithmetic and slicing of `DeviceBuffer` handles (CuPy's `MemoryPointer + int`,
//! numpy's 1-D slicing): each result is a handle over a core view (`memory::Buffer::view`,
//! `Buffer::shifted`) of the same allocation, bounds-checked by the core and keeping the
//! allocation alive.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PySlice, PySliceMethods};

use crate::convert::type_name;
use crate::errors::RtErr;
use crate::handles::PyDeviceBuffer;

/// The core view covering exactly `h`'s bytes.
fn own_view(py: Python<'_>, h: &PyDeviceBuffer) -> PyResult<runtime_core::memory::Buffer> {
    h.buffer(py)?
        .view(h.offset, h.nbytes)
        .map_err(|e| RtErr(e).into())
}

/// The byte count of `buf + n` / `buf - n`: `None` for what is not an integer (Python then
/// tries the other operand); an integer too large for any allocation is a `ValueError`, as
/// one that leaves this allocation is.
pub fn delta(n: &Bound<'_, PyAny>) -> PyResult<Option<i64>> {
    if n.is_instance_of::<pyo3::types::PyBool>() {
        return Ok(None);
    }
    match n.extract::<i64>() {
        Ok(d) => Ok(Some(d)),
        Err(_) if n.hasattr("__index__")? => Err(out_of_range(n)),
        Err(_) => Ok(None),
    }
}

/// The error for a byte count outside every allocation.
pub fn out_of_range(n: &Bound<'_, PyAny>) -> PyErr {
    PyValueError::new_err(format!(
        "offset: moving {} bytes leaves the allocation: pointer arithmetic stays inside the allocation",
        n.str().map(|s| s.to_string()).unwrap_or_default()
    ))
}

/// `h + delta` (bytes): a raw byte view from `delta` bytes after `h`'s start to `h`'s end.
pub fn shifted(py: Python<'_>, h: &PyDeviceBuffer, delta: i64) -> PyResult<Py<PyAny>> {
    let v = own_view(py, h)?.shifted(delta).map_err(RtErr)?;
    Ok(Py::new(py, PyDeviceBuffer::raw(v))?.into_any())
}

/// `h[start:stop]`: elements along the first axis (bytes of a raw buffer), numpy's slice
/// rules (negative indices count from the end, out-of-range bounds are clipped); step 1.
pub fn slice(
    py: Python<'_>,
    h: &PyDeviceBuffer,
    key: &Bound<'_, PyAny>,
) -> PyResult<PyDeviceBuffer> {
    let Ok(s) = key.cast::<PySlice>() else {
        return Err(PyTypeError::new_err(format!(
            "DeviceBuffer indices must be slices (buf[start:stop]), got {}; use buf.view() for typed element access",
            type_name(key)
        )));
    };
    let Some(&rows) = h.shape.first() else {
        return Err(PyTypeError::new_err("a 0-d DeviceBuffer cannot be sliced"));
    };
    let ind = s.indices(rows)?;
    if ind.step != 1 {
        return Err(PyValueError::new_err(format!(
            "step: only contiguous slices (step 1) are views of device memory, got step {}",
            ind.step
        )));
    }
    let rest: Vec<usize> = h.shape[1..].iter().map(|&d| d as usize).collect();
    let row = rest.iter().product::<usize>() as u64 * h.dtype.size() as u64;
    let n = (ind.stop - ind.start).max(0) as u64;
    let start = ind.start.max(0) as u64;
    let v = own_view(py, h)?.view(start * row, n * row).map_err(RtErr)?;
    let mut shape = vec![n as usize];
    shape.extend(rest);
    Ok(PyDeviceBuffer::typed(v, 0, h.dtype, shape))
}
