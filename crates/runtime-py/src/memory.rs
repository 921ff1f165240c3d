//! Device buffers as Python objects (buffer protocol, DLPack, typed views), host buffers as
//! copy sources and destinations, and the memory functions.
//!
//! A `DeviceBuffer` handle holds a clone of the core buffer until `device_free` takes it; every
//! export (buffer protocol, DLPack, kernel argument, queued copy) holds its own clone, so the
//! memory returns to the allocator only when the last of them is gone. After `shutdown` the
//! handle refuses every use (its runtime generation no longer matches).

use std::ffi::{c_int, c_void, CStr};
use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyDict, PyTuple};
use runtime_core::kernel::DType;
use runtime_core::memory::Buffer;
use runtime_core::runtime as rt;
use runtime_core::stream::copy::{self, HostMemory};
use runtime_core::stream::{Op, Stream};

use crate::device::{device_arg, resolve, resolve_required, PyDevice};
use crate::errors::{self, RtErr};
use crate::stream::{sync_stream, PyStream};

static NUMPY: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// The numpy module (imported once).
pub fn numpy(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    Ok(NUMPY
        .get_or_try_init(py, || py.import("numpy").map(Bound::unbind))?
        .bind(py))
}

/// A device memory handle: raw bytes from `device_malloc`, or a typed, shaped view.
#[pyclass(name = "DeviceBuffer", module = "runtime", frozen, weakref)]
pub struct PyDeviceBuffer {
    slot: Mutex<Option<Buffer>>,
    generation: u64,
    id: u64,
    device: usize,
    offset: u64,
    dtype: DType,
    shape: Vec<isize>,
    strides: Vec<isize>,
    nbytes: u64,
}

fn c_format(d: DType) -> &'static CStr {
    match d {
        DType::F32 => c"f",
        DType::F64 => c"d",
        DType::I32 => c"i",
        DType::I64 => c"q",
        DType::U8 => c"B",
    }
}

impl PyDeviceBuffer {
    /// A handle over `buffer` (raw bytes).
    pub fn raw(buffer: Buffer, generation: u64) -> Self {
        let n = buffer.size();
        Self::typed(buffer, generation, 0, DType::U8, vec![n as usize])
    }

    /// A typed handle over part of `buffer` (range already checked).
    pub fn typed(
        buffer: Buffer,
        generation: u64,
        offset: u64,
        dtype: DType,
        shape: Vec<usize>,
    ) -> Self {
        let item = dtype.size() as isize;
        let mut strides = vec![0isize; shape.len()];
        let mut acc = item;
        for i in (0..shape.len()).rev() {
            strides[i] = acc;
            acc *= shape[i] as isize;
        }
        let nbytes = shape.iter().product::<usize>() as u64 * dtype.size() as u64;
        PyDeviceBuffer {
            id: buffer.id(),
            device: buffer.device(),
            slot: Mutex::new(Some(buffer)),
            generation,
            offset,
            dtype,
            shape: shape.iter().map(|&d| d as isize).collect(),
            strides,
            nbytes,
        }
    }

    fn what(&self) -> String {
        format!(
            "DeviceBuffer#{} (device {}, {} bytes)",
            self.id, self.device, self.nbytes
        )
    }

