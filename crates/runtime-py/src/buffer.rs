//! The `DeviceBuffer` class: its attributes, typed views, and its exports to Python (copy to
//! host, numpy's `__array__`, DLPack, the buffer protocol). The handle data and its liveness
//! check are in `handles`; the export mechanics in `host` (buffer protocol) and `dlpack`.
//!
//! A `DeviceBuffer` handle holds a clone of the core buffer until `device_free` takes it; every
//! export (buffer protocol, DLPack, kernel argument, queued copy) holds its own clone, so the
//! memory returns to the allocator only when the last of them is gone. After `shutdown` the
//! handle refuses every use (the core answers that its runtime is gone).

use std::ffi::c_int;

use numpy::{PyArrayDescr, PyArrayDescrMethods};
use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use crate::convert::{numpy, numpy_dtype, opt_nonneg, parse_dtype, shape_arg};
use crate::copy::{self, Direction};
use crate::dlpack;
use crate::errors::RtErr;
use crate::handles::{PyDevice, PyDeviceBuffer};
use crate::host;

#[pymethods]
impl PyDeviceBuffer {
    /// Bytes covered by this handle.
    #[getter(nbytes)]
    fn nbytes_(&self) -> u64 {
        self.nbytes
    }

    /// Number of elements (as numpy's `size`).
    #[getter]
    fn size(&self) -> usize {
        self.shape.iter().product::<isize>() as usize
    }

    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.shape.iter())
    }

    #[getter]
    fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// The numpy dtype.
    #[getter(dtype)]
    fn dtype_<'py>(&self, py: Python<'py>) -> Bound<'py, PyArrayDescr> {
        numpy_dtype(py, self.dtype)
    }

    #[getter]
    fn itemsize(&self) -> usize {
        self.dtype.size()
    }

    /// Byte offset of this view inside its allocation.
    #[getter(offset)]
    fn offset_(&self) -> u64 {
        self.offset
    }

    #[getter]
    fn device(&self) -> PyDevice {
        PyDevice::from_index(self.device)
    }

    /// Allocation id (shared by all views of one allocation).
    #[getter]
    fn id(&self) -> u64 {
        self.id
    }

    /// Host address of the first byte (the device is host-backed).
    #[getter]
    fn ptr(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.buffer(py)?.as_ptr() as usize + self.offset as usize)
    }

    /// Whether `device_free` was called on this handle (or the runtime was shut down).
    #[getter]
    fn freed(&self, py: Python<'_>) -> bool {
        self.buffer(py).is_err()
    }

    /// A typed, shaped view of part of this buffer sharing its memory.
    /// `shape=None` takes as many elements as fit after `offset` (bytes, relative to this view).
    #[pyo3(signature = (dtype, shape=None, offset=None))]
    fn view(
        &self,
        py: Python<'_>,
        dtype: &Bound<'_, PyAny>,
        shape: Option<&Bound<'_, PyAny>>,
        offset: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyDeviceBuffer> {
        let b = self.buffer(py)?;
        let dt = parse_dtype(py, dtype)?;
        let offset = opt_nonneg(offset, "offset")?.unwrap_or(0);
        if offset > self.nbytes {
            return Err(PyValueError::new_err(format!(
                "offset: {offset} is past the end of the {}-byte buffer",
                self.nbytes
            )));
        }
        let shape = match shape {
            Some(s) if !s.is_none() => shape_arg(s, "shape")?,
            _ => vec![((self.nbytes - offset) / dt.size() as u64) as usize],
        };
        let abs = self.offset + offset;
        // Check the size against this view first, so the error names `shape` (the core's
        // check below is against the whole allocation and names the offset).
        let bytes = shape
            .iter()
            .try_fold(dt.size() as u64, |a, &d| a.checked_mul(d as u64));
        match bytes {
            Some(n) if n <= self.nbytes - offset => {}
            _ => {
                return Err(PyValueError::new_err(format!(
                    "shape: a {} view of shape {shape:?} at offset {offset} does not fit in this {}-byte view",
                    dt.name(),
                    self.nbytes
                )))
            }
        }
        runtime_core::kernel::Tensor::new(b.clone(), abs, dt, shape.clone()).map_err(RtErr)?;
        Ok(self.derive(b, abs, dt, shape))
    }

    /// Copy to a new numpy array of this view's dtype and shape (blocking, ordered on the
    /// current stream).
    fn copy_to_host<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let me = slf.get();
        let np = numpy(py)?;
        let out = np.getattr("empty")?.call1((
            PyTuple::new(py, me.shape.iter())?,
            numpy_dtype(py, me.dtype),
        ))?;
        copy::memcpy(
            py,
            Direction::DeviceToHost,
            &out,
            slf.as_any(),
            None,
            None,
            None,
            None,
        )?;
        Ok(out)
    }

    /// A handle (bytes) another process opens with `runtime.ipc_open` to map this buffer's
    /// allocation zero-copy (CUDA's `cudaIpcGetMemHandle`).
    fn ipc_handle<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        crate::ipc::handle(py, self)
    }

    /// Pickled as an IPC handle (opened with `runtime.ipc_open` where it is loaded).
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        crate::ipc::reduce(slf)
    }

    /// `copy.copy`: another handle on the same memory.
    fn __copy__(&self, py: Python<'_>) -> PyResult<PyDeviceBuffer> {
        self.share(py)
    }

    /// `copy.deepcopy`: a new buffer with a copy of the bytes.
    fn __deepcopy__<'py>(
        slf: &Bound<'py, Self>,
        _memo: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        crate::ipc::deepcopy(slf)
    }

    /// Alias of `copy_to_host`.
    fn to_host<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        Self::copy_to_host(slf)
    }

    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<&Bound<'_, PyAny>>,
        max_version: Option<&Bound<'_, PyAny>>,
        dl_device: Option<&Bound<'_, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let _ = stream;
        let versioned = dlpack::request(py, max_version, dl_device, copy)?;
        dlpack::export(
            py,
            self.buffer(py)?,
            self.offset,
            self.dtype,
            &self.shape_usize(),
            versioned,
        )
    }

    /// numpy conversion. numpy takes the buffer protocol first and only falls back to
    /// `__array__` when that fails; it swallows buffer-protocol errors, so without this a freed
    /// handle would silently become a 0-d object array instead of raising
    /// `InvalidHandleError`.
    #[pyo3(signature = (dtype=None, copy=None))]
    fn __array__<'py>(
        slf: &Bound<'py, Self>,
        dtype: Option<&Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        slf.get().buffer(py)?;
        let np = numpy(py)?;
        let arr = np
            .getattr("asarray")?
            .call1((pyo3::types::PyMemoryView::from(slf.as_any())?,))?;
        match dtype {
            Some(t) if !t.is_none() => {
                let want = PyArrayDescr::new(py, t)?;
                if want.is_equiv_to(&numpy_dtype(py, slf.get().dtype)) {
                    if copy == Some(true) {
                        return arr.call_method0("copy");
                    }
                    return Ok(arr);
                }
                if copy == Some(false) {
                    return Err(PyValueError::new_err(format!(
                        "dtype: converting {} to {} needs a copy, but copy=False",
                        slf.get().dtype.name(),
                        want.str()?
                    )));
                }
                arr.call_method1("astype", (want,))
            }
            _ if copy == Some(true) => arr.call_method0("copy"),
            _ => Ok(arr),
        }
    }

    fn __dlpack_device__(&self) -> (i32, i32) {
        (dlpack::KDL_CPU, 0)
    }

    fn __len__(&self) -> usize {
        self.shape.first().copied().unwrap_or(1) as usize
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let state = if self.buffer(py).is_ok() {
            ""
        } else {
            ", freed"
        };
        let shape: Vec<String> = self.shape.iter().map(|d| d.to_string()).collect();
        let comma = if shape.len() == 1 { "," } else { "" };
        format!(
            "DeviceBuffer(id={}, device={}, nbytes={}, dtype={}, shape=({}{comma}), offset={}{state})",
            self.id, self.device, self.nbytes, self.dtype.name(), shape.join(", "), self.offset
        )
    }

    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        // SAFETY: `view` is the Py_buffer Python passed to `__getbuffer__`.
        unsafe { host::export_view(slf, view, flags) }
    }

    unsafe fn __releasebuffer__(&self, view: *mut ffi::Py_buffer) {
        // SAFETY: `view` was filled by `__getbuffer__` (`host::export_view`).
        unsafe { host::release_view(view) }
    }
}
