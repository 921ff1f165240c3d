//! Pointer arithmetic and slicing of `DeviceBuffer` handles (CuPy's `MemoryPointer + int`,
//! numpy's slicing with positive steps): each result is a handle over a core view (`memory::Buffer::view`,
//! `Buffer::shifted`) of the same allocation, bounds-checked by the core and keeping the
//! allocation alive.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PySlice, PySliceMethods, PyTuple};

use crate::convert::type_name;
use crate::errors::RtErr;
use crate::handles::PyDeviceBuffer;

/// The core view covering exactly `h`'s bytes (one range: a strided view is refused).
fn own_view(py: Python<'_>, h: &PyDeviceBuffer) -> PyResult<runtime_core::memory::Buffer> {
    let (off, len) = h.contiguous_bytes("buf")?;
    h.buffer(py)?.view(off, len).map_err(|e| RtErr(e).into())
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

/// `h[start:stop:step]`, or a tuple of such slices for the leading axes: numpy's slice rules
/// (negative indices count from the end, out-of-range bounds are clipped), positive steps.
/// The result is a handle over a core view (`memory::Buffer::view`) of exactly the bytes its
/// elements reach, laid out by `Layout::slice` (a step above 1 gives a strided view).
pub fn slice(
    py: Python<'_>,
    h: &PyDeviceBuffer,
    key: &Bound<'_, PyAny>,
) -> PyResult<PyDeviceBuffer> {
    let keys: Vec<Bound<'_, PyAny>> = match key.cast::<PyTuple>() {
        Ok(t) => t.iter().collect(),
        Err(_) => vec![key.clone()],
    };
    if keys.len() > h.shape.len() {
        return Err(PyTypeError::new_err(if h.shape.is_empty() {
            "a 0-d DeviceBuffer cannot be sliced".to_string()
        } else {
            format!(
                "too many indices: {} for a {}-d DeviceBuffer",
                keys.len(),
                h.shape.len()
            )
        }));
    }
    let mut layout = h.layout().clone();
    let mut delta = 0u64;
    for (axis, k) in keys.iter().enumerate() {
        let Ok(s) = k.cast::<PySlice>() else {
            return Err(PyTypeError::new_err(format!(
                "DeviceBuffer indices must be slices (buf[start:stop:step], or a tuple of them), got {}; use buf.view() for typed element access",
                type_name(k)
            )));
        };
        let ind = s.indices(layout.shape()[axis] as isize)?;
        if ind.step <= 0 {
            return Err(PyValueError::new_err(format!(
                "step: only positive steps give views of device memory, got step {}",
                ind.step
            )));
        }
        let start = ind.start.max(0) as usize;
        let (d, l) = layout
            .slice(axis, start, ind.step as usize, ind.slicelength)
            .map_err(RtErr)?;
        delta += d;
        layout = l;
    }
    let v = h
        .buffer(py)?
        .view(h.offset + delta, layout.span())
        .map_err(RtErr)?;
    Ok(PyDeviceBuffer::laid_out(v, 0, h.dtype, layout))
}