    /// The live core buffer, or `InvalidHandleError`.
    pub fn buffer(&self, py: Python<'_>) -> PyResult<Buffer> {
        let live = rt::get()
            .map(|r| r.generation() == self.generation)
            .unwrap_or(false);
        if !live {
            return Err(errors::invalid_handle(
                py,
                self.what(),
                "the runtime was shut down since it was allocated",
            ));
        }
        self.slot.lock().clone().ok_or_else(|| {
            errors::invalid_handle(py, self.what(), "it was freed with device_free()")
        })
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn offset(&self) -> u64 {
        self.offset
    }

    pub fn nbytes(&self) -> u64 {
        self.nbytes
    }

    pub fn shape_usize(&self) -> Vec<usize> {
        self.shape.iter().map(|&d| d as usize).collect()
    }

    /// A new handle sharing this one's memory (used for kernel arguments).
    pub fn share(&self, py: Python<'_>) -> PyResult<PyDeviceBuffer> {
        Ok(Self::typed(
            self.buffer(py)?,
            self.generation,
            self.offset,
            self.dtype,
            self.shape_usize(),
        ))
    }

    /// Free the handle (`device_free`).
    fn free(&self, py: Python<'_>) -> PyResult<()> {
        self.buffer(py)?;
        // Take under the lock: of two racing frees exactly one succeeds. The buffer is dropped
        // after the lock is released (dropping may return the block to the allocator).
        let taken = self.slot.lock().take();
        match taken {
            Some(_) => Ok(()),
            None => Err(errors::invalid_handle(
                py,
                self.what(),
                "it was freed with device_free()",
            )),
        }
    }
}

/// numpy's own `TypeError` / `ValueError` with the argument's name in front (the original
/// stays as `__cause__`); other exceptions pass through.
fn naming(py: Python<'_>, arg: &str, e: PyErr) -> PyErr {
    let text = format!("{arg}: {}", e.value(py));
    let named = if e.is_instance_of::<PyTypeError>(py) {
        PyTypeError::new_err(text)
    } else if e.is_instance_of::<PyValueError>(py) {
        PyValueError::new_err(text)
    } else {
        return e;
    };
    named.set_cause(py, Some(e));
    named
}

fn parse_dtype(py: Python<'_>, dtype: &Bound<'_, PyAny>) -> PyResult<DType> {
    // Fix: numpy's message ("Cannot interpret '3' as a data type") did not name `dtype`.
    let name: String = numpy(py)?
        .getattr("dtype")?
        .call1((dtype,))
        .map_err(|e| naming(py, "dtype", e))?
        .getattr("name")?
        .extract()?;
    DType::parse(&name).ok_or_else(|| {
        PyTypeError::new_err(format!(
            "dtype {name} is not supported; use float32, float64, int32, int64 or uint8"
        ))
    })
}

fn shape_arg(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<Vec<usize>> {
    if let Ok(n) = obj.extract::<i64>() {
        if obj.is_instance_of::<PyBool>() {
            return Err(PyTypeError::new_err(format!(
                "{arg} must be an int or a tuple of ints, got bool"
            )));
        }
        return usize::try_from(n).map(|n| vec![n]).map_err(|_| {
            PyValueError::new_err(format!("{arg}: dimensions must be >= 0, got {n}"))
        });
    }
    let t: Vec<i64> = obj
        .extract()
        .map_err(|_| PyTypeError::new_err(format!("{arg} must be an int or a tuple of ints")))?;
    t.into_iter()
        .map(|n| {
            usize::try_from(n).map_err(|_| {
                PyValueError::new_err(format!("{arg}: dimensions must be >= 0, got {n}"))
            })
        })
        .collect()
}

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
    fn dtype_<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        numpy(py)?.getattr("dtype")?.call1((self.dtype.name(),))
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
        Ok(PyDeviceBuffer::typed(b, self.generation, abs, dt, shape))
    }

