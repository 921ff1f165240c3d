//! The `Stream` class (launch, synchronise, events, capture, `with stream:`), the `Graph`
//! class, and the stream functions (`stream_synchronize`, `current_stream`, ...). Launches are
//! converted in `kernel`; waits and submission are in `wait`.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyTuple};
use pyo3::IntoPyObject;
use runtime_core::event::{Event, EventOptions};
use runtime_core::runtime as rt;
use runtime_core::stream::{Graph, Stream};

use crate::context;
use crate::convert::{event_arg, resolve, stream_or_current, timeout_obj, type_name};
use crate::errors::{RtErr, RtResult};
use crate::handles::{PyDevice, PyEvent, PyStream};
use crate::kernel;
use crate::wait;

/// The handle in what a `__cuda_stream__()` returned: `(0, handle)` (CuPy's checks and
/// messages for the protocol).
fn cuda_stream_handle(r: &Bound<'_, PyAny>) -> PyResult<u64> {
    let t = r
        .cast::<PyTuple>()
        .ok()
        .filter(|t| t.len() == 2)
        .ok_or_else(|| {
            PyTypeError::new_err(format!(
                "handle: __cuda_stream__() must return a 2-tuple (version, handle), got {}",
                crate::convert::repr(r)
            ))
        })?;
    let (v, h) = (t.get_item(0)?, t.get_item(1)?);
    let is_int =
        |o: &Bound<'_, PyAny>| o.is_instance_of::<PyInt>() && !o.is_instance_of::<PyBool>();
    if !is_int(&v) || !is_int(&h) {
        return Err(PyTypeError::new_err(format!(
            "handle: __cuda_stream__() must return (int, int), got {}",
            crate::convert::repr(r)
        )));
    }
    if v.extract::<i64>().ok() != Some(0) {
        return Err(PyTypeError::new_err(format!(
            "handle: __cuda_stream__() returned unsupported version {} (only 0 is known)",
            crate::convert::repr(&v)
        )));
    }
    crate::convert::nonneg(&h, "handle")
}

#[pymethods]
impl PyStream {
    #[new]
    #[pyo3(signature = (device=None, priority=None, non_blocking=None))]
    fn new(
        py: Python<'_>,
        device: Option<&Bound<'_, PyAny>>,
        priority: Option<&Bound<'_, PyAny>>,
        non_blocking: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let non_blocking = match non_blocking {
            None => false,
            Some(v) => v
                .cast::<PyBool>()
                .map_err(|_| {
                    PyTypeError::new_err(format!(
                        "non_blocking must be a bool, got {}",
                        type_name(v)
                    ))
                })?
                .is_true(),
        };
        let p: i32 = match priority {
            Some(p) if !p.is_none() => {
                if p.is_instance_of::<PyBool>() || !p.is_instance_of::<PyInt>() {
                    return Err(PyTypeError::new_err(format!(
                        "priority must be an int, got {}",
                        type_name(p)
                    )));
                }
                // Name the value the caller passed (not a clamped one) when it is outside i32.
                p.extract().map_err(|_| {
                    PyValueError::new_err(format!(
                        "priority: must be between {} (highest) and {} (lowest), got {}",
                        runtime_core::stream::PRIORITY_HIGHEST,
                        runtime_core::stream::PRIORITY_LOWEST,
                        p.repr().map(|r| r.to_string()).unwrap_or_default()
                    ))
                })?
            }
            _ => 0,
        };
        let d = resolve(py, device, "device")?;
        let s = if non_blocking {
            Stream::new_non_blocking(&d, p)
        } else {
            Stream::new(&d, p)
        };
        Ok(PyStream::wrap(s.map_err(RtErr)?))
    }

    /// Whether the stream was made with `non_blocking=True` (it never synchronises with the
    /// default stream, also under the `legacyDefaultStream` option).
    #[getter]
    fn is_non_blocking(&self) -> bool {
        self.inner().is_non_blocking()
    }

