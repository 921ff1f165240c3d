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
use pyo3::types::{PyBytes, PyDict, PyTuple};

use crate::convert::{numpy, numpy_dtype, opt_nonneg, parse_dtype, shape_arg};
use crate::copy::{self, Direction};
use crate::dlpack;
use crate::errors::RtErr;
use crate::handles::{PyDevice, PyDeviceBuffer};
use crate::host;
use runtime_core::kernel::{DType, Tensor};
use runtime_core::memory::Layout;

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

    /// Bytes between neighbouring elements along each axis (numpy's `strides`).
    #[getter]
    fn strides<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.strides.iter())
    }

    /// numpy's contiguity flags, as numba's `DeviceNDArray.flags` gives them: a new dict with
    /// `C_CONTIGUOUS` and `F_CONTIGUOUS`.
    #[getter]
    fn flags<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("C_CONTIGUOUS", self.layout().is_c_contiguous())?;
        d.set_item("F_CONTIGUOUS", self.layout().is_f_contiguous())?;
        Ok(d)
    }

    /// Whether the elements are in C (row-major) order without gaps (numba's name).
    fn is_c_contiguous(&self) -> bool {
        self.layout().is_c_contiguous()
    }

    /// Whether the elements are in Fortran (column-major) order without gaps.
    fn is_f_contiguous(&self) -> bool {
        self.layout().is_f_contiguous()
    }

    /// The view with its axes reversed (numpy's `.T`): a C-ordered buffer gives an
    /// F-ordered view of the same memory.
    #[getter(T)]
    fn t(&self, py: Python<'_>) -> PyResult<PyDeviceBuffer> {
        self.transpose(py, None)
    }

    /// The view with its axes permuted (numpy's `transpose(axes)`; reversed without
    /// `axes`), sharing the memory.
    #[pyo3(signature = (axes=None))]
    fn transpose(
        &self,
        py: Python<'_>,
        axes: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyDeviceBuffer> {
        let b = self.buffer(py)?;
        let layout = match axes.filter(|a| !a.is_none()) {
            None => self.layout().transpose(),
            Some(a) => {
                // numpy's axes: a tuple or list of ints, negative ones counted from the end.
                let ndim = self.shape.len() as i64;
                let axes = a
                    .try_iter()
                    .map_err(|_| {
                        pyo3::exceptions::PyTypeError::new_err(format!(
                            "axes must be a tuple or list of ints, got {}",
                            a.get_type()
                                .name()
                                .map(|n| n.to_string())
                                .unwrap_or_default()
                        ))
                    })?
                    .map(|x| {
                        let i: i64 = x?.extract().map_err(|_| {
                            pyo3::exceptions::PyTypeError::new_err("axes must hold ints")
                        })?;
                        let j = if i < 0 { i + ndim } else { i };
                        usize::try_from(j)
                            .ok()
                            .filter(|&j| (j as i64) < ndim)
                            .ok_or_else(|| {
                                PyValueError::new_err(format!(
                                    "axes: axis {i} is out of range for {ndim} axes"
                                ))
                            })
                    })
                    .collect::<PyResult<Vec<usize>>>()?;
                self.layout().permute(&axes).map_err(RtErr)?
            }
        };
        Ok(PyDeviceBuffer::laid_out(b, self.offset, self.dtype, layout))
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
    /// after `offset`, as a 1-D view. With `strides` (bytes, non-negative multiples of the
    /// item size; `shape` required), the elements are laid out by them, as numpy's
    /// `ndarray(shape, dtype, buffer, offset, strides)` and numba's
    /// `DeviceNDArray(shape, strides, dtype, gpu_data=)`: every element must fall inside
    /// this view.
    #[pyo3(signature = (dtype, shape=None, offset=None, strides=None))]
    fn view(
        &self,
        py: Python<'_>,
        dtype: &Bound<'_, PyAny>,
        shape: Option<&Bound<'_, PyAny>>,
        offset: Option<&Bound<'_, PyAny>>,
        strides: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyDeviceBuffer> {
        let b = self.buffer(py)?;
        let dt = parse_dtype(py, dtype)?;
        let shape = shape.filter(|s| !s.is_none());
        let offset = offset.filter(|o| !o.is_none());
        if let Some(st) = strides.filter(|s| !s.is_none()) {
            let Some(shape) = shape else {
                return Err(pyo3::exceptions::PyTypeError::new_err(
                    "strides: a view with strides needs its shape",
                ));
            };
            let shape = shape_arg(shape, "shape")?;
            let strides = shape_arg(st, "strides").map_err(|e| {
                PyValueError::new_err(e.value(py).to_string().replace("dimensions", "strides"))
            })?;
            if let Some(bad) = strides.iter().find(|&&s| s % dt.size() != 0) {
                return Err(PyValueError::new_err(format!(
                    "strides: {bad} is not a multiple of the {} item size {}",
                    dt.name(),
                    dt.size()
                )));
            }
            let (_, nbytes) = self.contiguous_bytes("strides")?;
            let offset = opt_nonneg(offset, "offset")?.unwrap_or(0);
            let layout = Layout::new(shape, strides, dt.size()).map_err(RtErr)?;
            let fits = offset
                .checked_add(layout.span())
                .is_some_and(|end| end <= nbytes);
            if !fits {
                return Err(PyValueError::new_err(format!(
                    "shape: shape {:?} with strides {:?} reaches {} bytes from offset {offset}, past the end of this {nbytes}-byte view",
                    layout.shape(),
                    layout.strides(),
                    layout.span()
                )));
            }
            let abs = self.offset + offset;
            // The core checks the alignment of the first element and the range.
            Tensor::new(b.clone(), abs, dt, vec![0]).map_err(RtErr)?;
            b.check_range("shape", abs, layout.span()).map_err(RtErr)?;
            return Ok(PyDeviceBuffer::laid_out(b, abs, dt, layout));
        }
        if shape.is_none() && offset.is_none() {
            if dt.size() == self.dtype.size() && !self.layout().is_c_contiguous() {
                // Same item size: the same layout (numpy and numba keep the strides).
                let l = Layout::new(
                    self.shape_usize(),
                    self.layout().strides().to_vec(),
                    dt.size(),
                )
                .map_err(RtErr)?;
                return Ok(PyDeviceBuffer::laid_out(b, self.offset, dt, l));
            }
            self.require_c_contiguous("dtype", "views that change the item size")?;
            let shape = self
                .dtype
                .view_shape(&self.shape_usize(), dt)
                .map_err(|e| RtErr(e.into()))?;
            Tensor::new(b.clone(), self.offset, dt, shape.clone()).map_err(RtErr)?;
            return Ok(self.derive(b, self.offset, dt, shape));
        }
        // A view by shape and offset reads this view's bytes as one range.
        let (_, nbytes) = self.contiguous_bytes("offset")?;
        let offset = opt_nonneg(offset, "offset")?.unwrap_or(0);
        if offset > nbytes {
            return Err(PyValueError::new_err(format!(
                "offset: {offset} is past the end of the {nbytes}-byte buffer"
            )));
        }
        let shape = match shape {
            Some(s) => shape_arg(s, "shape")?,
            None => vec![((nbytes - offset) / dt.size() as u64) as usize],
        };
        let abs = self.offset + offset;
        // Check the size against this view first, so the error names `shape` (the core's
        // check below is against the whole allocation and names the offset).
        let bytes = shape
            .iter()
            .try_fold(dt.size() as u64, |a, &d| a.checked_mul(d as u64));
        match bytes {
            Some(n) if n <= nbytes - offset => {}
            _ => {
                return Err(PyValueError::new_err(format!(
                    "shape: a {} view of shape {shape:?} at offset {offset} does not fit in this {nbytes}-byte view",
                    dt.name(),
                )))
            }
        }
        Tensor::new(b.clone(), abs, dt, shape.clone()).map_err(RtErr)?;
        Ok(self.derive(b, abs, dt, shape))
    }

    /// Copy to host memory and return it: into `out` when given (a writable numpy array of
    /// this view's dtype, as numba's `copy_to_host(ary)` and CuPy's `get(out=)`: a C-ordered
    /// view copies into any C-contiguous array of its element count; otherwise `out` must
    /// have this view's shape and gets its values in its own layout, as `numpy.copyto`
    /// gives them), else into a new array of this view's dtype, shape and strides (numba's
    /// rule: an F-ordered buffer gives an F-ordered array; a strided view gives an array
    /// with the same strides over a copy of every byte the view reaches).
    /// Without `stream` the copy is blocking (ordered on the current stream); with one it is
    /// queued there, and CUDA's rule applies: into pageable memory (a new array, an ordinary
    /// numpy array) the call returns once the copy is complete; into pinned memory
    /// (`malloc_host`, `pinned_empty`) the array is written when the stream reaches it, so
    /// synchronise the stream before reading it. A copy between two layouts is staged
    /// through a host array, so it completes before the call returns.
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
        let c_order = me.layout().is_c_contiguous();
        let out = match out.filter(|o| !o.is_none()) {
            Some(o) => {
                check_out(o, &want, me.shape.iter().product::<isize>())?;
                if !(c_order && is_c_contiguous(o)?) {
                    // Between layouts: numpy's copyto from a host copy in this view's layout,
                    // into an array that is one range of memory (as CuPy's `get(out=)`).
                    let flags = o.getattr("flags")?;
                    if !flags.getattr("c_contiguous")?.extract::<bool>()?
                        && !flags.getattr("f_contiguous")?.extract::<bool>()?
                    {
                        return Err(PyValueError::new_err(
                            "out: must be C-contiguous or F-contiguous",
                        ));
                    }
                    check_out_writable(o)?;
                    check_out_shape(o, &me.shape)?;
                    let staged = Self::copy_to_host(slf, None, stream)?;
                    np.getattr("copyto")?.call1((o, staged))?;
                    return Ok(o.clone());
                }
                check_out_writable(o)?;
                o.clone()
            }
            None if c_order => np
                .getattr("empty")?
                .call1((PyTuple::new(py, me.shape.iter())?, &want))?,
            None => {
                // Every byte the view reaches, then numpy's array of this view's strides
                // over them (numba's `copy_to_host`).
                me.buffer(py)?;
                let raw = np
                    .getattr("empty")?
                    .call1((me.layout().span(), np.getattr("uint8")?))?;
                copy::span_to_host(py, &raw, me, stream)?;
                let kw = PyDict::new(py);
                kw.set_item("shape", PyTuple::new(py, me.shape.iter())?)?;
                kw.set_item("dtype", &want)?;
                kw.set_item("buffer", &raw)?;
                kw.set_item("strides", PyTuple::new(py, me.strides.iter())?)?;
                return np.getattr("ndarray")?.call((), Some(&kw));
            }
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

    /// Copy `ary` into this view (numba's `copy_to_device`): a host array (anything numpy
    /// converts; its dtype must be this view's) or another `DeviceBuffer`, of this view's
    /// shape (axes of length 1 aside). Every element goes to the same index here whatever
    /// the two layouts are (numpy's `copyto`): a C host array into an F-ordered buffer gives
    /// that buffer numpy's F layout of the values. Without `stream` the copy is blocking;
    /// with one it is queued there (a host source is read before the call returns).
    #[pyo3(signature = (ary, stream=None))]
    fn copy_to_device<'py>(
        slf: &Bound<'py, Self>,
        ary: &Bound<'py, PyAny>,
        stream: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<()> {
        let py = slf.py();
        let me = slf.get();
        me.buffer(py)?;
        let np = numpy(py)?;
        if let Ok(src) = ary.cast::<PyDeviceBuffer>() {
            let src = src.get();
            if src.dtype != me.dtype {
                return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                    "ary: dtype {} does not match the buffer's dtype {}",
                    src.dtype.name(),
                    me.dtype.name()
                )));
            }
            let src_layout = squeezed_like(src.layout(), me.layout(), "ary")?;
            let src = PyDeviceBuffer::laid_out(src.buffer(py)?, src.offset, src.dtype, src_layout);
            return copy::d2d_elements(py, me, &src, stream);
        }
        let want = numpy_dtype(py, me.dtype)?;
        let host = np
            .getattr("asarray")?
            .call1((ary,))
            .map_err(|e| crate::convert::naming(py, "ary", e))?;
        let dtype = host.getattr("dtype")?;
        if !dtype.eq(&want)? {
            return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "ary: dtype {} does not match the buffer's dtype {}",
                dtype.str()?,
                want.str()?
            )));
        }
        check_out_shape(&host, &me.shape).map_err(|_| {
            PyValueError::new_err(format!(
                "ary: shape {} does not match the buffer's shape {:?}",
                host.getattr("shape")
                    .and_then(|s| s.str())
                    .map(|s| s.to_string())
                    .unwrap_or_default(),
                me.shape_usize()
            ))
        })?;
        let host = host.call_method1("reshape", (PyTuple::new(py, me.shape.iter())?,))?;
        let layout = me.layout();
        if layout.is_c_contiguous() {
            // A strided host array is compacted by the copy itself.
            return copy::memcpy(
                py,
                Direction::HostToDevice,
                slf.as_any(),
                &host,
                stream,
                None,
                None,
                None,
            );
        }
        if !layout.is_dense() {
            // A strided view: the values are staged now (C order) and one stream op puts
            // them in element by element, holding this view's allocation while it does. The
            // gaps between the view's elements keep what the work before it left there; a
            // read of them to the host and a write back would undo whatever wrote them in
            // between (another view's copy queued on the same stream, another thread's).
            let bytes = np
                .getattr("ascontiguousarray")?
                .call1((&host,))?
                .call_method0("tobytes")?;
            let bytes = bytes.cast::<PyBytes>()?.as_bytes().to_vec();
            return copy::h2d_elements(py, me, bytes, stream);
        }
        // A dense view in another order (F, a transpose): its elements cover its bytes, so
        // they are laid out on the host in its own layout with numpy's copyto and copied as
        // one range.
        let raw = np
            .getattr("zeros")?
            .call1((layout.span(), np.getattr("uint8")?))?;
        let kw = PyDict::new(py);
        kw.set_item("shape", PyTuple::new(py, me.shape.iter())?)?;
        kw.set_item("dtype", &want)?;
        kw.set_item("buffer", &raw)?;
        kw.set_item("strides", PyTuple::new(py, me.strides.iter())?)?;
        let staged = np.getattr("ndarray")?.call((), Some(&kw))?;
        np.getattr("copyto")?.call1((&staged, &host))?;
        copy::span_to_device(py, me, &raw, stream)
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
        let item = self.dtype.size() as i64;
        let strides: Vec<i64> = self.strides.iter().map(|&s| s as i64 / item).collect();
        dlpack::export(
            py,
            self.buffer(py)?,
            self.offset,
            self.dtype,
            &self.shape_usize(),
            &strides,
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
                PyDeviceBuffer::laid_out(
                    me.buffer(py)?,
                    me.offset,
                    DType::U16,
                    me.layout().clone(),
                ),
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

    /// `buf[start:stop:step]`, or a tuple of slices (one per leading axis): a view of the
    /// same memory, as numpy slices (a step above 1 gives a strided view); the step must be
    /// positive.
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
        let tuple = |v: &[isize]| {
            let parts: Vec<String> = v.iter().map(|d| d.to_string()).collect();
            let comma = if parts.len() == 1 { "," } else { "" };
            format!("({}{comma})", parts.join(", "))
        };
        // Strides are shown only where they are not C order's.
        let strides = if self.layout().is_c_contiguous() {
            String::new()
        } else {
            format!(", strides={}", tuple(&self.strides))
        };
        format!(
            "DeviceBuffer(id={}, device={}, nbytes={}, dtype={}, shape={}{strides}, offset={}{state})",
            self.id, self.device, self.nbytes, self.dtype.name(), tuple(&self.shape), self.offset
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

/// `copy_to_host(out=)`: `out` must be a numpy array of dtype `want` holding `size`
/// elements.
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
    check_out_writable(out)
}

fn check_out_writable(out: &Bound<'_, PyAny>) -> PyResult<()> {
    if !out
        .getattr("flags")?
        .getattr("writeable")?
        .extract::<bool>()?
    {
        return Err(PyValueError::new_err("out: must be writable"));
    }
    Ok(())
}

/// Whether numpy array `a` is C-contiguous.
fn is_c_contiguous(a: &Bound<'_, PyAny>) -> PyResult<bool> {
    a.getattr("flags")?.getattr("c_contiguous")?.extract()
}

/// A copy between layouts takes an array of the view's shape; axes of length 1 aside (as
/// numba compares squeezed shapes).
fn check_out_shape(out: &Bound<'_, PyAny>, shape: &[isize]) -> PyResult<()> {
    let theirs: Vec<isize> = out.getattr("shape")?.extract()?;
    let squeeze = |v: &[isize]| v.iter().copied().filter(|&d| d != 1).collect::<Vec<_>>();
    if squeeze(&theirs) != squeeze(shape) {
        return Err(PyValueError::new_err(format!(
            "out: shape {theirs:?} differs from the buffer's {shape:?}; a copy between layouts (this view is not C-contiguous, or out is not) keeps the shape"
        )));
    }
    Ok(())
}

/// `src`'s layout with `like`'s shape, where the two differ only in axes of length 1 (their
/// strides do not matter); a `ValueError` naming `arg` otherwise.
fn squeezed_like(src: &Layout, like: &Layout, arg: &str) -> PyResult<Layout> {
    let keep = |l: &Layout| -> Vec<(usize, usize)> {
        l.shape()
            .iter()
            .zip(l.strides())
            .filter(|(&d, _)| d != 1)
            .map(|(&d, &s)| (d, s))
            .collect()
    };
    let (a, b) = (keep(src), keep(like));
    if a.iter().map(|p| p.0).ne(b.iter().map(|p| p.0)) {
        return Err(PyValueError::new_err(format!(
            "{arg}: shape {:?} does not match the buffer's shape {:?}",
            src.shape(),
            like.shape()
        )));
    }
    let mut it = a.into_iter();
    let strides: Vec<usize> = like
        .shape()
        .iter()
        .map(|&d| {
            if d == 1 {
                src.itemsize()
            } else {
                it.next().map_or(0, |p| p.1)
            }
        })
        .collect();
    Layout::new(like.shape().to_vec(), strides, src.itemsize()).map_err(|e| RtErr(e).into())
}