    /// Copy to a new numpy array of this view's dtype and shape (blocking, ordered on the
    /// current stream).
    fn copy_to_host<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let me = slf.get();
        let np = numpy(py)?;
        let out = np
            .getattr("empty")?
            .call1((PyTuple::new(py, me.shape.iter())?, me.dtype.name()))?;
        memcpy_device_to_host(py, &out, slf.as_any(), None, None, None, None)?;
        Ok(out)
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
        // Fix: `dl_device: Option<(i32, i32)>` raised OverflowError for out-of-range ints
        // (e.g. `dl_device=(2**40, 0)`); out of range is a ValueError, anything else a
        // TypeError, both naming the argument.
        let dl_device: Option<(i64, i64)> = match dl_device {
            Some(v) if !v.is_none() => Some(v.extract::<(i64, i64)>().map_err(|e| {
                let r = v.repr().map(|r| r.to_string()).unwrap_or_default();
                if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(py) {
                    PyValueError::new_err(format!("dl_device: {r} is out of range"))
                } else {
                    PyTypeError::new_err(format!(
                        "dl_device must be a (device_type, device_id) tuple of ints or None, got {r}"
                    ))
                }
            })?),
            _ => None,
        };
        let max_version: Option<(u32, u32)> = match max_version {
            Some(v) if !v.is_none() => Some(v.extract().map_err(|_| {
                PyTypeError::new_err(format!(
                    "max_version must be a (major, minor) tuple of ints or None, got {}",
                    v.repr().map(|r| r.to_string()).unwrap_or_default()
                ))
            })?),
            _ => None,
        };
        if let Some((t, id)) = dl_device {
            if t != i64::from(crate::dlpack::KDL_CPU) {
                return Err(PyBufferError::new_err(format!("DeviceBuffer memory is host memory (kDLCPU = 1); cannot export to device type {t}")));
            }
            // Fix: the device id was ignored; __dlpack_device__ says (kDLCPU, 0).
            if id != 0 {
                return Err(PyBufferError::new_err(format!(
                    "dl_device: DeviceBuffer memory is exported as (kDLCPU = 1, device id 0); cannot export to device id {id}"
                )));
            }
        }
        if copy == Some(true) {
            return Err(PyBufferError::new_err(
                "copy=True is not supported: export shares memory; use copy_to_host() for a copy",
            ));
        }
        crate::dlpack::export(
            py,
            self.buffer(py)?,
            self.offset,
            self.dtype,
            &self.shape_usize(),
            crate::dlpack::wants_versioned(max_version),
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
                let want = np.getattr("dtype")?.call1((t,))?;
                if want.eq(arr.getattr("dtype")?)? {
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
        (crate::dlpack::KDL_CPU, 0)
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
        let py = slf.py();
        let me = slf.get();
        let buffer = me.buffer(py)?;
        if view.is_null() {
            return Err(PyBufferError::new_err("view is null"));
        }
        let ptr = buffer.as_ptr() as usize + me.offset as usize;
        let keep = Box::into_raw(Box::new(buffer));
        // SAFETY: `view` is the non-null Py_buffer Python passed in; the pointers stored in it
        // (shape, strides, format) point into this object or static data, and the object is
        // kept alive by `obj` for the life of the view; `internal` keeps the memory alive.
        unsafe {
            (*view).buf = ptr as *mut c_void;
            (*view).len = me.nbytes as isize;
            (*view).readonly = 0;
            (*view).itemsize = me.dtype.size() as isize;
            (*view).format = if flags & ffi::PyBUF_FORMAT == ffi::PyBUF_FORMAT {
                c_format(me.dtype).as_ptr().cast_mut()
            } else {
                std::ptr::null_mut()
            };
            (*view).ndim = me.shape.len() as c_int;
            (*view).shape = if flags & ffi::PyBUF_ND == ffi::PyBUF_ND {
                me.shape.as_ptr().cast_mut()
            } else {
                std::ptr::null_mut()
            };
            (*view).strides = if flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES {
                me.strides.as_ptr().cast_mut()
            } else {
                std::ptr::null_mut()
            };
            (*view).suboffsets = std::ptr::null_mut();
            (*view).internal = keep.cast();
            (*view).obj = slf.into_any().into_ptr();
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, view: *mut ffi::Py_buffer) {
        // SAFETY: `internal` is the Box<Buffer> leaked in `__getbuffer__`; released once.
        unsafe {
            let keep = (*view).internal.cast::<Buffer>();
            if !keep.is_null() {
                drop(Box::from_raw(keep));
                (*view).internal = std::ptr::null_mut();
            }
        }
    }
}

fn nonneg(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<u64> {
    if obj.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "{arg} must be an int, got bool"
        )));
    }
    let v: i128 = match obj.extract() {
        Ok(v) => v,
        // An int (or an object with __index__) too large even for i128: a value error.
        Err(_) if obj.call_method0("__index__").is_ok() => {
            return Err(PyValueError::new_err(format!(
                "{arg} must be >= 0 and fit in 64 bits, got {}",
                obj.repr().map(|r| r.to_string()).unwrap_or_default()
            )))
        }
        Err(_) => {
            return Err(PyTypeError::new_err(format!(
                "{arg} must be an int, got {}",
                obj.get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_default()
            )))
        }
    };
    u64::try_from(v).map_err(|_| {
        PyValueError::new_err(format!("{arg} must be >= 0 and fit in 64 bits, got {v}"))
    })
}

fn opt_nonneg(obj: Option<&Bound<'_, PyAny>>, arg: &str) -> PyResult<Option<u64>> {
    match obj {
        Some(o) if !o.is_none() => nonneg(o, arg).map(Some),
        _ => Ok(None),
    }
}

/// An exported host buffer (C-contiguous), released under the GIL when dropped.
pub struct HostBuf {
    view: Box<ffi::Py_buffer>,
}

