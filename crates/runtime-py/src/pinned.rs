//! Pinned host memory: the `PinnedMemory` class (one block of the core's pinned allocator,
//! exported with the buffer protocol; the Python layer wraps it in a numpy array),
//! `_malloc_host`, `free_host`, `host_memory_stats`, `host_empty_cache`.

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
    let mut cur = obj.clone();
    for _ in 0..16 {
        if let Ok(m) = cur.cast::<PyPinnedMemory>() {
            return Some(m.get().block.clone());
        }
        let next = if let Ok(mv) = cur.cast::<pyo3::types::PyMemoryView>() {
            mv.getattr("obj").ok()
        } else {
            cur.getattr("base").ok()
        };
        match next {
            Some(n) if !n.is_none() => cur = n,
            _ => return None,
        }
    }
    None
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
