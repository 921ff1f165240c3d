//! The memory pool and pluggable allocation: the `MemoryPool` class (a handle to a device's
//! built-in pool, CuPy's shape), `get_default_memory_pool`, `set_allocator` /
//! `get_allocator` (a Python allocator plugged into the core's `memory::Allocator` slot),
//! and `alloc`, the one path every allocation of the Python API takes.
//!
//! A plugged Python allocator is `alloc(nbytes, device, stream) -> DeviceBuffer` (the core
//! validates the buffer: see `runtime_core::memory::allocator`) and an optional
//! `free(buf, nbytes, device)`, called with the object `alloc` returned once the runtime no
//! longer uses it. The core queues given-back blocks and passes them to `free` from the
//! calling thread of its next allocation, `set_allocator`, `empty_cache` or shutdown, and of
//! `return_blocks`, which `device_free` and the `MemoryPool` queries call here.

use std::cell::RefCell;

use parking_lot::Mutex;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use runtime_core::device::Device;
use runtime_core::error::{ArgError, Result as CoreResult};
use runtime_core::memory::{Allocator, Block, Buffer, DeviceMemory};
use runtime_core::runtime as rt;
use std::sync::Arc;

use crate::convert::{device_arg, resolve, type_name};
use crate::errors::RtErr;
use crate::handles::{PyDevice, PyDeviceBuffer};

/// The `(alloc, free)` functions plugged in with `set_allocator`.
type Plugged = (Py<PyAny>, Option<Py<PyAny>>);

/// The Python functions plugged in with `set_allocator` (for `get_allocator`).
static PLUGGED: Mutex<Option<Plugged>> = Mutex::new(None);

thread_local! {
    /// The exception the plugged `alloc` raised on this thread, re-raised as is by `alloc`.
    static RAISED: RefCell<Option<PyErr>> = const { RefCell::new(None) };
}