// SAFETY: the exporter keeps the memory valid and in place until `PyBuffer_Release`, which
// runs under the GIL in Drop; the bytes themselves are only touched through raw copies.
unsafe impl Send for HostBuf {}
// SAFETY: as above; no interior mutability on the Rust side.
unsafe impl Sync for HostBuf {}

impl HostBuf {
    /// Export `obj` (any buffer-protocol object). Non-contiguous objects are refused.
    pub fn get(obj: &Bound<'_, PyAny>, arg: &str, writable: bool) -> PyResult<HostBuf> {
        let py = obj.py();
        if obj.cast::<PyDeviceBuffer>().is_ok() {
            return Err(PyTypeError::new_err(format!("{arg} must be host memory (a numpy array, bytes, bytearray or memoryview), got a DeviceBuffer")));
        }
        // SAFETY: Py_buffer is plain data; zeroed is a valid "empty" state before export.
        let mut view: Box<ffi::Py_buffer> = Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: valid object and a writable Py_buffer to fill.
        let rc =
            unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, ffi::PyBUF_C_CONTIGUOUS) };
        if rc != 0 {
            let e = PyErr::fetch(py);
            // SAFETY: `obj` is a valid, live object; the check only reads its type slots.
            let supports = unsafe { ffi::PyObject_CheckBuffer(obj.as_ptr()) } == 1;
            return Err(if supports {
                PyValueError::new_err(format!("{arg} must be a C-contiguous buffer ({e})"))
            } else {
                PyTypeError::new_err(format!(
                    "{arg} must support the buffer protocol (numpy array, bytes, bytearray, memoryview), got {}",
                    obj.get_type().name().map(|n| n.to_string()).unwrap_or_default()
                ))
            });
        }
        let hb = HostBuf { view };
        if writable && hb.view.readonly != 0 {
            return Err(PyValueError::new_err(format!(
                "{arg} is read-only; a copy destination must be writable"
            )));
        }
        Ok(hb)
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        // SAFETY: the view was filled by a successful PyObject_GetBuffer and is released once.
        Python::attach(|_| unsafe { ffi::PyBuffer_Release(&mut *self.view) });
    }
}

// SAFETY: `buf` is valid for `len` bytes while the export is held (until Drop).
unsafe impl HostMemory for HostBuf {
    fn as_ptr(&self) -> *const u8 {
        self.view.buf as *const u8
    }
    fn as_mut_ptr(&self) -> Option<*mut u8> {
        (self.view.readonly == 0).then_some(self.view.buf.cast::<u8>())
    }
    fn len(&self) -> usize {
        self.view.len as usize
    }
}

/// A device-side copy endpoint: (core buffer, absolute offset, bytes of the view).
fn device_side(py: Python<'_>, obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<(Buffer, u64, u64)> {
    let b = obj.cast::<PyDeviceBuffer>().map_err(|_| {
        PyTypeError::new_err(format!(
            "{arg} must be a runtime.DeviceBuffer, got {}",
            obj.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))
    })?;
    let b = b.get();
    Ok((b.buffer(py)?, b.offset, b.nbytes))
}

