//! Streams, events, graphs and kernel launch.

use std::cell::RefCell;
use std::sync::Arc;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt, PyString, PyTuple};
use runtime_core::error::KernelFailure;
use runtime_core::event::Event;
use runtime_core::kernel::{self, KernelArg, Tensor};
use runtime_core::runtime as rt;
use runtime_core::stream::{Graph, Op, OpKind, Stream};

use crate::device::{resolve, PyDevice};
use crate::errors::{self, RtErr, RtResult};
use crate::memory::{numpy, PyDeviceBuffer};
use crate::wait;

/// Wait for `s` with the GIL released and Ctrl-C live, then raise its pending error.
pub fn sync_stream(py: Python<'_>, s: &Stream, timeout: Option<f64>) -> PyResult<()> {
    wait::timeout_arg(timeout)?;
    s.check().map_err(RtErr)?;
    wait_stream_reached(py, s, timeout)?;
    s.take_error().map_err(RtErr)?;
    Ok(())
}

/// Wait (GIL released, Ctrl-C live, `timeout` honoured) until `s` has run everything
/// submitted so far. Does not report errors.
fn wait_stream_reached(py: Python<'_>, s: &Stream, timeout: Option<f64>) -> PyResult<()> {
    let target = s.submitted();
    if s.reached(target) {
        return Ok(());
    }
    wait::wait(
        py,
        || format!("{s:?}"),
        timeout,
        |slice| s.wait_for(target, Some(slice)),
    )
}

thread_local! {
    static STREAM_STACK: RefCell<Vec<(runtime_core::device::Device, Option<Stream>)>> = const { RefCell::new(Vec::new()) };
}

/// Forget per-thread stream state (at shutdown).
pub fn clear_thread_state() {
    STREAM_STACK.with(|s| s.borrow_mut().clear());
}

/// An ordered queue of work on a device. `with stream:` makes it the thread's current stream.
#[pyclass(name = "Stream", module = "runtime", frozen, eq, hash, weakref)]
pub struct PyStream {
    inner: Stream,
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
        PyStream { inner }
    }
}

