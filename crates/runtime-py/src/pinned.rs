//! Pinned host memory: the `PinnedMemory` class (one block of the core's pinned allocator,
//! exported with the buffer protocol; the Python layer wraps it in a numpy array), the
//! `PinnedMemoryPointer` class (CuPy's pointer into a block: `± n`, the buffer protocol from
//! the pointer to the block's end), `_malloc_host`, `free_host`, `host_memory_stats`,
//! `host_empty_cache`.

use std::ffi::c_int;

use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use runtime_core::memory::pinned::{self, PinnedBuffer};
use runtime_core::stream::copy::HostMemory;

use crate::convert::{nonneg, type_name};
use crate::errors::RtErr;
use crate::host::HostBuf;

/// A block of pinned (page-locked) host memory. It exports its bytes with the buffer
/// protocol; `runtime.malloc_host` and `runtime.pinned_empty` return numpy arrays over it.
#[pyclass(name = "PinnedMemory", module = "runtime._runtime", frozen)]
pub struct PyPinnedMemory {
    block: PinnedBuffer,
}

impl PyPinnedMemory {
    /// A handle over `block` (a clone: the block lives while this object does).
    pub fn wrap(block: PinnedBuffer) -> Self {
        PyPinnedMemory { block }
    }
}

#[pymethods]
impl PyPinnedMemory {
    /// Address of byte 0.
    #[getter]
    fn ptr(&self) -> usize {
        self.block.as_ptr() as usize
    }

    /// Bytes as requested.
    #[getter]
    fn nbytes(&self) -> usize {
        self.block.len() as usize
    }

    /// Whether the OS locked the pages (False when `mlock` was refused; the memory is then
    /// pageable, though copies still treat it as pinned).
    #[getter]
    fn locked(&self) -> bool {
        self.block.is_locked()
    }

    /// Whether `free_host` was called on it.
    #[getter]
    fn freed(&self) -> bool {
        self.block.is_freed()
    }

    /// Unique id (per process).
    #[getter]
    fn id(&self) -> u64 {
        self.block.id()
    }

    /// Bytes as requested (CuPy's `PinnedMemory.size`; the same as `nbytes`).
    #[getter]
    fn size(&self) -> usize {
        self.block.len() as usize
    }

    fn __len__(&self) -> usize {
        self.block.len() as usize
    }

    fn __repr__(&self) -> String {
        format!(
            "PinnedMemory#{}({} bytes, {}{})",
            self.block.id(),
            self.block.len(),
            if self.block.is_locked() {
                "locked"
            } else {
                "not locked"
            },
            if self.block.is_freed() { ", freed" } else { "" }
        )
    }

    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("view is null"));
        }
        let (ptr, len) = (slf.get().block.as_ptr(), slf.get().block.len());
        // SAFETY: `view` is the non-null Py_buffer Python passed in; `ptr` is valid for `len`
        // bytes while the block lives, and `PyBuffer_FillInfo` stores a new reference to
        // `slf` (which owns a clone of the block) in `view.obj`.
        let rc = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                ptr.cast(),
                len as ffi::Py_ssize_t,
                0,
                flags,
            )
        };
        if rc != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}

/// A pointer into a pinned block (CuPy's `cupy.cuda.PinnedMemoryPointer`): the block (`mem`)
/// and a byte offset into it. `p + n`, `n + p` and `p - n` make new pointers, `p += n` and
/// `p -= n` move this one; each must stay within the block (offset `0..=mem.nbytes`), or a
/// `ValueError` names the step and the block's size. The buffer protocol exports the bytes
/// from the pointer to the block's end, writable (`numpy.frombuffer(p, dtype, count)`); the
/// export keeps the block alive.
#[pyclass(name = "PinnedMemoryPointer", module = "runtime._runtime")]
pub struct PyPinnedMemoryPointer {
    mem: Py<PyPinnedMemory>,
    offset: usize,
}

impl PyPinnedMemoryPointer {
    fn block(&self) -> &PinnedBuffer {
        &self.mem.get().block
    }

    /// The offset `n` bytes on, if it stays within the block.
    fn moved(&self, n: i64, arg: &str) -> PyResult<usize> {
        let len = self.block().len();
        let to = self.offset as i128 + i128::from(n);
        if to < 0 || to > i128::from(len) {
            return Err(PyValueError::new_err(format!(
                "{arg}: moving the pointer at byte {} by {n} leaves the {len}-byte pinned block (offsets 0..={len})",
                self.offset
            )));
        }
        Ok(to as usize)
    }

    fn step(&self, py: Python<'_>, n: i64, arg: &str) -> PyResult<Py<PyAny>> {
        let offset = self.moved(n, arg)?;
        let p = PyPinnedMemoryPointer {
            mem: self.mem.clone_ref(py),
            offset,
        };
        Ok(Bound::new(py, p)?.into_any().unbind())
    }

    /// `other` as a byte count, or `None` (the operation is `NotImplemented`): ints and
    /// objects with `__index__`, not bools.
    fn count(other: &Bound<'_, PyAny>) -> Option<i64> {
        if other.is_instance_of::<pyo3::types::PyBool>() {
            return None;
        }
        other.extract::<i64>().ok()
    }
}

