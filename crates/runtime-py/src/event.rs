//! The `Event` class: record, query, wait, synchronise, timing. The handle data and its
//! runtime check (`PyEvent::live`) are in `handles`.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBool;
use runtime_core::event::{Event, EventOptions};
use runtime_core::runtime as rt;

use crate::convert::{event_arg, stream_or_current, timeout_arg, timeout_obj, type_name};
use crate::errors::{RtErr, RtResult};
use crate::handles::{PyDevice, PyEvent};
use crate::wait;

#[pymethods]
impl PyEvent {
    #[new]
    #[pyo3(signature = (enable_timing=None, blocking=None, interprocess=None))]
    fn new(
        enable_timing: Option<&Bound<'_, PyAny>>,
        blocking: Option<&Bound<'_, PyAny>>,
        interprocess: Option<&Bound<'_, PyAny>>,
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
        let ipc = flag(interprocess, "interprocess", false)?;
        rt::get().map_err(RtErr)?;
        let options = EventOptions {
            timing: t,
            blocking: b,
        };
        if ipc {
            return crate::ipc::event_create(options);
        }
        Ok(PyEvent::made_now(Event::with_options(options)))
    }

    /// A handle (bytes) another process opens with `Event.from_ipc` to wait on this event's
    /// records (CUDA's `cudaIpcGetEventHandle`); the event must be made with
    /// `interprocess=True`.
    fn ipc_handle<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
        crate::ipc::event_handle(py, self)
    }

    /// Open an event handle made by `Event.ipc_handle()` in another process (CUDA's
    /// `cudaIpcOpenEventHandle`): `query`, `synchronize` and `stream.wait_event` then follow
    /// the exporter's latest record.
    #[staticmethod]
    fn from_ipc(handle: &[u8]) -> PyResult<PyEvent> {
        crate::ipc::event_open(handle)
    }

    /// Pickled as its IPC handle (interprocess events only), as torch sends CUDA events
    /// through `multiprocessing` queues.
    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyTuple>> {
        crate::ipc::event_reduce(py, self)
    }

    /// Whether the event is shared with other processes (made interprocess, or opened).
    #[getter]
    fn interprocess(&self) -> bool {
        runtime_core::ipc_event::is_interprocess(self.raw())
    }

    /// A user event (OpenCL's `UserEvent`): pending until `set()` (or `set_status`) is
    /// called; streams can wait on it (`stream.wait_event`). It cannot be recorded.
    /// `shutdown` fails one still unset, releasing the streams waiting on it.
    #[staticmethod]
    fn user() -> RtResult<PyEvent> {
        rt::get()?;
        Ok(PyEvent::made_now(Event::user()))
    }

    /// Complete a user event: the streams and callers waiting on it continue.
    fn set(&self) -> RtResult<()> {
        Ok(self.raw().set()?)
    }

    /// Complete a user event with an OpenCL-style status: `"complete"` or 0 completes it;
    /// a negative int, any other string or an exception fails it (the waiting streams report
    /// a `KernelError` at their next synchronisation, `synchronize` on the event raises it).
    fn set_status(&self, status: &Bound<'_, PyAny>) -> PyResult<()> {
        let e = self.raw();
        let failure = if status.is_instance_of::<PyBool>() {
            return Err(PyTypeError::new_err(
                "status must be \"complete\", 0, a negative int, a message or an exception, got bool",
            ));
        } else if let Ok(code) = status.extract::<i64>() {
            match code {
                0 => None,
                c if c < 0 => Some(format!("the user event was set to error status {c}")),
                c => {
                    return Err(PyValueError::new_err(format!(
                    "status: {c} is not a final status; use 0 (complete) or a negative error code"
                )))
                }
            }
        } else if let Ok(text) = status.extract::<String>() {
            (text != "complete").then_some(text)
        } else if status.is_instance_of::<pyo3::exceptions::PyBaseException>() {
            Some(format!("{}: {}", type_name(status), status.str()?))
        } else {
            return Err(PyTypeError::new_err(format!(
                "status must be \"complete\", 0, a negative int, a message or an exception, got {}",
                type_name(status)
            )));
        };
        match failure {
            None => e.set(),
            Some(why) => e.set_failed(&why),
        }
        .map_err(RtErr)?;
        Ok(())
    }

    /// Whether this is a user event.
    #[getter]
    fn is_user(&self) -> bool {
        self.raw().is_user()
    }

    /// Why a user event failed (`set_status` with an error, or shutdown while unset).
    #[getter]
    fn failure(&self) -> Option<String> {
        self.raw().failure()
    }

    /// The device of the stream it was last recorded on (None: never recorded; torch's
    /// `Event.device`).
    #[getter]
    fn device(&self) -> Option<PyDevice> {
        self.raw().device().map(PyDevice::from_index)
    }

    /// Call `fn(error)` once the latest record has completed (error: None, or the exception
    /// `synchronize` would raise: the `KernelError` of a failed user event, the
    /// `InvalidHandleError` of an interprocess event whose exporter died), on the thread that
    /// completes it (at once when it already has). For the asyncio face (`await event`); `fn`
    /// must not block. Returns a handle whose `cancel()` takes the callback back (a cancelled
    /// `await` lets go of it at once). Once the interpreter is finalising, `fn` is not called.
    fn _on_complete(&self, func: Py<PyAny>) -> RtResult<PyCompletion> {
        let c = self.raw().on_complete(Box::new(move |outcome| {
            let Some(_inside) = crate::interp::prepare() else {
                return; // the interpreter is going away: nobody awaits any more
            };
            Python::attach(move |py| {
                let err = match outcome {
                    Ok(()) => py.None(),
                    Err(e) => crate::errors::to_pyerr(py, e).into_value(py).into_any(),
                };
                if let Err(err) = func.call1(py, (err,)) {
                    err.write_unraisable(py, Some(func.bind(py)));
                }
                drop(func);
            });
        }))?;
        Ok(PyCompletion {
            inner: parking_lot::Mutex::new(Some(c)),
        })
    }

    /// Completion callbacks (`await`s) parked on this event now.
    #[getter]
    fn _parked_callbacks(&self) -> usize {
        self.raw().parked_callbacks()
    }

    /// `await event`: completes once the latest record has (asyncio; no polling).
    fn __await__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        py.import("runtime._aio")?
            .getattr("event_future")?
            .call1((slf, py.None()))?
            .call_method0("__await__")
    }

    /// Record on `stream` (the current stream when None).
    #[pyo3(signature = (stream=None))]
    fn record(&self, py: Python<'_>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let s = stream_or_current(py, stream)?;
        s.record(self.raw()).map_err(RtErr)?;
        Ok(())
    }

    /// Whether the latest record has completed (True if never recorded).
    fn query(&self) -> RtResult<bool> {
        Ok(self.raw().query()?)
    }

    /// Wait for the latest record (GIL released; Ctrl-C works; `timeout` in seconds).
    #[pyo3(signature = (timeout=None))]
    fn synchronize(&self, py: Python<'_>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let timeout = timeout_obj(timeout)?;
        timeout_arg(timeout)?;
        let e = self.raw();
        if e.query().map_err(RtErr)? {
            // Reports the failure of a failed user event.
            e.wait(Some(std::time::Duration::ZERO)).map_err(RtErr)?;
            return Ok(());
        }
        wait::wait_result(
            py,
            || format!("{e:?}"),
            timeout,
            |slice| e.wait(Some(slice)),
        )
    }

    /// Make `stream` (current when None) wait for this event.
    #[pyo3(signature = (stream=None))]
    fn wait(&self, py: Python<'_>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let s = stream_or_current(py, stream)?;
        s.wait_event(self.raw()).map_err(RtErr)?;
        Ok(())
    }

    /// Milliseconds from this event to `end`. Both must be recorded with timing enabled and
    /// completed, otherwise raises (NotReadyError while pending).
    fn elapsed_time(&self, end: &Bound<'_, PyAny>) -> PyResult<f64> {
        let e = event_arg(end)?;
        Ok(self.raw().elapsed_time(&e).map_err(RtErr)?)
    }

    /// Completion time of the latest record, in ns of the runtime's monotonic clock.
    #[getter]
    fn timestamp_ns(&self) -> RtResult<u64> {
        Ok(self.raw().timestamp_ns()?)
    }

    #[getter]
    fn enable_timing(&self) -> bool {
        self.raw().timing()
    }

    #[getter]
    fn blocking(&self) -> bool {
        self.raw().blocking()
    }

    #[getter]
    fn id(&self) -> u64 {
        self.raw().id()
    }

    /// Invalidate the handle; records already queued still complete.
    fn destroy(&self) -> RtResult<()> {
        Ok(self.raw().destroy()?)
    }

    fn __repr__(&self) -> String {
        format!(
            "runtime.Event(id={}, enable_timing={})",
            self.raw().id(),
            if self.raw().timing() { "True" } else { "False" }
        )
    }
}

/// A completion callback registered with `Event._on_complete`.
#[pyclass(name = "_Completion", module = "runtime._runtime", frozen)]
pub struct PyCompletion {
    inner: parking_lot::Mutex<Option<runtime_core::event::Completion>>,
}

#[pymethods]
impl PyCompletion {
    /// Take the callback back unless it ran: it is not called, and what it holds is released
    /// now. Returns whether it was taken back.
    fn cancel(&self) -> bool {
        let c = self.inner.lock().take();
        c.is_some_and(runtime_core::event::Completion::cancel)
    }
}