fn stream_arg(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Stream>> {
    match obj {
        Some(o) if !o.is_none() => {
            let s = o.cast::<PyStream>().map_err(|_| {
                PyTypeError::new_err(format!(
                    "stream must be a runtime.Stream or None, got {} (pass byte counts as count=...)",
                    o.get_type().name().map(|n| n.to_string()).unwrap_or_default()
                ))
            })?;
            Ok(Some(s.get().inner().clone()))
        }
        _ => Ok(None),
    }
}

/// Check that `[off, off + count)` fits in a side of `len` bytes (ValueError naming `arg`).
fn fits(arg: &str, what: &str, len: u64, off: u64, count: u64) -> PyResult<()> {
    match off.checked_add(count) {
        Some(end) if end <= len => Ok(()),
        _ => Err(PyValueError::new_err(format!(
            "{arg}: {count} bytes at offset {off} do not fit in the {len}-byte {what}; nothing was copied"
        ))),
    }
}

/// Refuse a host<->device copy whose host range overlaps its device range (the host side is
/// a view of the same device memory): the copy is a non-overlapping memcpy, possibly split
/// across threads, so overlap would be undefined behaviour. `memcpy_d2d` handles overlap.
fn no_overlap(host: usize, dev: usize, count: u64) -> PyResult<()> {
    let n = count as usize;
    if n > 0 && host < dev.saturating_add(n) && dev < host.saturating_add(n) {
        return Err(PyValueError::new_err(
            "src and dst overlap (the host side is a view of the same device memory); use memcpy_d2d for overlapping copies",
        ));
    }
    Ok(())
}

/// Run a copy op: queued on `stream` (asynchronous) or, with no stream, ordered on the
/// current stream of `device` and waited for (run inline when that stream is idle).
///
/// `peer` is the other device of a cross-device copy: without a stream the copy is also
/// ordered after the work queued so far on that device's current stream (as `cudaMemcpyPeer`
/// is serialised with both devices), so a blocking peer copy never reads a source that a
/// kernel queued before it has not written yet.
fn run_copy(
    py: Python<'_>,
    op: Arc<dyn Op>,
    stream: Option<Stream>,
    device: usize,
    peer: Option<usize>,
) -> PyResult<()> {
    match stream {
        Some(s) => {
            if s.enqueue(op).map_err(RtErr)? {
                crate::stream::after_enqueue(py, &s)?;
            }
            Ok(())
        }
        None => {
            let r = rt::get().map_err(RtErr)?;
            let d = r.device(device as i64).map_err(RtErr)?;
            let s = runtime_core::device::current_stream(d).map_err(RtErr)?;
            if let Some(p) = peer.filter(|&p| p != device) {
                let ps = runtime_core::device::current_stream(r.device(p as i64).map_err(RtErr)?)
                    .map_err(RtErr)?;
                // (A stream being captured has nothing pending to order after.)
                if !ps.is_capturing() {
                    let ev = runtime_core::event::Event::new(false, false);
                    ps.record(&ev).map_err(RtErr)?;
                    s.wait_event(&ev).map_err(RtErr)?;
                }
            }
            let inline = py.detach(|| s.try_run_inline(&op)).map_err(RtErr)?;
            if !inline {
                s.enqueue(op).map_err(RtErr)?;
            }
            sync_stream(py, &s, None)
        }
    }
}

/// Allocate `size` zeroed bytes on `device` (a Device or an int).
#[pyfunction]
pub fn device_malloc(
    py: Python<'_>,
    device: &Bound<'_, PyAny>,
    size: &Bound<'_, PyAny>,
) -> PyResult<PyDeviceBuffer> {
    let d = resolve_required(device, "device")?;
    let size = nonneg(size, "size")?;
    let gen = rt::get().map_err(RtErr)?.generation();
    let b = d.memory().allocate(size).map_err(RtErr)?;
    let _ = py;
    Ok(PyDeviceBuffer::raw(b, gen))
}

/// Free a buffer handle. Later use of the handle raises `InvalidHandleError`; the memory goes
/// back to the pool once no view or queued operation uses it.
#[pyfunction]
pub fn device_free(py: Python<'_>, buf: &Bound<'_, PyAny>) -> PyResult<()> {
    let b = buf.cast::<PyDeviceBuffer>().map_err(|_| {
        PyTypeError::new_err(format!(
            "buf must be a runtime.DeviceBuffer, got {}",
            buf.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))
    })?;
    b.get().free(py)
}

/// Copy host memory `src` (any C-contiguous buffer) into device buffer `dst`.
#[pyfunction]
// Offsets default to None in Rust (so that any object can be checked and named in errors);
// the Python-visible signature says 0, which behaves the same.
#[pyo3(
    signature = (dst, src, stream=None, *, count=None, dst_offset=None, src_offset=None),
    text_signature = "(dst, src, stream=None, *, count=None, dst_offset=0, src_offset=0)"
)]
pub fn memcpy_host_to_device(
    py: Python<'_>,
    dst: &Bound<'_, PyAny>,
    src: &Bound<'_, PyAny>,
    stream: Option<&Bound<'_, PyAny>>,
    count: Option<&Bound<'_, PyAny>>,
    dst_offset: Option<&Bound<'_, PyAny>>,
    src_offset: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let dst_offset = opt_nonneg(dst_offset, "dst_offset")?.unwrap_or(0);
    let src_offset = opt_nonneg(src_offset, "src_offset")?.unwrap_or(0);
    let (db, doff, dlen) = device_side(py, dst, "dst")?;
    let stream = stream_arg(stream)?;
    let host = HostBuf::get(src, "src", false)?;
    let hlen = host.len() as u64;
    let count = match opt_nonneg(count, "count")? {
        Some(c) => c,
        None => hlen.checked_sub(src_offset).ok_or_else(|| {
            PyValueError::new_err(format!(
                "src_offset: {src_offset} is past the end of the {hlen}-byte host buffer"
            ))
        })?,
    };
    fits("src", "host buffer", hlen, src_offset, count)?;
    fits("dst", "device buffer", dlen, dst_offset, count)?;
    no_overlap(
        host.as_ptr() as usize + src_offset as usize,
        db.as_ptr() as usize + (doff + dst_offset) as usize,
        count,
    )?;
    let op = copy::h2d(&db, doff + dst_offset, Arc::new(host), src_offset, count).map_err(RtErr)?;
    run_copy(py, op, stream, db.device(), None)
}