    /// Make this stream the current stream of its device, and its device current (CuPy's
    /// `Stream.use`; see `set_stream`). Returns the stream.
    #[pyo3(name = "use")]
    fn use_(slf: Bound<'_, Self>) -> PyResult<Bound<'_, Self>> {
        set_current(slf.py(), slf.get().inner())?;
        Ok(slf)
    }

    /// The CUDA stream protocol: `(0, handle)`, the handle being the stream id (what
    /// `__cuda_array_interface__` and DLPack take as a stream here).
    fn __cuda_stream__(&self) -> (u32, u64) {
        (0, self.inner().id())
    }

    /// Queue `callback(stream, status, arg)` in stream order (CuPy's `add_callback`; `arg`
    /// defaults to None, as numba's `stream.add_callback(callback, arg=None)`). `status` is 0:
    /// a callback behind a failed operation is skipped, as every host function is, until
    /// `synchronize` reports the error.
    #[pyo3(signature = (callback, arg=None))]
    fn add_callback(
        slf: &Bound<'_, Self>,
        callback: &Bound<'_, PyAny>,
        arg: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let py = slf.py();
        if !callback.is_callable() {
            return Err(PyTypeError::new_err(format!(
                "callback must be callable, got {}",
                type_name(callback)
            )));
        }
        let args = PyTuple::new(
            py,
            [
                slf.as_any().clone(),
                0i32.into_pyobject(py)?.into_any(),
                arg.map_or_else(|| py.None().into_bound(py), Bound::clone),
            ],
        )?;
        kernel::launch_host_func(py, slf.get().inner(), callback, &args)
    }

    /// A context manager that synchronises the stream when its block ends without an
    /// exception (numba's `stream.auto_synchronize()`); `with` yields the stream.
    fn auto_synchronize(slf: Bound<'_, Self>) -> AutoSynchronize {
        AutoSynchronize {
            stream: slf.unbind(),
        }
    }

    /// An awaitable that completes (with the stream) once the work queued so far has run
    /// (numba's `async_done`): an event recorded now, resolved from the engine without
    /// polling. Must be called with an asyncio event loop running.
    fn async_done<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let e = Event::with_options(EventOptions::without_timing());
        slf.get().inner().record(&e).map_err(RtErr)?;
        let ev = Bound::new(py, PyEvent::made_now(e))?;
        py.import("runtime._aio")?
            .getattr("event_future")?
            .call1((ev, slf))
    }

    #[getter]
    fn device(&self) -> PyDevice {
        PyDevice::from_index(self.inner().device_index())
    }

    #[getter]
    fn priority(&self) -> i32 {
        self.inner().priority()
    }

    #[getter]
    fn id(&self) -> u64 {
        self.inner().id()
    }

