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
use runtime_core::kernel::{DType, Tensor};

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
    fn dtype_<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArrayDescr>> {
        numpy_dtype(py, self.dtype)
    }

    #[getter]
    fn itemsize(&self) -> usize {
        self.dtype.size()
    }

    /// Byte offset of this view inside its allocation.
    #[getter(offset)]
    fn offset_(&self, py: Python<'_>) -> u64 {
        // A view made by pointer arithmetic or slicing is a core view starting inside the
        // allocation; this handle's offset is relative to it.
        self.buffer(py).map_or(0, |b| b.offset()) + self.offset
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

    /// A typed view of this buffer sharing its memory. With only `dtype`, numpy's
    /// `ndarray.view(dtype)`: the same shape, the last axis rescaled when the item size
    /// changes (`ValueError` where numpy refuses). With `shape` and/or `offset` (bytes, relative
    /// to this view), a view of those bytes; `shape=None` then takes as many elements as fit
    /// after `offset`, as a 1-D view.
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
        let shape = shape.filter(|s| !s.is_none());
        let offset = offset.filter(|o| !o.is_none());
        if shape.is_none() && offset.is_none() {
            let shape = self
                .dtype
                .view_shape(&self.shape_usize(), dt)
                .map_err(|e| RtErr(e.into()))?;
            Tensor::new(b.clone(), self.offset, dt, shape.clone()).map_err(RtErr)?;
            return Ok(self.derive(b, self.offset, dt, shape));
        }
        let offset = opt_nonneg(offset, "offset")?.unwrap_or(0);
        if offset > self.nbytes {
            return Err(PyValueError::new_err(format!(
                "offset: {offset} is past the end of the {}-byte buffer",
                self.nbytes
            )));
        }
        let shape = match shape {
            Some(s) => shape_arg(s, "shape")?,
            None => vec![((self.nbytes - offset) / dt.size() as u64) as usize],
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
        Tensor::new(b.clone(), abs, dt, shape.clone()).map_err(RtErr)?;
        Ok(self.derive(b, abs, dt, shape))
    }

    /// Copy to host memory and return it: into `out` when given (a writable, C-contiguous
    /// numpy array of this view's dtype and element count, as numba's `copy_to_host(ary)`
    /// and CuPy's `get(out=)`), else into a new array of this view's dtype and shape.
    /// Without `stream` the copy is blocking (ordered on the current stream); with one it is
    /// queued there, and CUDA's rule applies: into pageable memory (a new array, an ordinary
    /// numpy array) the call returns once the copy is complete; into pinned memory
    /// (`malloc_host`, `pinned_empty`) the array is written when the stream reaches it, so
    /// synchronise the stream before reading it.
    #[pyo3(signature = (out=None, stream=None))]
    fn copy_to_host<'py>(
        slf: &Bound<'py, Self>,
        out: Option<&Bound<'py, PyAny>>,
        stream: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let me = slf.get();
        let np = numpy(py)?;
        let want = numpy_dtype(py, me.dtype)?;
        let out = match out.filter(|o| !o.is_none()) {
            Some(o) => {
                check_out(o, &want, me.shape.iter().product::<isize>())?;
                o.clone()
            }
            None => np
                .getattr("empty")?
                .call1((PyTuple::new(py, me.shape.iter())?, &want))?,
        };
        copy::memcpy(
            py,
            Direction::DeviceToHost,
            &out,
            slf.as_any(),
            stream,
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
    #[pyo3(signature = (out=None, stream=None))]
    fn to_host<'py>(
        slf: &Bound<'py, Self>,
        out: Option<&Bound<'py, PyAny>>,
        stream: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        Self::copy_to_host(slf, out, stream)
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
        let asarray = np.getattr("asarray")?;
        let me = slf.get();
        let arr = if me.dtype == DType::BF16 {
            // bfloat16 has no buffer-protocol format (numpy's own bfloat16 arrays export
            // none): the same bytes as uint16, seen as bfloat16.
            let bits = Bound::new(
                py,
                me.derive(me.buffer(py)?, me.offset, DType::U16, me.shape_usize()),
            )?;
            asarray
                .call1((pyo3::types::PyMemoryView::from(bits.as_any())?,))?
                .call_method1("view", (numpy_dtype(py, DType::BF16)?,))?
        } else {
            asarray.call1((pyo3::types::PyMemoryView::from(slf.as_any())?,))?
        };
        match dtype {
            Some(t) if !t.is_none() => {
                let want = PyArrayDescr::new(py, t)?;
                if want.is_equiv_to(&numpy_dtype(py, slf.get().dtype)?) {
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

    /// Torch's `record_stream`: when this buffer's allocation is freed, its block is not
    /// reused until the work queued on `stream` at that moment has completed.
    fn record_stream(&self, py: Python<'_>, stream: &Bound<'_, PyAny>) -> PyResult<()> {
        let s = crate::convert::stream_arg(Some(stream))?
            .ok_or_else(|| PyValueError::new_err("stream: a Stream is required, got None"))?;
        self.buffer(py)?
            .record_stream(std::sync::Arc::new(s))
            .map_err(RtErr)?;
        Ok(())
    }

    /// Pointer arithmetic (CuPy's `MemoryPointer + int`): a raw byte view starting `offset`
    /// bytes after this one and ending where it ends.
    fn __add__(&self, py: Python<'_>, offset: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        match crate::views::delta(offset)? {
            Some(d) => crate::views::shifted(py, self, d),
            None => Ok(py.NotImplemented()),
        }
    }

    fn __radd__(&self, py: Python<'_>, offset: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.__add__(py, offset)
    }

    /// `buf - n`: the raw byte view starting `n` bytes before this one (inside the
    /// allocation) and ending where this one ends.
    fn __sub__(&self, py: Python<'_>, offset: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        match crate::views::delta(offset)? {
            Some(d) => {
                let neg = d
                    .checked_neg()
                    .ok_or_else(|| crate::views::out_of_range(offset))?;
                crate::views::shifted(py, self, neg)
            }
            None => Ok(py.NotImplemented()),
        }
    }

    /// `buf[start:stop]`: a view of elements `start..stop` along the first axis (bytes of a
    /// raw buffer), as numpy slices a C-contiguous array; step must be 1.
    fn __getitem__(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<PyDeviceBuffer> {
        crate::views::slice(py, self, key)
    }

    /// Whether this is managed memory (from `malloc_managed`).
    #[getter]
    fn is_managed(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(runtime_core::memory::managed::is_managed(&self.buffer(py)?))
    }

    /// A numpy array over this managed buffer's bytes (no copy; like the arrays of numba's
    /// `cuda.managed_array`): host writes are seen by later device work and device results
    /// by the host once their stream was synchronised. Device memory that is not managed is
    /// refused (read it with `copy_to_host`).
    fn host_view<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let b = slf.get().buffer(slf.py())?;
        runtime_core::memory::managed::check_managed(&b, "host_view").map_err(RtErr)?;
        Self::__array__(slf, None, None)
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

/// `copy_to_host(out=)`: `out` must be a writable, C-contiguous numpy array of dtype `want`
/// holding `size` elements.
fn check_out(out: &Bound<'_, PyAny>, want: &Bound<'_, PyArrayDescr>, size: isize) -> PyResult<()> {
    let py = out.py();
    if !out.is_instance(&numpy(py)?.getattr("ndarray")?)? {
        return Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "out must be a numpy.ndarray, got {}",
            crate::convert::type_name(out)
        )));
    }
    let dtype = out.getattr("dtype")?;
    if !dtype.eq(want)? {
        return Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "out: dtype {} does not match the buffer's dtype {}",
            dtype.str()?,
            want.str()?
        )));
    }
    let n: isize = out.getattr("size")?.extract()?;
    if n != size {
        return Err(PyValueError::new_err(format!(
            "out: has {n} elements, the buffer has {size}"
        )));
    }
    let flags = out.getattr("flags")?;
    if !flags.getattr("c_contiguous")?.extract::<bool>()? {
        return Err(PyValueError::new_err("out: must be C-contiguous"));
    }
    if !flags.getattr("writeable")?.extract::<bool>()? {
        return Err(PyValueError::new_err("out: must be writable"));
    }
    Ok(())
}
