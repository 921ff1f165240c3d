//! The Python handle classes as data: what a `Device`, `DeviceBuffer`, `Stream` and `Event`
//! hold. Whether a handle still belongs to the installed runtime is the core's answer (every
//! core call on a stale buffer, stream, event or graph fails with `InvalidHandle`); the
//! bindings keep no generations. Their Python methods live in the domain files (`device`, `buffer`, `stream`,
//! `event`); keeping the types here lets argument conversion (`convert`) read handles without
//! depending on any domain file.

use parking_lot::Mutex;
use pyo3::prelude::*;
use runtime_core::event::Event;
use runtime_core::kernel::DType;
use runtime_core::memory::{Buffer, Layout};
use runtime_core::stream::Stream;

use crate::errors::{self, RtErr};

/// A virtual device. `with runtime.Device(1):` makes it the thread's current device.
/// Devices compare and order by index (CuPy's `Device.__lt__` and the like).
#[pyclass(name = "Device", module = "runtime", frozen, eq, ord, hash)]
#[derive(PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PyDevice {
    #[pyo3(get)]
    pub(crate) index: usize,
}

impl PyDevice {
    pub fn from_index(index: usize) -> Self {
        PyDevice { index }
    }

    pub fn index(&self) -> usize {
        self.index
    }
}

/// A device memory handle: raw bytes from `device_malloc`, or a typed, shaped view whose
/// elements are laid out by byte strides (C order unless made F-ordered or strided).
#[pyclass(name = "DeviceBuffer", module = "runtime", frozen, weakref)]
pub struct PyDeviceBuffer {
    /// The buffer while the handle is live; once freed, the call that freed it (for the
    /// error of a later use).
    slot: Mutex<Result<Buffer, &'static str>>,
    pub(crate) id: u64,
    pub(crate) device: usize,
    pub(crate) offset: u64,
    pub(crate) dtype: DType,
    pub(crate) shape: Vec<isize>,
    pub(crate) strides: Vec<isize>,
    /// numpy's `nbytes`: the elements' bytes (a strided view reaches further: `layout.span()`).
    pub(crate) nbytes: u64,
    layout: Layout,
    /// `layout.is_c_contiguous()`, asked by every launch that passes the handle.
    c_contiguous: bool,
}

impl PyDeviceBuffer {
    /// A handle over `buffer` (raw bytes).
    pub fn raw(buffer: Buffer) -> Self {
        let n = buffer.size();
        Self::typed(buffer, 0, DType::U8, vec![n as usize])
    }

    /// A typed, C-ordered handle over part of `buffer` (range already checked).
    pub fn typed(buffer: Buffer, offset: u64, dtype: DType, shape: Vec<usize>) -> Self {
        Self::laid_out(buffer, offset, dtype, Layout::c(shape, dtype.size()))
    }

    /// A typed handle whose first element is at byte `offset` of `buffer`, its elements laid
    /// out by `layout` (range already checked: `Layout::check_fits`).
    pub fn laid_out(buffer: Buffer, offset: u64, dtype: DType, layout: Layout) -> Self {
        PyDeviceBuffer {
            id: buffer.id(),
            device: buffer.device(),
            slot: Mutex::new(Ok(buffer)),
            offset,
            dtype,
            shape: layout.shape().iter().map(|&d| d as isize).collect(),
            strides: layout
                .strides()
                .iter()
                .map(|&s| s.min(isize::MAX as usize) as isize)
                .collect(),
            nbytes: layout.nbytes(),
            c_contiguous: layout.is_c_contiguous(),
            layout,
        }
    }

    /// The shape and byte strides.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The view's bytes as one range, (offset, length), for what moves bytes (copies,
    /// memset, pointer arithmetic, typed views by offset): any dense layout (C, F, a
    /// transpose) is one range; a strided view (a step slice) is a `ValueError` naming `arg`.
    pub fn contiguous_bytes(&self, arg: &str) -> PyResult<(u64, u64)> {
        if !self.layout.is_dense() {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "{arg}: a strided DeviceBuffer view (shape {:?}, strides {:?}) is not one range of bytes; copy it with copy_to_host(), or into a contiguous buffer (c = runtime.empty(buf.shape, buf.dtype); c.copy_to_device(buf))",
                self.shape, self.strides
            )));
        }
        Ok((self.offset, self.layout.span()))
    }

    /// Refuse (`ValueError` naming `arg`) a view that is not C-contiguous, for what reads
    /// its elements in C order (kernels, collectives).
    ///
    /// `arg` is formatted only for the error (launches pass `format_args!`, and a launch that
    /// passes formats nothing).
    pub fn require_c_contiguous(&self, arg: impl std::fmt::Display, what: &str) -> PyResult<()> {
        if !self.c_contiguous {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "{arg}: {what} take C-contiguous buffers; this view has shape {:?} and strides {:?} ({}); copy it into a C-contiguous buffer first (c = runtime.empty(buf.shape, buf.dtype); c.copy_to_device(buf))",
                self.shape,
                self.strides,
                if self.layout.is_f_contiguous() { "F-contiguous" } else { "strided" }
            )));
        }
        Ok(())
    }

    fn what(&self) -> String {
        format!(
            "DeviceBuffer#{} (device {}, {} bytes)",
            self.id, self.device, self.nbytes
        )
    }

    /// The live core buffer, or `InvalidHandleError`.
    pub fn buffer(&self, py: Python<'_>) -> PyResult<Buffer> {
        let b = self.slot.lock().clone().map_err(|how| {
            errors::invalid_handle(py, self.what(), &format!("it was freed with {how}"))
        })?;
        // The core knows whether the runtime it was allocated under is still the live one.
        b.check().map_err(RtErr)?;
        Ok(b)
    }

    pub fn shape_usize(&self) -> Vec<usize> {
        self.shape.iter().map(|&d| d as usize).collect()
    }

    /// A typed handle of the same runtime over part of `buffer` (a view of this one).
    pub fn derive(&self, buffer: Buffer, offset: u64, dtype: DType, shape: Vec<usize>) -> Self {
        Self::typed(buffer, offset, dtype, shape)
    }

    /// A new handle sharing this one's memory and layout (used for kernel arguments).
    pub fn share(&self, py: Python<'_>) -> PyResult<PyDeviceBuffer> {
        Ok(Self::laid_out(
            self.buffer(py)?,
            self.offset,
            self.dtype,
            self.layout.clone(),
        ))
    }

    /// Let go of the handle's memory whether or not its runtime is still the live one (a
    /// plugged allocator's `free` after a shutdown); only a handle freed already is refused.
    pub fn release(&self, py: Python<'_>) -> PyResult<()> {
        self.take_freed_by(py, "MemoryPool.free()")
    }

    /// Free the handle (`device_free`).
    pub fn free(&self, py: Python<'_>) -> PyResult<()> {
        self.buffer(py)?;
        // Take under the lock: of two racing frees exactly one succeeds. The buffer is dropped
        // after the lock is released (dropping may return the block to the allocator).
        self.take_freed_by(py, "device_free()")
    }
}