/// Copy device buffer `src` into host memory `dst` (a writable, C-contiguous buffer).
#[pyfunction]
// Offsets default to None in Rust (so that any object can be checked and named in errors);
// the Python-visible signature says 0, which behaves the same.
#[pyo3(
    signature = (dst, src, stream=None, *, count=None, dst_offset=None, src_offset=None),
    text_signature = "(dst, src, stream=None, *, count=None, dst_offset=0, src_offset=0)"
)]
pub fn memcpy_device_to_host(
    py: Python<'_>,
    dst: &Bound<'_, PyAny>,
    src: &Bound<'_, PyAny>,
    stream: Option<&Bound<'_, PyAny>>,
    count: Option<&Bound<'_, PyAny>>,
    dst_offset: Option<&Bound<'_, PyAny>>,
    src_offset: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let dst_offset = opt_nonneg(dst_offset, "dst_offset")?.unwrap_or(0);
    let src_offset = opt_nonneg(src_offset, "src_offset")?.unwrap_or(0);
    let (sb, soff, slen) = device_side(py, src, "src")?;
    let stream = stream_arg(stream)?;
    let host = HostBuf::get(dst, "dst", true)?;
    let hlen = host.len() as u64;
    let count = match opt_nonneg(count, "count")? {
        Some(c) => c,
        None => hlen.checked_sub(dst_offset).ok_or_else(|| {
            PyValueError::new_err(format!(
                "dst_offset: {dst_offset} is past the end of the {hlen}-byte host buffer"
            ))
        })?,
    };
    fits("dst", "host buffer", hlen, dst_offset, count)?;
    fits("src", "device buffer", slen, src_offset, count)?;
    no_overlap(
        host.as_ptr() as usize + dst_offset as usize,
        sb.as_ptr() as usize + (soff + src_offset) as usize,
        count,
    )?;
    let op = copy::d2h(Arc::new(host), dst_offset, &sb, soff + src_offset, count).map_err(RtErr)?;
    run_copy(py, op, stream, sb.device(), None)
}

/// Copy device buffer `src` into device buffer `dst` (any devices). With `stream` the copy is
/// queued on it; without, it is ordered on the current stream and waited for.
#[pyfunction]
// Offsets default to None in Rust (so that any object can be checked and named in errors);
// the Python-visible signature says 0, which behaves the same.
#[pyo3(
    signature = (dst, src, stream=None, *, count=None, dst_offset=None, src_offset=None),
    text_signature = "(dst, src, stream=None, *, count=None, dst_offset=0, src_offset=0)"
)]
pub fn memcpy_d2d(
    py: Python<'_>,
    dst: &Bound<'_, PyAny>,
    src: &Bound<'_, PyAny>,
    stream: Option<&Bound<'_, PyAny>>,
    count: Option<&Bound<'_, PyAny>>,
    dst_offset: Option<&Bound<'_, PyAny>>,
    src_offset: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let dst_offset = opt_nonneg(dst_offset, "dst_offset")?.unwrap_or(0);
    let src_offset = opt_nonneg(src_offset, "src_offset")?.unwrap_or(0);
    let (db, doff, dlen) = device_side(py, dst, "dst")?;
    let (sb, soff, slen) = device_side(py, src, "src")?;
    let stream = stream_arg(stream)?;
    let count = match opt_nonneg(count, "count")? {
        Some(c) => c,
        None => slen.checked_sub(src_offset).ok_or_else(|| {
            PyValueError::new_err(format!(
                "src_offset: {src_offset} is past the end of the {slen}-byte source"
            ))
        })?,
    };
    fits("src", "device buffer", slen, src_offset, count)?;
    fits("dst", "device buffer", dlen, dst_offset, count)?;
    let op = copy::d2d(&db, doff + dst_offset, &sb, soff + src_offset, count).map_err(RtErr)?;
    run_copy(py, op, stream, db.device(), Some(sb.device()))
}