/// Resolve an optional stream argument: a Stream, or None for the current stream of the
/// current device.
pub fn stream_or_current(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Stream> {
    match obj {
        Some(o) if !o.is_none() => Ok(o
            .cast::<PyStream>()
            .map_err(|_| {
                PyTypeError::new_err(format!(
                    "stream must be a runtime.Stream or None, got {}",
                    type_name(o)
                ))
            })?
            .get()
            .inner
            .clone()),
        _ => {
            let d = resolve(None, "device")?;
            Ok(runtime_core::device::current_stream(&d).map_err(RtErr)?)
        }
    }
}

pub fn type_name(o: &Bound<'_, PyAny>) -> String {
    o.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default()
}

/// A Python callable (kernel or host function) as a stream op.
struct PyOp {
    name: String,
    func: Py<PyAny>,
    args: Py<PyTuple>,
    /// Convert DeviceBuffer arguments to numpy views before the call.
    views: bool,
}

impl Op for PyOp {
    fn name(&self) -> &str {
        &self.name
    }
    fn kind(&self) -> OpKind {
        OpKind::Compute
    }
    fn run(&self) -> Result<(), KernelFailure> {
        Python::attach(|py| {
            let call = || -> PyResult<()> {
                let args = self.args.bind(py);
                if self.views {
                    let asarray = numpy(py)?.getattr("asarray")?;
                    let mut conv = Vec::with_capacity(args.len());
                    for a in args.iter() {
                        if a.cast::<PyDeviceBuffer>().is_ok() {
                            conv.push(asarray.call1((a,))?);
                        } else {
                            conv.push(a);
                        }
                    }
                    self.func.bind(py).call1(PyTuple::new(py, conv)?)?;
                } else {
                    self.func.bind(py).call1(args)?;
                }
                Ok(())
            };
            call().map_err(|e| {
                let ty = e
                    .get_type(py)
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_default();
                let mut f = KernelFailure::new(self.name.clone(), format!("{ty}: {}", e.value(py)));
                f.payload = Some(errors::cause_payload(e));
                f
            })
        })
    }
}

fn callable_name(f: &Bound<'_, PyAny>) -> String {
    f.getattr("__qualname__")
        .or_else(|_| f.getattr("__name__"))
        .and_then(|n| n.extract::<String>())
        .unwrap_or_else(|_| type_name(f))
}

/// A native kernel from the registry, by name.
#[pyclass(name = "Kernel", module = "runtime", frozen)]
pub struct PyKernel {
    #[pyo3(get)]
    name: String,
    kernel: Arc<dyn kernel::Kernel>,
}

#[pymethods]
impl PyKernel {
    #[new]
    fn new(name: &str) -> PyResult<Self> {
        let k = kernel::find(name).map_err(RtErr)?;
        Ok(PyKernel {
            name: name.to_string(),
            kernel: k,
        })
    }

    fn __repr__(&self) -> String {
        format!("runtime.kernels.{}", self.name)
    }

    /// Launch on `stream` (the current stream when None).
    #[pyo3(signature = (*args, stream=None))]
    fn __call__(
        &self,
        py: Python<'_>,
        args: &Bound<'_, PyTuple>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let s = stream_or_current(stream)?;
        launch_native(py, &s, self.kernel.clone(), args)
    }
}

/// Names of the registered native kernels.
#[pyfunction]
pub fn kernel_names() -> Vec<String> {
    kernel::names()
}

fn native_args(py: Python<'_>, args: &Bound<'_, PyTuple>) -> PyResult<Vec<KernelArg>> {
    let mut out = Vec::with_capacity(args.len());
    for (i, a) in args.iter().enumerate() {
        if let Ok(b) = a.cast::<PyDeviceBuffer>() {
            let b = b.get();
            let t = Tensor::new(b.buffer(py)?, b.offset(), b.dtype(), b.shape_usize())
                .map_err(RtErr)?;
            out.push(KernelArg::Tensor(t));
        } else if a.is_instance_of::<PyBool>() {
            out.push(KernelArg::Int(i64::from(a.extract::<bool>()?)));
        } else if a.is_instance_of::<PyInt>() {
            let v: i64 = a.extract().map_err(|_| {
                PyValueError::new_err(format!("args[{i}]: integer out of 64-bit range"))
            })?;
            out.push(KernelArg::Int(v));
        } else if a.is_instance_of::<PyFloat>() {
            out.push(KernelArg::Float(a.extract()?));
        } else if let Ok(v) = a.call_method0("__float__").and_then(|f| f.extract::<f64>()) {
            // numpy scalars and other number-likes
            out.push(KernelArg::Float(v));
        } else {
            return Err(PyTypeError::new_err(format!(
                "args[{i}] must be a DeviceBuffer or a number for a native kernel, got {}",
                type_name(&a)
            )));
        }
    }
    Ok(out)
}

fn launch_op(py: Python<'_>, s: &Stream, op: Arc<dyn Op>) -> PyResult<()> {
    if s.enqueue(op).map_err(RtErr)? {
        after_enqueue(py, s)?;
    }
    Ok(())
}

/// After a launch was queued: in synchronous mode wait for it and raise its error; otherwise
/// wait (GIL released, Ctrl-C live) only while the stream's backlog is full
/// (`Stream::backlog_target`).
pub fn after_enqueue(py: Python<'_>, s: &Stream) -> PyResult<()> {
    if s.is_sync_mode() {
        return sync_stream(py, s, None);
    }
    if let Some(target) = s.backlog_target() {
        wait::wait(
            py,
            || format!("{s:?}"),
            None,
            |slice| s.wait_for(target, Some(slice)),
        )?;
    }
    Ok(())
}

fn launch_native(
    py: Python<'_>,
    s: &Stream,
    k: Arc<dyn kernel::Kernel>,
    args: &Bound<'_, PyTuple>,
) -> PyResult<()> {
    let args = native_args(py, args)?;
    let op = kernel::prepare(s, k, args).map_err(RtErr)?;
    launch_op(py, s, op)
}

fn to_tuple<'py>(
    py: Python<'py>,
    args: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyTuple>> {
    match args {
        None => Ok(PyTuple::empty(py)),
        Some(a) if a.is_none() => Ok(PyTuple::empty(py)),
        Some(a) => {
            if let Ok(t) = a.cast::<PyTuple>() {
                return Ok(t.clone());
            }
            if a.is_instance_of::<PyString>() {
                return Err(PyTypeError::new_err(
                    "args must be a tuple or list of arguments, got str",
                ));
            }
            let items: Vec<Bound<'py, PyAny>> = a
                .try_iter()
                .map_err(|_| {
                    PyTypeError::new_err(format!(
                        "args must be a tuple or list of arguments, got {}",
                        type_name(a)
                    ))
                })?
                .collect::<PyResult<_>>()?;
            PyTuple::new(py, items)
        }
    }
}

#[pymethods]
impl PyStream {
    #[new]
    #[pyo3(signature = (device=None, priority=None))]
    fn new(
        device: Option<&Bound<'_, PyAny>>,
        priority: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let p: i32 = match priority {
            Some(p) if !p.is_none() => {
                if p.is_instance_of::<PyBool>() || !p.is_instance_of::<PyInt>() {
                    return Err(PyTypeError::new_err(format!(
                        "priority must be an int, got {}",
                        type_name(p)
                    )));
                }
                // Fix: an int outside i32 used to be reported as "got 2147483647" (clamped);
                // name the value the caller passed.
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
        let d = resolve(device, "device")?;
        Ok(PyStream {
            inner: Stream::new(&d, p).map_err(RtErr)?,
        })
    }

    #[getter]
    fn device(&self) -> PyDevice {
        PyDevice::from_index(self.inner.device_index())
    }

    #[getter]
    fn priority(&self) -> i32 {
        self.inner.priority()
    }

    #[getter]
    fn id(&self) -> u64 {
        self.inner.id()
    }

    #[getter]
    fn is_default(&self) -> bool {
        self.inner.is_default()
    }

    /// Queue `kernel` with `args`: a native kernel (`runtime.kernels.fill` or its name) or any
    /// Python callable (runs on the stream's executor; DeviceBuffer arguments arrive as numpy
    /// views sharing device memory).
    #[pyo3(signature = (kernel, args=None))]
    fn launch_kernel(
        &self,
        py: Python<'_>,
        kernel: &Bound<'_, PyAny>,
        args: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let args = to_tuple(py, args)?;
        if let Ok(k) = kernel.cast::<PyKernel>() {
            return launch_native(py, &self.inner, k.get().kernel.clone(), &args);
        }
        if let Ok(name) = kernel.cast::<PyString>() {
            let k = kernel::find(&name.to_cow()?).map_err(RtErr)?;
            return launch_native(py, &self.inner, k, &args);
        }
        if !kernel.is_callable() {
            return Err(PyTypeError::new_err(format!(
                "kernel must be a callable, a runtime.kernels kernel or a kernel name, got {}",
                type_name(kernel)
            )));
        }
        self.inner.check().map_err(RtErr)?;
        // Views keep the memory of every buffer argument alive until the kernel has run.
        let mut held = Vec::with_capacity(args.len());
        for a in args.iter() {
            if let Ok(b) = a.cast::<PyDeviceBuffer>() {
                held.push(Bound::new(py, b.get().share(py)?)?.into_any());
            } else {
                held.push(a);
            }
        }
        let op = Arc::new(PyOp {
            name: callable_name(kernel),
            func: kernel.clone().unbind(),
            args: PyTuple::new(py, held)?.unbind(),
            views: true,
        });
        launch_op(py, &self.inner, op)
    }

    /// Queue a host function `fn(*args)`, run in stream order on the executor.
    #[pyo3(signature = (func, *args))]
    fn launch_host_func(
        &self,
        py: Python<'_>,
        func: &Bound<'_, PyAny>,
        args: &Bound<'_, PyTuple>,
    ) -> PyResult<()> {
        if !func.is_callable() {
            return Err(PyTypeError::new_err(format!(
                "func must be callable, got {}",
                type_name(func)
            )));
        }
        let op = Arc::new(PyOp {
            name: callable_name(func),
            func: func.clone().unbind(),
            args: args.clone().unbind(),
            views: false,
        });
        launch_op(py, &self.inner, op)
    }

    /// Wait until all queued work has run (GIL released; Ctrl-C works), then raise the first
    /// kernel error since the last synchronisation as `KernelError`. `timeout` in seconds
    /// raises `WaitTimeoutError`.
    #[pyo3(signature = (timeout=None))]
    fn synchronize(&self, py: Python<'_>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let timeout = wait::timeout_obj(timeout)?; // Fix: see `wait::timeout_obj`
        sync_stream(py, &self.inner, timeout)
    }

    /// Whether all queued work has run.
    fn query(&self) -> RtResult<bool> {
        Ok(self.inner.query()?)
    }

    /// Make later work on this stream wait until `event` (its latest record) completes.
    fn wait_event(&self, event: &Bound<'_, PyAny>) -> PyResult<()> {
        let e = event_arg(event)?;
        self.inner.wait_event(&e).map_err(RtErr)?;
        Ok(())
    }

    /// Make later work on this stream wait for everything queued so far on `other`.
    fn wait_stream(&self, other: &Bound<'_, PyStream>) -> RtResult<()> {
        let e = Event::new(false, false);
        other.get().inner.record(&e)?;
        self.inner.wait_event(&e)?;
        Ok(())
    }

    /// Record and return a new event on this stream.
    #[pyo3(signature = (enable_timing=true))]
    fn record_event(&self, enable_timing: bool) -> RtResult<PyEvent> {
        let e = Event::new(enable_timing, false);
        self.inner.record(&e)?;
        Ok(PyEvent::made_now(e))
    }

    /// Start capturing work into a graph (see `end_capture`).
    fn begin_capture(&self) -> RtResult<()> {
        Ok(self.inner.begin_capture()?)
    }

    /// Stop capturing and return the captured `Graph`.
    fn end_capture(&self) -> RtResult<PyGraph> {
        Ok(PyGraph {
            inner: self.inner.end_capture()?,
        })
    }

    #[getter]
    fn is_capturing(&self) -> bool {
        self.inner.is_capturing()
    }

    /// Let queued work finish, then invalidate the stream (raises a pending kernel error).
    fn destroy(&self, py: Python<'_>) -> PyResult<()> {
        let s = &self.inner;
        s.check().map_err(RtErr)?;
        wait_stream_reached(py, s, None)?;
        py.detach(|| s.destroy()).map_err(RtErr)?;
        Ok(())
    }

    fn __enter__(slf: Bound<'_, Self>) -> PyResult<Bound<'_, Self>> {
        let s = &slf.get().inner;
        s.check().map_err(RtErr)?;
        let d = rt::get()
            .and_then(|r| r.device(s.device_index() as i64).cloned())
            .map_err(RtErr)?;
        let prev = runtime_core::device::set_current_stream(&d, Some(s.clone()));
        STREAM_STACK.with(|st| st.borrow_mut().push((d, prev)));
        Ok(slf)
    }

    fn __exit__(
        &self,
        _t: Option<&Bound<'_, PyAny>>,
        _v: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) {
        if let Some((d, prev)) = STREAM_STACK.with(|st| st.borrow_mut().pop()) {
            runtime_core::device::set_current_stream(&d, prev);
        }
    }

    fn __repr__(&self) -> String {
        let dead = if self.inner.is_destroyed() {
            ", destroyed"
        } else {
            ""
        };
        format!(
            "runtime.Stream(id={}, device={}, priority={}{dead})",
            self.inner.id(),
            self.inner.device_index(),
            self.inner.priority()
        )
    }
}

fn event_arg(obj: &Bound<'_, PyAny>) -> PyResult<Event> {
    Ok(obj
        .cast::<PyEvent>()
        .map_err(|_| {
            PyTypeError::new_err(format!(
                "event must be a runtime.Event, got {}",
                type_name(obj)
            ))
        })?
        .get()
        .live()?
        .clone())
}

/// A marker in a stream, for waiting across streams and for timing.
#[pyclass(name = "Event", module = "runtime", frozen, eq, hash, weakref)]
pub struct PyEvent {
    inner: Event,
    /// The runtime generation it was made under.
    generation: u64,
}

impl PyEvent {
    fn made_now(inner: Event) -> PyEvent {
        PyEvent {
            inner,
            generation: rt::live_generation(),
        }
    }

    /// The event, if the runtime that made it is still the installed one.
    // Fix: events were not tied to a runtime: one made before a shutdown kept working after
    // the next `init`, unlike buffers and streams (and unlike CUDA, where an event belongs to
    // its context).
    fn live(&self) -> RtResult<&Event> {
        if rt::live_generation() == self.generation {
            return Ok(&self.inner);
        }
        rt::get()?; // not initialised: NotInitializedError, as for every other call
        Err(RtErr(
            runtime_core::error::DeviceError::InvalidHandle {
                what: format!("Event#{}", self.inner.id()),
                why: "the runtime was shut down".into(),
            }
            .into(),
        ))
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

#[pymethods]
impl PyEvent {
    #[new]
    #[pyo3(signature = (enable_timing=None, blocking=None))]
    fn new(
        enable_timing: Option<&Bound<'_, PyAny>>,
        blocking: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let flag = |o: Option<&Bound<'_, PyAny>>, name: &str, default: bool| -> PyResult<bool> {
            match o {
                None => Ok(default),
                Some(v) => Ok(v
                    .cast::<PyBool>()
                    .map_err(|_| {
                        PyTypeError::new_err(format!("{name} must be a bool, got {}", type_name(v)))
                    })?
                    .is_true()),
            }
        };
        let t = flag(enable_timing, "enable_timing", true)?;
        let b = flag(blocking, "blocking", false)?;
        rt::get().map_err(RtErr)?;
        Ok(PyEvent::made_now(Event::new(t, b)))
    }

    /// Record on `stream` (the current stream when None).
    #[pyo3(signature = (stream=None))]
    fn record(&self, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let s = stream_or_current(stream)?;
        s.record(self.live()?).map_err(RtErr)?;
        Ok(())
    }

    /// Whether the latest record has completed (True if never recorded).
    fn query(&self) -> RtResult<bool> {
        Ok(self.live()?.query()?)
    }

    /// Wait for the latest record (GIL released; Ctrl-C works; `timeout` in seconds).
    #[pyo3(signature = (timeout=None))]
    fn synchronize(&self, py: Python<'_>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let timeout = wait::timeout_obj(timeout)?; // Fix: see `wait::timeout_obj`
        wait::timeout_arg(timeout)?;
        let e = self.live()?;
        if e.query().map_err(RtErr)? {
            return Ok(());
        }
        let mut res = Ok(true);
        wait::wait(
            py,
            || format!("{e:?}"),
            timeout,
            |slice| {
                res = e.synchronize(Some(slice));
                !matches!(res, Ok(false))
            },
        )?;
        res.map(|_| ()).map_err(|e| RtErr(e).into())
    }

    /// Make `stream` (current when None) wait for this event.
    #[pyo3(signature = (stream=None))]
    fn wait(&self, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let s = stream_or_current(stream)?;
        s.wait_event(self.live()?).map_err(RtErr)?;
        Ok(())
    }

    /// Milliseconds from this event to `end`. Both must be recorded with timing enabled and
    /// completed, otherwise raises (NotReadyError while pending).
    fn elapsed_time(&self, end: &Bound<'_, PyAny>) -> PyResult<f64> {
        let e = event_arg(end)?;
        Ok(self.live()?.elapsed_time(&e).map_err(RtErr)?)
    }

    /// Completion time of the latest record, in ns of the runtime's monotonic clock.
    #[getter]
    fn timestamp_ns(&self) -> RtResult<u64> {
        Ok(self.live()?.timestamp_ns()?)
    }

    #[getter]
    fn enable_timing(&self) -> bool {
        self.inner.timing()
    }

    #[getter]
    fn blocking(&self) -> bool {
        self.inner.blocking()
    }

    #[getter]
    fn id(&self) -> u64 {
        self.inner.id()
    }

    /// Invalidate the handle; records already queued still complete.
    fn destroy(&self) -> RtResult<()> {
        Ok(self.inner.destroy()?)
    }

    fn __repr__(&self) -> String {
        format!(
            "runtime.Event(id={}, enable_timing={})",
            self.inner.id(),
            if self.inner.timing() { "True" } else { "False" }
        )
    }
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
        let s = stream_or_current(stream)?;
        if s.enqueue_graph(&self.inner).map_err(RtErr)? {
            after_enqueue(py, &s)?;
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
    let timeout = wait::timeout_obj(timeout)?; // Fix: see `wait::timeout_obj`
    rt::get().map_err(RtErr)?;
    let mut res = Ok(true);
    wait::wait(
        py,
        || "stream_synchronize".to_string(),
        timeout,
        |slice| {
            res = runtime_core::runtime::synchronize_all(Some(slice));
            !matches!(res, Ok(false))
        },
    )?;
    res.map(|_| ()).map_err(|e| RtErr(e).into())
}

/// The calling thread's current stream on `device` (the current device when None).
#[pyfunction]
#[pyo3(signature = (device=None))]
pub fn current_stream(device: Option<&Bound<'_, PyAny>>) -> PyResult<PyStream> {
    let d = resolve(device, "device")?;
    Ok(PyStream {
        inner: runtime_core::device::current_stream(&d).map_err(RtErr)?,
    })
}

/// The default stream of `device` (the current device when None).
#[pyfunction]
#[pyo3(signature = (device=None))]
pub fn default_stream(device: Option<&Bound<'_, PyAny>>) -> PyResult<PyStream> {
    let d = resolve(device, "device")?;
    Ok(PyStream {
        inner: d.default_stream().map_err(RtErr)?,
    })
}

/// The documented stream priority range as (lowest, highest); lower numbers are more urgent.
#[pyfunction]
pub fn stream_priority_range() -> (i32, i32) {
    (
        runtime_core::stream::PRIORITY_LOWEST,
        runtime_core::stream::PRIORITY_HIGHEST,
    )
}