/// Pass every block given back so far to its allocator's `free` (see the module docs).
/// Runs attached (the plugged `free` it calls is Python code), and only while a Python
/// allocator is or was plugged in: `device_free` calls it every time.
pub fn return_blocks(_py: Python<'_>) {
    if !EVER_PLUGGED.load(std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    if let Ok(r) = rt::get() {
        for d in r.devices() {
            d.memory().return_blocks();
        }
    }
}

/// Whether a Python allocator was ever plugged in (until then no block can be given back).
static EVER_PLUGGED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A Python allocator as the core sees it.
struct PyAllocator {
    alloc: Py<PyAny>,
    /// Shared with the queue without touching Python reference counts (no GIL needed).
    free: Option<Arc<Py<PyAny>>>,
}

impl PyAllocator {
    fn call(&self, py: Python<'_>, mem: &Arc<DeviceMemory>, size: u64) -> PyResult<Block> {
        let dev = mem.device();
        let stream = crate::stream::current_stream(py, Some(&dev.into_pyobject(py)?.into_any()))?;
        let obj = self.alloc.call1(py, (size, dev, stream))?;
        let b = obj.bind(py);
        let Ok(h) = b.cast::<PyDeviceBuffer>() else {
            return Err(PyTypeError::new_err(format!(
                "allocator: the plugged alloc must return a DeviceBuffer (for example from MemoryPool.malloc or a slice of one), got {}",
                type_name(b)
            )));
        };
        let h = h.get();
        // The returned handle's own range (it may be a typed or offset view).
        let (off, len) = h.contiguous_bytes("allocator")?;
        let buf = h.buffer(py)?.view(off, len).map_err(RtErr)?;
        Ok(Block::with_token(buf, Box::new(obj)))
    }
}

impl Allocator for PyAllocator {
    fn allocate(&self, mem: &Arc<DeviceMemory>, size: u64) -> CoreResult<Block> {
        let Some(_inside) = crate::interp::prepare() else {
            return Err(ArgError::new(
                "allocator",
                "the Python interpreter is shutting down: the plugged allocator cannot be called",
            )
            .into());
        };
        Python::attach(|py| {
            self.call(py, mem, size).map_err(|e| {
                let msg = format!("the plugged allocator failed: {}", e.value(py));
                RAISED.with(|r| *r.borrow_mut() = Some(e));
                ArgError::new("allocator", msg).into()
            })
        })
    }

    fn free(&self, block: Block) {
        // The core calls this on a thread that holds no runtime lock (see the module docs).
        // Once the interpreter is finalising nothing attaches: the object is left to it.
        let Some(_inside) = crate::interp::prepare() else {
            std::mem::forget(block.token);
            return;
        };
        let nbytes = block.buffer.size();
        let device = block.buffer.device();
        Python::attach(|py| {
            let obj = block
                .token
                .and_then(|t| t.downcast::<Py<PyAny>>().ok())
                .map(|o| *o);
            // No `free`: dropping our reference is all (CuPy's style).
            if let (Some(free), Some(obj)) = (&self.free, obj) {
                if let Err(e) = free.call1(py, (obj, nbytes, device)) {
                    e.write_unraisable(py, Some(free.bind(py)));
                }
            }
        });
    }
}

/// Allocate `size` bytes on `d` the way the Python API does: through the plugged allocator
/// if one is installed, else the built-in pool; without the GIL (a full device waits for
/// queued work, which may be Python kernels).
pub fn alloc(py: Python<'_>, d: &Device, size: u64) -> PyResult<Buffer> {
    // Only this call's exception: one left by an allocation that does not read it (the ACL
    // face's `acl.rt.malloc` answers with a code) must not be raised for a later failure
    // that the plugged `alloc` did not cause (a block the core refuses).
    drop(RAISED.with(|r| r.borrow_mut().take()));
    let r = py.detach(|| d.memory().malloc(size));
    match r {
        Ok(b) => Ok(b),
        Err(e) => match RAISED.with(|r| r.borrow_mut().take()) {
            Some(raised) => Err(raised),
            None => Err(RtErr(e).into()),
        },
    }
}

/// Plug a Python allocator into every device of the runtime (`None` restores the built-in
/// pool). `alloc(nbytes, device, stream)` must return a `DeviceBuffer` of that device with at
/// least `nbytes` bytes; `free(buf, nbytes, device)`, if given, gets it back once unused.
#[pyfunction]
#[pyo3(signature = (alloc=None, free=None))]
pub fn set_allocator(
    py: Python<'_>,
    alloc: Option<Bound<'_, PyAny>>,
    free: Option<Bound<'_, PyAny>>,
) -> PyResult<()> {
    let alloc = alloc.filter(|a| !a.is_none());
    let free = free.filter(|f| !f.is_none());
    for (f, name) in [(&alloc, "alloc"), (&free, "free")] {
        if let Some(f) = f {
            if !f.is_callable() {
                return Err(PyTypeError::new_err(format!(
                    "{name} must be callable or None, got {}",
                    type_name(f)
                )));
            }
        }
    }
    if alloc.is_none() && free.is_some() {
        return Err(PyValueError::new_err(
            "free: given without alloc (pass both, or None to restore the built-in pool)",
        ));
    }
    let r = rt::get().map_err(RtErr)?;
    let plug: Option<Arc<dyn Allocator>> = alloc.as_ref().map(|a| {
        Arc::new(PyAllocator {
            alloc: a.clone().unbind(),
            free: free.as_ref().map(|f| Arc::new(f.clone().unbind())),
        }) as Arc<dyn Allocator>
    });
    if plug.is_some() {
        EVER_PLUGGED.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    for d in r.devices() {
        d.memory().set_allocator(plug.clone());
    }
    let old = std::mem::replace(
        &mut *PLUGGED.lock(),
        alloc.map(|a| (a.unbind(), free.map(Bound::unbind))),
    );
    drop(old);
    return_blocks(py);
    Ok(())
}

/// The `(alloc, free)` functions plugged in with `set_allocator`, or None for the built-in
/// pool.
#[pyfunction]
pub fn get_allocator(py: Python<'_>) -> Option<Plugged> {
    let r = rt::get().ok()?;
    r.devices().first()?.memory().allocator()?;
    PLUGGED
        .lock()
        .as_ref()
        .map(|(a, f)| (a.clone_ref(py), f.as_ref().map(|f| f.clone_ref(py))))
}

/// A device's memory pool: the built-in allocator of that device (the default allocator), in
/// CuPy's `MemoryPool` shape. Every handle to one device's pool shows the same numbers.
#[pyclass(name = "MemoryPool", module = "runtime", frozen, eq, hash)]
#[derive(PartialEq, Eq, Hash)]
pub struct PyMemoryPool {
    device: usize,
}

impl PyMemoryPool {
    fn dev(&self) -> PyResult<Device> {
        Ok(rt::get()
            .map_err(RtErr)?
            .device(self.device)
            .map_err(RtErr)?
            .clone())
    }

    fn mem(&self, py: Python<'_>) -> PyResult<Arc<DeviceMemory>> {
        return_blocks(py);
        let m = self.dev()?.memory().clone();
        m.process_deferred_frees();
        Ok(m)
    }
}

#[pymethods]
impl PyMemoryPool {
    /// The pool of `device` (the current device when None).
    #[new]
    #[pyo3(signature = (device=None))]
    fn new(py: Python<'_>, device: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        Ok(PyMemoryPool {
            device: resolve(py, device, "device")?.index(),
        })
    }

    /// The pool's device.
    #[getter]
    fn device(&self) -> PyDevice {
        PyDevice::from_index(self.device)
    }

    /// Allocate `size` zeroed bytes from the built-in pool, bypassing any plugged allocator
    /// (what a plugged allocator calls to get memory). With `device`, from that device's pool:
    /// a plugged allocator is called as `alloc(nbytes, device, stream)`, so
    /// `set_allocator(pool.malloc, pool.free)` (and CuPy's `set_allocator(MemoryPool().malloc)`)
    /// serves every device, as CuPy's pool does. `stream` is accepted and not needed (the pool
    /// orders reuse itself).
    #[pyo3(signature = (size, device=None, stream=None))]
    fn malloc(
        &self,
        py: Python<'_>,
        size: &Bound<'_, PyAny>,
        device: Option<&Bound<'_, PyAny>>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyDeviceBuffer> {
        let size = crate::convert::nonneg(size, "size")?;
        if let Some(s) = stream.filter(|s| !s.is_none()) {
            crate::convert::stream_arg(Some(s))?;
        }
        let pool = match device.filter(|d| !d.is_none()) {
            Some(d) => PyMemoryPool {
                device: runtime_core::bindings::device(
                    &*rt::get().map_err(RtErr)?,
                    device_arg(d, "device")?,
                )
                .map_err(RtErr)?
                .index(),
            },
            None => PyMemoryPool {
                device: self.device,
            },
        };
        let m = pool.mem(py)?;
        let b = py.detach(|| m.allocate(size)).map_err(RtErr)?;
        Ok(PyDeviceBuffer::raw(b))
    }

    /// Give back a buffer `malloc` returned (`device_free`): the `free` of
    /// `set_allocator(pool.malloc, pool.free)`, called as `free(buf, nbytes, device)` once
    /// the runtime no longer uses the buffer (also after a shutdown, when the buffer's
    /// runtime is gone: its memory is let go of all the same). Freeing twice is refused.
    #[pyo3(signature = (buf, nbytes=None, device=None))]
    fn free(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        nbytes: Option<&Bound<'_, PyAny>>,
        device: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let h = crate::convert::buffer_arg(buf, "buf")?;
        if let Some(n) = nbytes.filter(|n| !n.is_none()) {
            crate::convert::nonneg(n, "nbytes")?;
        }
        if let Some(d) = device.filter(|d| !d.is_none()) {
            device_arg(d, "device")?;
        }
        h.get().release(py)?;
        return_blocks(py);
        Ok(())
    }

    /// Bytes held by live allocations (rounded to the allocator's block sizes).
    fn used_bytes(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.mem(py)?.stats().allocated)
    }

    /// Bytes the pool holds: used plus cached (`reserved`).
    fn total_bytes(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.mem(py)?.stats().reserved)
    }

    /// Bytes cached for reuse (`total_bytes() - used_bytes()`).
    fn free_bytes(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.mem(py)?.stats().cached)
    }

    /// Free blocks held for reuse (cached large blocks and empty slab spans).
    fn n_free_blocks(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.mem(py)?.stats().free_blocks)
    }

    /// Release every cached block (as `empty_cache` for this device). With `stream`, CuPy
    /// releases that stream's arena only; this pool has one arena per device (a block is
    /// cached only once no queued work uses it, so every stream of the device may reuse
    /// it), so a stream of the pool's device releases the same blocks as None. A stream of
    /// another device is a `ValueError`.
    #[pyo3(signature = (stream=None))]
    fn free_all_blocks(&self, py: Python<'_>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        if let Some(s) = crate::convert::stream_arg(stream)? {
            if s.device_index() != self.device {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "stream: {s:?} is on device {}, this pool on device {}",
                    s.device_index(),
                    self.device
                )));
            }
            s.check().map_err(RtErr)?;
        }
        let m = self.mem(py)?;
        py.detach(|| m.empty_cache());
        Ok(())
    }

    /// CuPy's deprecated name of `free_all_blocks()` (warns `DeprecationWarning`).
    fn free_all_free(&self, py: Python<'_>) -> PyResult<()> {
        crate::errors::deprecated_free_all_free(py)?;
        self.free_all_blocks(py, None)
    }

    /// Limit the bytes the pool may hold (`total_bytes`): `size` in bytes, or `fraction` of
    /// the device's capacity; neither (or 0) removes the limit.
    #[pyo3(signature = (size=None, fraction=None))]
    fn set_limit(
        &self,
        py: Python<'_>,
        size: Option<&Bound<'_, PyAny>>,
        fraction: Option<f64>,
    ) -> PyResult<()> {
        let size = crate::convert::opt_nonneg(size.filter(|s| !s.is_none()), "size")?;
        let m = self.mem(py)?;
        let bytes = match (size, fraction) {
            (Some(_), Some(_)) => {
                return Err(PyValueError::new_err(
                    "size and fraction: give one of them, not both",
                ))
            }
            (Some(s), None) => s,
            (None, Some(f)) => {
                if !(0.0..=1.0).contains(&f) {
                    return Err(PyValueError::new_err(format!(
                        "fraction must be between 0 and 1, got {f}"
                    )));
                }
                (m.capacity() as f64 * f) as u64
            }
            (None, None) => 0,
        };
        m.set_limit(Some(bytes)).map_err(RtErr)?;
        Ok(())
    }

    /// The limit in bytes set with `set_limit`; 0 when none.
    fn get_limit(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.mem(py)?.get_limit())
    }

    fn __repr__(&self) -> String {
        format!("MemoryPool(device={})", self.device)
    }
}

/// The memory pool of `device` (the current device when None): the default allocator.
#[pyfunction]
#[pyo3(signature = (device=None))]
pub fn get_default_memory_pool(
    py: Python<'_>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyMemoryPool> {
    let index = match device {
        Some(o) if !o.is_none() => {
            runtime_core::bindings::device(&*rt::get().map_err(RtErr)?, device_arg(o, "device")?)
                .map_err(RtErr)?
                .index()
        }
        _ => resolve(py, None, "device")?.index(),
    };
    Ok(PyMemoryPool { device: index })
}