/// Set `count` bytes (default: the whole view from `offset`) of `buf` to `value` (0..=255).
#[pyfunction]
#[pyo3(
    signature = (buf, value, count=None, *, offset=None, stream=None),
    text_signature = "(buf, value, count=None, *, offset=0, stream=None)"
)]
pub fn memset(
    py: Python<'_>,
    buf: &Bound<'_, PyAny>,
    value: &Bound<'_, PyAny>,
    count: Option<&Bound<'_, PyAny>>,
    offset: Option<&Bound<'_, PyAny>>,
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let offset = opt_nonneg(offset, "offset")?.unwrap_or(0);
    let (b, boff, blen) = device_side(py, buf, "buf")?;
    let v = nonneg(value, "value")?;
    let v = u8::try_from(v)
        .map_err(|_| PyValueError::new_err(format!("value must be a byte, 0..=255, got {v}")))?;
    let stream = stream_arg(stream)?;
    let count = match opt_nonneg(count, "count")? {
        Some(c) => c,
        None => blen.checked_sub(offset).ok_or_else(|| {
            PyValueError::new_err(format!(
                "offset: {offset} is past the end of the {blen}-byte buffer"
            ))
        })?,
    };
    fits("buf", "device buffer", blen, offset, count)?;
    let op = copy::memset(&b, boff + offset, count, v).map_err(RtErr)?;
    run_copy(py, op, stream, b.device(), None)
}

fn devices_of(dev: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<runtime_core::device::Device>> {
    let r = rt::get().map_err(RtErr)?;
    match dev {
        Some(o) if !o.is_none() => Ok(vec![r
            .device(device_arg(o, "device")?)
            .map_err(RtErr)?
            .clone()]),
        _ => Ok(r.devices().to_vec()),
    }
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
    let d = resolve(device, "device")?;
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

/// Allocate a typed buffer of `shape` and `dtype` on `device` (zeroed).
#[pyfunction]
#[pyo3(signature = (shape, dtype=None, device=None))]
pub fn empty(
    py: Python<'_>,
    shape: &Bound<'_, PyAny>,
    dtype: Option<&Bound<'_, PyAny>>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyDeviceBuffer> {
    let d = resolve(device, "device")?;
    let dt = match dtype {
        Some(t) if !t.is_none() => parse_dtype(py, t)?,
        _ => DType::F32,
    };
    let shape = shape_arg(shape, "shape")?;
    let n = shape
        .iter()
        .try_fold(dt.size() as u64, |a, &b| a.checked_mul(b as u64))
        .ok_or_else(|| PyValueError::new_err(format!("shape: {shape:?} is too large")))?;
    let gen = rt::get().map_err(RtErr)?.generation();
    let b = d.memory().allocate(n).map_err(RtErr)?;
    Ok(PyDeviceBuffer::typed(b, gen, 0, dt, shape))
}

/// Allocate a device buffer holding a copy of numpy array `array` (same dtype and shape).
#[pyfunction]
#[pyo3(signature = (array, device=None, stream=None))]
pub fn to_device<'py>(
    py: Python<'py>,
    array: &Bound<'py, PyAny>,
    device: Option<&Bound<'py, PyAny>>,
    stream: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyDeviceBuffer>> {
    let np = numpy(py)?;
    // `asarray(order="C")`, not `ascontiguousarray`: the latter turns 0-d arrays into 1-d.
    let kw = PyDict::new(py);
    kw.set_item("order", "C")?;
    // Fix: numpy's message for ragged or unconvertible data did not name `array`.
    let arr = np
        .getattr("asarray")?
        .call((array,), Some(&kw))
        .map_err(|e| naming(py, "array", e))?;
    let dtype = arr.getattr("dtype")?;
    let shape = arr.getattr("shape")?;
    let buf = Bound::new(py, empty(py, &shape, Some(&dtype), device)?)?;
    memcpy_host_to_device(py, buf.as_any(), &arr, stream, None, None, None)?;
    Ok(buf)
}