#[pymethods]
impl PyPinnedMemoryPointer {
    /// A pointer `offset` bytes into `mem` (CuPy's `PinnedMemoryPointer(mem, offset)`).
    #[new]
    fn new(mem: Bound<'_, PyPinnedMemory>, offset: i64) -> PyResult<Self> {
        let p = PyPinnedMemoryPointer {
            mem: mem.unbind(),
            offset: 0,
        };
        let offset = p.moved(offset, "offset")?;
        Ok(PyPinnedMemoryPointer { offset, ..p })
    }

    /// The pinned block this pointer points into.
    #[getter]
    fn mem(&self, py: Python<'_>) -> Py<PyPinnedMemory> {
        self.mem.clone_ref(py)
    }

    /// The address this pointer holds.
    #[getter]
    fn ptr(&self) -> usize {
        self.block().as_ptr() as usize + self.offset
    }

    /// Bytes from the pointer to the block's end.
    fn size(&self) -> usize {
        self.block().len() as usize - self.offset
    }

    fn __int__(&self) -> usize {
        self.ptr()
    }

    fn __add__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        match Self::count(other) {
            Some(n) => self.step(py, n, "+"),
            None => Ok(py.NotImplemented()),
        }
    }

    fn __radd__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.__add__(py, other)
    }

    fn __sub__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        match Self::count(other).and_then(i64::checked_neg) {
            Some(n) => self.step(py, n, "-"),
            None => Ok(py.NotImplemented()),
        }
    }

    fn __iadd__(&mut self, other: &Bound<'_, PyAny>) -> PyResult<()> {
        let Some(n) = Self::count(other) else {
            return Err(PyTypeError::new_err(format!(
                "+=: a PinnedMemoryPointer moves by an int number of bytes, got {}",
                type_name(other)
            )));
        };
        self.offset = self.moved(n, "+=")?;
        Ok(())
    }

    fn __isub__(&mut self, other: &Bound<'_, PyAny>) -> PyResult<()> {
        let Some(n) = Self::count(other).and_then(i64::checked_neg) else {
            return Err(PyTypeError::new_err(format!(
                "-=: a PinnedMemoryPointer moves by an int number of bytes, got {}",
                type_name(other)
            )));
        };
        self.offset = self.moved(n, "-=")?;
        Ok(())
    }

    /// Compared by address, with another pointer or an int.
    fn __richcmp__(
        &self,
        other: &Bound<'_, PyAny>,
        op: pyo3::basic::CompareOp,
    ) -> PyResult<Py<PyAny>> {
        let py = other.py();
        let addr = if let Ok(p) = other.cast::<PyPinnedMemoryPointer>() {
            p.borrow().ptr() as i128
        } else if let Some(n) = Self::count(other) {
            i128::from(n)
        } else {
            return Ok(py.NotImplemented());
        };
        let r = op.matches((self.ptr() as i128).cmp(&addr));
        Ok(pyo3::types::PyBool::new(py, r)
            .to_owned()
            .into_any()
            .unbind())
    }

    fn __repr__(&self) -> String {
        format!(
            "PinnedMemoryPointer(0x{:x}: byte {} of PinnedMemory#{}, {} bytes to its end)",
            self.ptr(),
            self.offset,
            self.block().id(),
            self.size()
        )
    }

    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("view is null"));
        }
        let (ptr, len) = {
            let p = slf.borrow();
            (p.ptr(), p.size())
        };
        // SAFETY: `view` is the non-null Py_buffer Python passed in; `ptr` lies in the block
        // at an offset <= its length (checked by every move), so it is valid for `len` bytes
        // while the block lives, and `PyBuffer_FillInfo` stores a new reference to `slf`
        // (which holds the block's `PinnedMemory`) in `view.obj`.
        let rc = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                ptr as *mut std::ffi::c_void,
                len as ffi::Py_ssize_t,
                0,
                flags,
            )
        };
        if rc != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}

/// Allocate `nbytes` of pinned host memory (the Python layer's `malloc_host`).
#[pyfunction]
pub fn _malloc_host(py: Python<'_>, nbytes: &Bound<'_, PyAny>) -> PyResult<PyPinnedMemory> {
    let n = nonneg(nbytes, "nbytes")?;
    // Without the GIL: locking a large block faults in every page.
    let block = py.detach(|| pinned::allocate(n)).map_err(RtErr)?;
    Ok(PyPinnedMemory { block })
}

/// The `PinnedMemory` under `obj` through its chain of `.base` / `memoryview.obj`, if any.
fn owner(obj: &Bound<'_, PyAny>) -> Option<PinnedBuffer> {
    crate::host::find_owner(obj, |cur| {
        cur.cast::<PyPinnedMemory>()
            .ok()
            .map(|m| m.get().block.clone())
    })
}