    /// A stream made elsewhere, wrapped from its handle (`id`), as CuPy's
    /// `ExternalStream(ptr)` / torch's `ExternalStream(stream_ptr)`: `handle` is a stream's
    /// `id` (an int) or a `Stream`. Work queued through the wrapper goes to that same stream;
    /// the wrapper never destroys it (`destroy()` refuses). `device`, when given, must be the
    /// stream's device. An unknown or destroyed handle is an `InvalidHandleError`.
    #[staticmethod]
    #[pyo3(signature = (handle, device=None))]
    fn from_external(
        py: Python<'_>,
        handle: &Bound<'_, PyAny>,
        device: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyStream> {
        let id = if let Ok(s) = handle.cast::<PyStream>() {
            s.get().inner().id()
        } else if handle.is_instance_of::<PyInt>() && !handle.is_instance_of::<PyBool>() {
            crate::convert::nonneg(handle, "handle")?
        } else if let Ok(f) = handle.getattr("__cuda_stream__") {
            cuda_stream_handle(&f.call0()?)?
        } else {
            return Err(PyTypeError::new_err(format!(
                "handle must be a stream handle (Stream.id, an int), a runtime.Stream or an object implementing __cuda_stream__; {} does not implement __cuda_stream__",
                type_name(handle)
            )));
        };
        let r = rt::get().map_err(RtErr)?;
        let d = match device.filter(|d| !d.is_none()) {
            Some(d) => Some(resolve(py, Some(d), "device")?),
            None => None,
        };
        let s = runtime_core::bindings::stream_by_id(&r, id, d.as_ref()).map_err(RtErr)?;
        Ok(PyStream::wrap_external(s))
    }

    /// Whether this object wraps a stream made elsewhere (`Stream.from_external`).
    #[getter]
    fn is_external(&self) -> bool {
        self.external
    }

    #[getter]
    fn is_default(&self) -> bool {
        self.inner().is_default()
    }

    /// Queue `kernel` with `args`: a native kernel (`runtime.kernels.fill` or its name) or any
    /// Python callable (runs on the stream's executor; DeviceBuffer arguments arrive as numpy
    /// views sharing device memory), as `block_dim` blocks (None: the kernel chooses; one
    /// for a Python callable).
    #[pyo3(signature = (kernel, args=None, block_dim=None))]
    fn launch_kernel(
        &self,
        py: Python<'_>,
        kernel: &Bound<'_, PyAny>,
        args: Option<&Bound<'_, PyAny>>,
        block_dim: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        kernel::launch_kernel(py, self.inner(), kernel, args, block_dim)
    }

    /// Queue a host function `fn(*args)`, run in stream order on the executor.
    #[pyo3(signature = (func, *args))]
    fn launch_host_func(
        &self,
        py: Python<'_>,
        func: &Bound<'_, PyAny>,
        args: &Bound<'_, PyTuple>,
    ) -> PyResult<()> {
        kernel::launch_host_func(py, self.inner(), func, args)
    }

    /// Wait until all queued work has run (GIL released; Ctrl-C works), then raise the first
    /// kernel error since the last synchronisation as `KernelError`. `timeout` in seconds
    /// raises `WaitTimeoutError`.
    #[pyo3(signature = (timeout=None))]
    fn synchronize(&self, py: Python<'_>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let timeout = timeout_obj(timeout)?;
        wait::sync_stream(py, self.inner(), timeout)
    }

    /// Whether all queued work has run.
    fn query(&self) -> RtResult<bool> {
        Ok(self.inner().query()?)
    }

    /// Make later work on this stream wait until `event` (its latest record) completes.
    fn wait_event(&self, event: &Bound<'_, PyAny>) -> PyResult<()> {
        let e = event_arg(event)?;
        self.inner().wait_event(&e).map_err(RtErr)?;
        Ok(())
    }

    /// Make later work on this stream wait for everything queued so far on `other`.
    fn wait_stream(&self, other: &Bound<'_, PyStream>) -> RtResult<()> {
        Ok(self.inner().wait_stream(other.get().inner())?)
    }

    /// Record `event` on this stream and return it; a new event (with `enable_timing`) when
    /// None (torch's `Stream.record_event`).
    #[pyo3(signature = (event=None, *, enable_timing=true))]
    fn record_event(
        &self,
        py: Python<'_>,
        event: Option<&Bound<'_, PyAny>>,
        enable_timing: bool,
    ) -> PyResult<Py<PyEvent>> {
        let ev = match event.filter(|e| !e.is_none()) {
            Some(e) => e
                .cast::<PyEvent>()
                .map_err(|_| {
                    PyTypeError::new_err(format!(
                        "event must be a runtime.Event or None (enable_timing is keyword-only), got {}",
                        type_name(e)
                    ))
                })?
                .clone(),
            None => Bound::new(
                py,
                PyEvent::made_now(Event::with_options(EventOptions {
                    timing: enable_timing,
                    blocking: false,
                })),
            )?,
        };
        self.inner().record(ev.get().raw()).map_err(RtErr)?;
        Ok(ev.unbind())
    }

    /// Start capturing work into a graph (see `end_capture`).
    fn begin_capture(&self) -> RtResult<()> {
        Ok(self.inner().begin_capture()?)
    }

    /// Stop capturing and return the captured `Graph`.
    fn end_capture(&self) -> RtResult<PyGraph> {
        Ok(PyGraph {
            inner: self.inner().end_capture()?,
        })
    }

    #[getter]
    fn is_capturing(&self) -> bool {
        self.inner().is_capturing()
    }

    /// Let queued work finish, then invalidate the stream (raises a pending kernel error).
    fn destroy(&self, py: Python<'_>) -> PyResult<()> {
        let s = self.inner();
        if self.external {
            return Err(crate::errors::invalid_operation(
                py,
                format!(
                    "{s:?} is wrapped from a handle (Stream.from_external): the wrapper never destroys it; destroy it through the Stream that made it"
                ),
            ));
        }
        s.check().map_err(RtErr)?;
        wait::stream_reached(py, s, None)?;
        py.detach(|| s.destroy()).map_err(RtErr)?;
        Ok(())
    }

    /// Make this stream current, and its device the current device, for the block (in this
    /// thread or asyncio task only); both are restored on exit.
    fn __enter__(slf: Bound<'_, Self>) -> PyResult<Bound<'_, Self>> {
        let s = slf.get().inner();
        s.check().map_err(RtErr)?;
        let d = rt::get()
            .and_then(|r| r.device(s.device_index()).cloned())
            .map_err(RtErr)?;
        context::enter(slf.py(), &d, Some(s))?;
        Ok(slf)
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _t: Option<&Bound<'_, PyAny>>,
        _v: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        context::exit(py)
    }

    fn __repr__(&self) -> String {
        let dead = if self.inner().is_destroyed() {
            ", destroyed"
        } else {
            ""
        };
        format!(
            "runtime.Stream(id={}, device={}, priority={}{dead})",
            self.inner().id(),
            self.inner().device_index(),
            self.inner().priority()
        )
    }
}

/// What `Stream.auto_synchronize()` returns: `with` yields the stream and synchronises it at
/// the end of a block that raised nothing.
#[pyclass(name = "_AutoSynchronize", module = "runtime._runtime", frozen)]
pub struct AutoSynchronize {
    stream: Py<PyStream>,
}

#[pymethods]
impl AutoSynchronize {
    fn __enter__(&self, py: Python<'_>) -> Py<PyStream> {
        self.stream.clone_ref(py)
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        t: Option<&Bound<'_, PyAny>>,
        _v: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        if t.is_some_and(|t| !t.is_none()) {
            return Ok(());
        }
        wait::sync_stream(py, self.stream.get().inner(), None)
    }
}

/// Make `s` current on its device, and its device current (`Stream.use`, `set_stream`).
fn set_current(py: Python<'_>, s: &Stream) -> PyResult<()> {
    s.check().map_err(RtErr)?;
    let d = rt::get()
        .and_then(|r| r.device(s.device_index()).cloned())
        .map_err(RtErr)?;
    context::use_stream(py, &d, s)
}

/// Make `stream` the current stream of its device and its device the current device
/// (torch's `set_stream`; None does nothing). Inside a `with`, for the rest of that block.
#[pyfunction]
#[pyo3(signature = (stream))]
pub fn set_stream(py: Python<'_>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
    match stream.filter(|s| !s.is_none()) {
        None => Ok(()),
        Some(s) => {
            let s = s.cast::<PyStream>().map_err(|_| {
                PyTypeError::new_err(format!(
                    "stream must be a runtime.Stream or None, got {}",
                    type_name(s)
                ))
            })?;
            set_current(py, s.get().inner())
        }
    }
}

/// Whether the current stream (of the current device) is capturing (torch's
/// `is_current_stream_capturing`).
#[pyfunction]
pub fn is_current_stream_capturing(py: Python<'_>) -> PyResult<bool> {
    let d = resolve(py, None, "device")?;
    Ok(context::stream(py, &d)?.is_capturing())
}

/// A captured sequence of stream work; `graph.launch(stream)` replays it as one command.
#[pyclass(name = "Graph", module = "runtime", frozen)]
pub struct PyGraph {
    inner: Graph,
}

#[pymethods]
impl PyGraph {
    /// Replay on `stream` (the current stream when None).
    #[pyo3(signature = (stream=None))]
    fn launch(&self, py: Python<'_>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let s = stream_or_current(py, stream)?;
        if runtime_core::bindings::enqueue_graph(&s, &self.inner).map_err(RtErr)? {
            wait::after_enqueue(py, &s)?;
        }
        Ok(())
    }

    /// Alias of `launch`.
    #[pyo3(signature = (stream=None))]
    fn replay(&self, py: Python<'_>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        self.launch(py, stream)
    }

    /// Names of the captured steps.
    #[getter]
    fn nodes(&self) -> Vec<String> {
        self.inner.node_names()
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    fn __repr__(&self) -> String {
        format!("runtime.Graph({} nodes)", self.inner.len())
    }
}

/// Wait for every stream of every device (GIL released; Ctrl-C works).
#[pyfunction]
#[pyo3(signature = (timeout=None))]
pub fn stream_synchronize(py: Python<'_>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
    let timeout = timeout_obj(timeout)?;
    if !runtime_core::bindings::barrier_has_work().map_err(RtErr)? {
        crate::convert::timeout_arg(timeout)?;
        return Ok(()); // nothing to wait for: the GIL is not released
    }
    wait::wait_result(
        py,
        || "stream_synchronize".to_string(),
        timeout,
        |slice| runtime_core::bindings::wait_all(Some(slice)),
    )
}

/// The current stream on `device` (the current device when None): the one the innermost
/// `with stream:` of this thread or task made current there, else the thread's.
#[pyfunction]
#[pyo3(signature = (device=None))]
pub fn current_stream(py: Python<'_>, device: Option<&Bound<'_, PyAny>>) -> PyResult<PyStream> {
    let d = resolve(py, device, "device")?;
    Ok(PyStream::wrap(context::stream(py, &d)?))
}

/// The default stream of `device` (the current device when None).
#[pyfunction]
#[pyo3(signature = (device=None))]
pub fn default_stream(py: Python<'_>, device: Option<&Bound<'_, PyAny>>) -> PyResult<PyStream> {
    let d = resolve(py, device, "device")?;
    Ok(PyStream::wrap(d.default_stream().map_err(RtErr)?))
}

/// The documented stream priority range as (lowest, highest); lower numbers are more urgent.
#[pyfunction]
pub fn stream_priority_range() -> (i32, i32) {
    (
        runtime_core::stream::PRIORITY_LOWEST,
        runtime_core::stream::PRIORITY_HIGHEST,
    )
}
