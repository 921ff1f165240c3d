//! Allocation and release of device buffers: `device_malloc`, `device_free`, `empty`,
//! `to_device`, and the stream-ordered `malloc_async` / `free_async`.

use numpy::{PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use runtime_core::device::Device;
use runtime_core::kernel::DType;
use runtime_core::memory::Layout;

use crate::convert::{
    buffer_arg, device_dtype, naming, nonneg, numpy, parse_dtype, resolve, resolve_required,
    shape_arg,
};
use crate::copy::{self, Direction};
use crate::errors::RtErr;
use crate::handles::PyDeviceBuffer;

/// Allocate `size` zeroed bytes on `device` (a Device or an int).
#[pyfunction]
pub fn device_malloc(
    py: Python<'_>,
    device: &Bound<'_, PyAny>,
    size: &Bound<'_, PyAny>,
) -> PyResult<PyDeviceBuffer> {
    let d = resolve_required(device, "device")?;
    let size = nonneg(size, "size")?;
    let b = crate::pool::alloc(py, &d, size)?;
    Ok(PyDeviceBuffer::raw(b))
}

/// Free a buffer handle. Later use of the handle raises `InvalidHandleError`; the memory goes
/// back to the pool once no view or queued operation uses it.
#[pyfunction]
pub fn device_free(py: Python<'_>, buf: &Bound<'_, PyAny>) -> PyResult<()> {
    buffer_arg(buf, "buf")?.get().free(py)?;
    crate::pool::return_blocks(py);
    Ok(())
}

/// Allocate `size` bytes in the order of `stream` (the current stream when None), from its
/// device's async pool (`cudaMallocAsync`); never waits.
#[pyfunction]
#[pyo3(signature = (size, stream=None))]
pub fn malloc_async(
    py: Python<'_>,
    size: &Bound<'_, PyAny>,
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyDeviceBuffer> {
    let size = nonneg(size, "size")?;
    let s = crate::convert::stream_or_current(py, stream)?;
    let b = py.detach(|| s.malloc_async(size)).map_err(RtErr)?;
    Ok(PyDeviceBuffer::raw(b))
}

/// Free `buf` (from `malloc_async`) in the order of `stream` (the current stream of its
/// device when None): `cudaFreeAsync`; never waits. Later use of the handle raises.
#[pyfunction]
#[pyo3(signature = (buf, stream=None))]
pub fn free_async(
    py: Python<'_>,
    buf: &Bound<'_, PyAny>,
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let h = buffer_arg(buf, "buf")?.get();
    let s = match crate::convert::stream_arg(stream)? {
        Some(s) => s,
        None => {
            let d = resolve(py, Some(&h.device.into_pyobject(py)?.into_any()), "buf")?;
            crate::context::stream(py, &d)?
        }
    };
    h.free_with(py, "free_async()", |b| s.free_async(b))
}

/// Allocate a typed buffer of `shape` and `dtype` on `device` (zeroed), its elements in C
/// (row-major, the default) or F (column-major, `order="F"`) order.
#[pyfunction]
#[pyo3(signature = (shape, dtype=None, device=None, order="C"))]
pub fn empty(
    py: Python<'_>,
    shape: &Bound<'_, PyAny>,
    dtype: Option<&Bound<'_, PyAny>>,
    device: Option<&Bound<'_, PyAny>>,
    order: &str,
) -> PyResult<PyDeviceBuffer> {
    let fortran = match order {
        "C" | "c" => false,
        "F" | "f" => true,
        _ => {
            return Err(PyValueError::new_err(format!(
                "order: must be 'C' or 'F', got {order:?}"
            )))
        }
    };
    let d = resolve(py, device, "device")?;
    let dt = match dtype {
        Some(t) if !t.is_none() => parse_dtype(py, t)?,
        _ => DType::F32,
    };
    let shape = shape_arg(shape, "shape")?;
    allocate(py, &d, dt, shape, fortran)
}

/// A zeroed buffer of `shape` and `dt` on `d` (through the plugged allocator, if any), in C
/// order or (`fortran`) F order.
fn allocate(
    py: Python<'_>,
    d: &Device,
    dt: DType,
    shape: Vec<usize>,
    fortran: bool,
) -> PyResult<PyDeviceBuffer> {
    let n = shape
        .iter()
        .try_fold(dt.size() as u64, |a, &b| a.checked_mul(b as u64))
        .ok_or_else(|| PyValueError::new_err(format!("shape: {shape:?} is too large")))?;
    let b = crate::pool::alloc(py, d, n)?;
    let layout = if fortran {
        Layout::f(shape, dt.size())
    } else {
        Layout::c(shape, dt.size())
    };
    Ok(PyDeviceBuffer::laid_out(b, 0, dt, layout))
}

/// Allocate a device buffer holding a copy of `array` (same dtype and shape): a numpy array,
/// anything `numpy.asarray` takes, or any DLPack producer whose memory is on the CPU (a torch
/// tensor, bfloat16 included: `dlpack::host_view`). An F-contiguous array stays F-ordered on
/// the device (the same strides, as numba's `to_device`); any other layout is copied
/// C-contiguous.
#[pyfunction]
#[pyo3(signature = (array, device=None, stream=None))]
pub fn to_device<'py>(
    py: Python<'py>,
    array: &Bound<'py, PyAny>,
    device: Option<&Bound<'py, PyAny>>,
    stream: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyDeviceBuffer>> {
    let np = numpy(py)?;
    let imported = crate::dlpack::host_view(py, array, "array")?;
    let array = imported.as_ref().unwrap_or(array);
    // An F-ordered array (not also C-ordered: one axis, or axes of length 1) keeps its layout.
    let fortran = match array.cast::<PyUntypedArray>() {
        Ok(a) => a.is_fortran_contiguous() && !a.is_c_contiguous(),
        Err(_) => false,
    };
    // `asarray(order="C")`, not `ascontiguousarray`: the latter turns 0-d arrays into 1-d.
    let kw = PyDict::new(py);
    kw.set_item("order", if fortran { "F" } else { "C" })?;
    // numpy's message for ragged or unconvertible data does not name the argument.
    let mut arr = np
        .getattr("asarray")?
        .call((array,), Some(&kw))
        .map_err(|e| naming(py, "array", e))?
        .cast_into::<PyUntypedArray>()?;
    let mut dtype = arr.dtype();
    // Device memory is in the host's byte order: convert data in the other one (as
    // `cupy.asarray` does) rather than copy its bytes as if they were native.
    if dtype.is_native_byteorder() == Some(false) {
        dtype = dtype.call_method1("newbyteorder", ("=",))?.cast_into()?;
        arr = arr.call_method1("astype", (&dtype,))?.cast_into()?;
    }
    let d = resolve(py, device, "device")?;
    let dt = device_dtype(&dtype)?;
    let buf = Bound::new(py, allocate(py, &d, dt, arr.shape().to_vec(), fortran)?)?;
    let dir = Direction::HostToDevice;
    // The F array's bytes in memory order are its transpose's C order.
    let src = if fortran {
        arr.getattr("T")?
    } else {
        arr.into_any()
    };
    copy::memcpy(py, dir, buf.as_any(), &src, stream, None, None, None)?;
    Ok(buf)
}