/// The pinned block `obj` starts: a `PinnedMemory`, or a buffer (numpy array) over the start
/// of one (found through its bases, so that a zero-byte block, which has no address of its
/// own, is found too).
fn block_of(obj: &Bound<'_, PyAny>) -> PyResult<PinnedBuffer> {
    if let Ok(m) = obj.cast::<PyPinnedMemory>() {
        return Ok(m.get().block.clone());
    }
    if let Some(b) = owner(obj) {
        if b.is_empty() {
            let h = HostBuf::get(obj, "arr", false)?;
            if h.is_empty() {
                return Ok(b);
            }
        }
    }
    let not_pinned = || {
        PyValueError::new_err(format!(
            "arr: a {} that is not the start of pinned host memory (from malloc_host or pinned_empty)",
            type_name(obj)
        ))
    };
    let h = HostBuf::get(obj, "arr", false).map_err(|e| {
        if e.is_instance_of::<PyTypeError>(obj.py()) {
            e
        } else {
            not_pinned()
        }
    })?;
    let ptr = h.as_ptr();
    let block = pinned::find(ptr, h.len().max(1)).ok_or_else(not_pinned)?;
    if block.as_ptr().cast_const() != ptr {
        return Err(not_pinned());
    }
    Ok(block)
}

/// Free pinned host memory: later stream-ordered copies using it are refused
/// (`InvalidHandleError`), and the block returns to the pinned cache once no array over it
/// and no queued copy is left. Freeing twice is an `InvalidHandleError`.
#[pyfunction]
pub fn free_host(arr: &Bound<'_, PyAny>) -> PyResult<()> {
    block_of(arr)?.free().map_err(RtErr)?;
    Ok(())
}

/// `cudaHostRegister` flag bits accepted (Default 0, Portable 1, Mapped 2, IoMemory 4,
/// ReadOnly 8): every virtual device reaches host memory directly, so they change nothing.
const HOST_REGISTER_FLAGS: u64 = 0xF;

/// Register the memory of `arr` (a C-contiguous buffer, e.g. a numpy array) as
/// pinned memory (`cudaHostRegister`): copies queued on a stream from or to it then read or
/// write it when the stream runs them, as with `malloc_host` memory. The registration holds
/// the array's buffer export (so the array stays alive and cannot be resized) until
/// `host_unregister`. Registering memory twice, or `malloc_host` memory, is a `ValueError`.
#[pyfunction]
#[pyo3(signature = (arr, flags=None))]
pub fn host_register(arr: &Bound<'_, PyAny>, flags: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
    let f = crate::convert::opt_nonneg(flags, "flags")?.unwrap_or(0);
    if f & !HOST_REGISTER_FLAGS != 0 {
        return Err(PyValueError::new_err(format!(
            "flags: {f:#x} has bits that are no cudaHostRegister flag (known: {HOST_REGISTER_FLAGS:#x})"
        )));
    }
    let h = HostBuf::get(arr, "arr", false)?;
    let (ptr, len) = (h.as_ptr(), h.len());
    pinned::register(ptr, len, std::sync::Arc::new(h)).map_err(RtErr)?;
    Ok(())
}

/// Unregister `arr`'s memory (`cudaHostUnregister`), releasing the registration's hold on it.
/// Refused with `NotReadyError` while a copy queued on a stream still uses it (synchronize
/// that stream first); memory that is not registered is a `ValueError`.
#[pyfunction]
pub fn host_unregister(arr: &Bound<'_, PyAny>) -> PyResult<()> {
    let ptr = HostBuf::get(arr, "arr", false)?.as_ptr();
    // The registration's export is released in here (this thread holds the GIL).
    pinned::unregister(ptr).map_err(RtErr)?;
    Ok(())
}

/// Whether `arr`'s memory is registered (`host_register`) at its first byte.
#[pyfunction]
pub fn host_is_registered(arr: &Bound<'_, PyAny>) -> PyResult<bool> {
    Ok(pinned::is_registered(
        HostBuf::get(arr, "arr", false)?.as_ptr(),
    ))
}

/// Statistics of the pinned host allocator, keyed as `torch.cuda.host_memory_stats`.
#[pyfunction]
pub fn host_memory_stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let s = pinned::stats();
    let d = PyDict::new(py);
    d.set_item("allocations.current", s.allocations)?;
    d.set_item("allocations.peak", s.allocations_peak)?;
    d.set_item("allocations.allocated", s.allocations_total)?;
    d.set_item("allocations.freed", s.frees_total)?;
    d.set_item("allocated_bytes.current", s.allocated_bytes)?;
    d.set_item("allocated_bytes.peak", s.allocated_bytes_peak)?;
    d.set_item("reserved_bytes.current", s.reserved_bytes)?;
    d.set_item("reserved_bytes.peak", s.reserved_bytes_peak)?;
    d.set_item("segment.current", s.segments)?;
    d.set_item("locked_bytes.current", s.locked_bytes)?;
    d.set_item("num_host_alloc", s.num_host_alloc)?;
    d.set_item("num_host_free", s.num_host_free)?;
    d.set_item("cache_hits", s.cache_hits)?;
    Ok(d)
}

/// Unmap the cached (unused) pinned blocks.
#[pyfunction]
pub fn host_empty_cache() {
    pinned::empty_cache();
}