impl PyDeviceBuffer {
    /// `free_async`: `free` (the core's stream-ordered free, given the buffer) and, if it
    /// accepts, retire the handle as `device_free` does. A refused free changes nothing.
    pub fn free_with(
        &self,
        py: Python<'_>,
        how: &'static str,
        free: impl FnOnce(&Buffer) -> runtime_core::Result<()>,
    ) -> PyResult<()> {
        let b = self.buffer(py)?;
        if self.offset != 0 {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "buf: {} is a view at offset {}; free the buffer malloc_async returned",
                self.what(),
                self.offset
            )));
        }
        free(&b).map_err(RtErr)?;
        drop(b);
        let taken = {
            let mut slot = self.slot.lock();
            match &*slot {
                Ok(_) => std::mem::replace(&mut *slot, Err(how)),
                Err(before) => Err(*before),
            }
        };
        if let Ok(b) = taken {
            runtime_core::memory::defer::release(b);
        }
        Ok(())
    }

    /// Take the buffer out, noting `how` it was freed; of two racing frees exactly one
    /// succeeds. The buffer is dropped after the lock is released (dropping may return the
    /// block to the allocator).
    fn take_freed_by(&self, py: Python<'_>, how: &'static str) -> PyResult<()> {
        let taken = {
            let mut slot = self.slot.lock();
            match &*slot {
                Ok(_) => std::mem::replace(&mut *slot, Err(how)),
                Err(before) => Err(*before),
            }
        };
        match taken {
            Ok(b) => {
                runtime_core::memory::defer::release(b);
                Ok(())
            }
            Err(before) => Err(errors::invalid_handle(
                py,
                self.what(),
                &format!("it was freed with {before}"),
            )),
        }
    }
}

impl Drop for PyDeviceBuffer {
    /// The handle's reference goes through the defer scope (`defer_cleanup`).
    fn drop(&mut self) {
        if let Ok(b) = std::mem::replace(self.slot.get_mut(), Err("drop")) {
            runtime_core::memory::defer::release(b);
        }
    }
}

/// An ordered queue of work on a device. `with stream:` makes it the thread's current stream.
#[pyclass(name = "Stream", module = "runtime", frozen, eq, hash, weakref)]
pub struct PyStream {
    inner: Stream,
    /// A wrapper of a stream made elsewhere (`Stream.from_external`): it never destroys it.
    pub(crate) external: bool,
}

impl PartialEq for PyStream {
    fn eq(&self, o: &Self) -> bool {
        self.inner == o.inner
    }
}

impl std::hash::Hash for PyStream {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.inner.id().hash(h);
    }
}

impl PyStream {
    pub fn inner(&self) -> &Stream {
        &self.inner
    }
    pub fn wrap(inner: Stream) -> Self {
        PyStream {
            inner,
            external: false,
        }
    }
    /// A wrapper of a stream made elsewhere (`Stream.from_external`).
    pub fn wrap_external(inner: Stream) -> Self {
        PyStream {
            inner,
            external: true,
        }
    }
}

/// A marker in a stream, for waiting across streams and for timing.
#[pyclass(name = "Event", module = "runtime", frozen, eq, hash, weakref)]
pub struct PyEvent {
    inner: Event,
}

impl PyEvent {
    /// A handle over `inner` (which belongs to the runtime installed now).
    pub fn made_now(inner: Event) -> PyEvent {
        PyEvent { inner }
    }

    /// The core event (its methods check that it belongs to the live runtime).
    pub fn raw(&self) -> &Event {
        &self.inner
    }
}

impl PartialEq for PyEvent {
    fn eq(&self, o: &Self) -> bool {
        self.inner == o.inner
    }
}

impl std::hash::Hash for PyEvent {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.inner.id().hash(h);
    }
}
