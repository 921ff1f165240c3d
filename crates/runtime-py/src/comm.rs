//! The `Communicator` class, `comm_init_all` and `comm_connect` (exposed as `runtime.comm`
//! and, over mpi4py, `runtime._mpi`): argument conversion over `runtime_core::comm`, the
//! [`PyTransport`] that lets a Python object (the MPI transport of `_mpi.py`) move a
//! communicator's bytes between processes, and groups. Collectives only queue work, so no
//! call here waits, except for room in a full stream (back-pressure, GIL released), and not
//! even for that inside a group (`comm_group_start`/`comm_group_end`): a group's calls never
//! block, and its end waits for room on the streams it used.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use runtime_core::comm::{
    self, Communicator, Exchange, Pending, ReduceOp, Region, Transport, TransportError,
};
use runtime_core::kernel::{DType, Tensor};
use runtime_core::stream::Stream;

use crate::context;
use crate::convert::{buffer_arg, device_arg, device_at, type_name};
use crate::errors::{self, RtErr};
use crate::handles::{PyDevice, PyDeviceBuffer, PyStream};
use crate::wait;

/// One rank of a communicator over devices of this process (`runtime.comm.init_all`).
#[pyclass(name = "Communicator", module = "runtime.comm", frozen)]
pub struct PyCommunicator {
    inner: Communicator,
}

fn devices_arg(devices: &Bound<'_, PyAny>) -> PyResult<Vec<runtime_core::device::Device>> {
    let mut devs = Vec::new();
    for (i, d) in devices.try_iter()?.enumerate() {
        devs.push(device_at(device_arg(&d?, &format!("devices[{i}]"))?)?);
    }
    Ok(devs)
}

fn timeout_secs(timeout: f64) -> PyResult<Duration> {
    if !(timeout.is_finite() && timeout > 0.0) {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "timeout must be a positive number of seconds, got {timeout}"
        )));
    }
    Duration::try_from_secs_f64(timeout)
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("timeout: {e}")))
}

/// One communicator per device, rank `i` on `devices[i]` (NCCL's `ncclCommInitAll`).
#[pyfunction]
#[pyo3(signature = (devices, timeout=300.0))]
pub fn comm_init_all(devices: &Bound<'_, PyAny>, timeout: f64) -> PyResult<Vec<PyCommunicator>> {
    let devs = devices_arg(devices)?;
    let timeout = timeout_secs(timeout)?;
    let comms = comm::init_all(&devs, timeout).map_err(RtErr)?;
    Ok(comms
        .into_iter()
        .map(|inner| PyCommunicator { inner })
        .collect())
}

/// Join a communicator spanning `processes` processes as process `process`, one rank per
/// device of `devices`, with `transport` moving the bytes (`runtime_core::comm::connect`).
/// Waits, GIL released and Ctrl-C live, until every process has joined or `timeout` passed.
#[pyfunction]
#[pyo3(signature = (devices, process, processes, transport, timeout=300.0))]
pub fn comm_connect(
    py: Python<'_>,
    devices: &Bound<'_, PyAny>,
    process: usize,
    processes: usize,
    transport: &Bound<'_, PyAny>,
    timeout: f64,
) -> PyResult<Vec<PyCommunicator>> {
    let devs = devices_arg(devices)?;
    let timeout = timeout_secs(timeout)?;
    for m in ["reduces", "start"] {
        if !transport.hasattr(m)? {
            return Err(PyTypeError::new_err(format!(
                "transport must have reduces() and start() methods, got {}",
                type_name(transport)
            )));
        }
    }
    let t: Arc<dyn Transport> = Arc::new(PyTransport {
        obj: Some(transport.clone().unbind()),
    });
    let mut connecting = py
        .detach(|| comm::connect(&devs, process, processes, t, timeout))
        .map_err(RtErr)?;
    let mut out = None;
    wait::wait_result(
        py,
        || "connect".to_string(),
        None,
        |slice| {
            out = connecting.poll(slice)?;
            Ok(out.is_some())
        },
    )?;
    Ok(out
        .expect("poll answered with the communicators")
        .into_iter()
        .map(|inner| PyCommunicator { inner })
        .collect())
}

// --- groups -------------------------------------------------------------------------------

thread_local! {
    /// This thread's group depth and the streams whose back-pressure wait its group deferred.
    static GROUP: RefCell<(usize, Vec<Stream>)> = const { RefCell::new((0, Vec::new())) };
}

/// Start a group (`ncclGroupStart`): until the matching end, this thread's collectives and
/// point-to-point calls never wait for room in a full stream. Groups nest.
#[pyfunction]
pub fn comm_group_start() {
    GROUP.with(|g| g.borrow_mut().0 += 1);
}

/// End a group (`ncclGroupEnd`): at the outermost end, with `wait`, wait (GIL released,
/// Ctrl-C live) for room on each stream the group filled past its backlog limit; every rank's
/// calls are queued by then, so the collectives can run. (`wait=False`: a group left by an
/// exception, whose other ranks' calls may never come.)
#[pyfunction]
#[pyo3(signature = (wait=true))]
pub fn comm_group_end(py: Python<'_>, wait: bool) -> PyResult<()> {
    let streams = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.0 == 0 {
            return Err(PyRuntimeError::new_err(
                "comm_group_end() without a matching comm_group_start()",
            ));
        }
        g.0 -= 1;
        Ok(if g.0 == 0 {
            std::mem::take(&mut g.1)
        } else {
            Vec::new()
        })
    })?;
    if wait {
        for s in streams {
            backpressure(py, &s)?;
        }
    }
    Ok(())
}

/// In a group: remember `s` for the group's end and say so.
fn deferred(s: &Stream) -> bool {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.0 == 0 {
            return false;
        }
        if !g.1.contains(s) {
            g.1.push(s.clone());
        }
        true
    })
}

/// Wait for room if `s`'s backlog is full.
fn backpressure(py: Python<'_>, s: &Stream) -> PyResult<()> {
    if let Some(target) = s.backlog_target() {
        wait::wait_result(
            py,
            || format!("{s:?}"),
            None,
            |slice| s.wait_for(target, Some(slice)),
        )?;
    }
    Ok(())
}

// --- the transport ------------------------------------------------------------------------

/// A Python object moving a communicator's bytes between processes: `reduces(dtype, op)`
/// answers [`Transport::reduces`]; `start(kind, *args)` starts an exchange and returns None
/// (already complete) or an object whose `test()` says whether it has completed. Regions are
/// passed as `DeviceBuffer`s (1-D, of the region's dtype) for the Python code to view with
/// numpy; counts as lists of ints. Called from runtime threads (attached to the interpreter
/// for the call only); an exception fails the collective, with it as the cause.
struct PyTransport {
    obj: Option<Py<PyAny>>,
}

fn region(py: Python<'_>, r: &Region) -> PyResult<Py<PyDeviceBuffer>> {
    let t = r.tensor();
    Py::new(
        py,
        PyDeviceBuffer::typed(t.buffer().clone(), t.offset(), t.dtype(), vec![t.len()]),
    )
}

fn transport_error(py: Python<'_>, e: PyErr) -> TransportError {
    let ty = e
        .get_type(py)
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default();
    TransportError {
        message: format!("{ty}: {}", e.value(py)),
        payload: Some(errors::cause_payload(e)),
    }
}

fn finalizing() -> TransportError {
    TransportError::from(
        "the Python interpreter is shutting down: the transport cannot run any more".to_string(),
    )
}

impl PyTransport {
    fn obj(&self) -> &Py<PyAny> {
        self.obj.as_ref().expect("taken only on drop")
    }

    fn call(py: Python<'_>, obj: &Bound<'_, PyAny>, x: Exchange) -> PyResult<Py<PyAny>> {
        let args: Bound<'_, PyTuple> = match x {
            Exchange::Barrier => ("barrier",).into_pyobject(py)?,
            Exchange::Broadcast { buf, root } => {
                ("broadcast", region(py, &buf)?, root).into_pyobject(py)?
            }
            Exchange::AllReduce { buf, op } => {
                ("all_reduce", region(py, &buf)?, op.name()).into_pyobject(py)?
            }
            Exchange::Reduce { buf, op, root } => {
                ("reduce", region(py, &buf)?, op.name(), root).into_pyobject(py)?
            }
            Exchange::AllGather { buf, counts } => {
                ("all_gather", region(py, &buf)?, counts).into_pyobject(py)?
            }
            Exchange::ReduceScatter {
                send,
                recv,
                counts,
                op,
            } => (
                "reduce_scatter",
                region(py, &send)?,
                region(py, &recv)?,
                counts,
                op.name(),
            )
                .into_pyobject(py)?,
            Exchange::AllToAll {
                send,
                send_counts,
                recv,
                recv_counts,
            } => (
                "all_to_all",
                region(py, &send)?,
                send_counts,
                region(py, &recv)?,
                recv_counts,
            )
                .into_pyobject(py)?,
            Exchange::Send { buf, to, tag } => {
                ("send", region(py, &buf)?, to, tag).into_pyobject(py)?
            }
            Exchange::Recv { buf, from, tag } => {
                ("recv", region(py, &buf)?, from, tag).into_pyobject(py)?
            }
        };
        Ok(obj.getattr("start")?.call1(args)?.unbind())
    }
}

impl Transport for PyTransport {
    fn reduces(&self, dtype: DType, op: ReduceOp) -> bool {
        if !crate::interp::prepare() {
            return false;
        }
        Python::attach(|py| {
            self.obj()
                .bind(py)
                .call_method1("reduces", (dtype.name(), op.name()))
                .and_then(|r| r.is_truthy())
                .unwrap_or(false)
        })
    }

    fn start(&self, exchange: Exchange) -> Result<Box<dyn Pending>, TransportError> {
        if !crate::interp::prepare() {
            return Err(finalizing());
        }
        Python::attach(|py| {
            let req = Self::call(py, self.obj().bind(py), exchange)
                .map_err(|e| transport_error(py, e))?;
            Ok(Box::new(PyPending {
                req: (!req.is_none(py)).then_some(req),
            }) as Box<dyn Pending>)
        })
    }
}

impl Drop for PyTransport {
    /// Release the Python object attached (as `PyOp` does its arguments), so that its
    /// finaliser (freeing MPI communicators) runs now rather than at some later attach.
    fn drop(&mut self) {
        let Some(obj) = self.obj.take() else { return };
        if !crate::interp::prepare() {
            std::mem::forget(obj);
            return;
        }
        Python::attach(|_| drop(obj));
    }
}

/// An exchange in flight in Python (None: complete at start).
struct PyPending {
    req: Option<Py<PyAny>>,
}

impl Pending for PyPending {
    fn test(&mut self) -> Result<bool, TransportError> {
        let Some(req) = self.req.as_ref() else {
            return Ok(true);
        };
        if !crate::interp::prepare() {
            return Err(finalizing());
        }
        let done = Python::attach(|py| {
            req.bind(py)
                .call_method0("test")
                .and_then(|r| r.is_truthy())
                .map_err(|e| transport_error(py, e))
        })?;
        if done {
            let req = self.req.take();
            Python::attach(|_| drop(req));
        }
        Ok(done)
    }
}

impl Drop for PyPending {
    fn drop(&mut self) {
        let Some(req) = self.req.take() else { return };
        if !crate::interp::prepare() {
            std::mem::forget(req);
            return;
        }
        Python::attach(|_| drop(req));
    }
}

fn tensor(py: Python<'_>, obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<Tensor> {
    let b = buffer_arg(obj, arg)?.get();
    Ok(Tensor::new(b.buffer(py)?, b.offset, b.dtype, b.shape_usize()).map_err(RtErr)?)
}

fn index_arg(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<usize> {
    let bad_type = || PyTypeError::new_err(format!("{arg} must be an int, got {}", type_name(obj)));
    if obj.is_instance_of::<pyo3::types::PyBool>() {
        return Err(bad_type());
    }
    // Any integer (numpy's included, through `__index__`), never a float.
    let int = if obj.is_instance_of::<pyo3::types::PyInt>() {
        obj.clone()
    } else {
        obj.call_method0("__index__").map_err(|_| bad_type())?
    };
    let rank = int
        .extract::<i64>()
        .ok()
        .and_then(|v| usize::try_from(v).ok());
    rank.ok_or_else(|| {
        pyo3::exceptions::PyValueError::new_err(format!(
            "{arg}: {} is not a rank (ranks are 0 and up)",
            obj.repr().map(|r| r.to_string()).unwrap_or_default()
        ))
    })
}

impl PyCommunicator {
    /// The stream to queue on: `stream`, or the current stream of this rank's device.
    fn stream(&self, py: Python<'_>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<Stream> {
        match stream {
            Some(o) if !o.is_none() => Ok(o
                .cast::<PyStream>()
                .map_err(|_| {
                    PyTypeError::new_err(format!(
                        "stream must be a runtime.Stream or None, got {}",
                        type_name(o)
                    ))
                })?
                .get()
                .inner()
                .clone()),
            _ => context::stream(py, self.inner.device()),
        }
    }

    /// Queue with `f`, then wait for room if the stream's backlog is full, except in a
    /// group (the group's end waits). Never waits for the collective itself (not even with
    /// `enableAsync` off: a rank's call must return so that the same thread can issue the
    /// other ranks' calls).
    fn submit(
        &self,
        py: Python<'_>,
        stream: Option<&Bound<'_, PyAny>>,
        f: impl FnOnce(&Stream) -> runtime_core::Result<()>,
    ) -> PyResult<()> {
        let s = self.stream(py, stream)?;
        f(&s).map_err(RtErr)?;
        if deferred(&s) {
            return Ok(());
        }
        backpressure(py, &s)
    }
}

#[pymethods]
impl PyCommunicator {
    /// This rank.
    #[getter]
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    /// Number of ranks.
    #[getter]
    fn size(&self) -> usize {
        self.inner.size()
    }

    /// This rank's device.
    #[getter]
    fn device(&self) -> PyDevice {
        PyDevice::from_index(self.inner.device().index())
    }

    /// This process's index among the processes the communicator spans (0 in-process).
    #[getter]
    fn process(&self) -> usize {
        self.inner.process().0
    }

    /// Number of processes the communicator spans (1 in-process).
    #[getter]
    fn processes(&self) -> usize {
        self.inner.process().1
    }

    /// Seconds a collective waits for the other ranks.
    #[getter]
    fn timeout(&self) -> f64 {
        self.inner.timeout().as_secs_f64()
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.inner)
    }

    #[pyo3(signature = (send, recv, op="sum", stream=None))]
    fn all_reduce(
        &self,
        py: Python<'_>,
        send: &Bound<'_, PyAny>,
        recv: &Bound<'_, PyAny>,
        op: &str,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let (s, r, op) = (
            tensor(py, send, "send")?,
            tensor(py, recv, "recv")?,
            ReduceOp::parse(op).map_err(RtErr)?,
        );
        self.submit(py, stream, |st| self.inner.all_reduce(&s, &r, op, st))
    }

    #[pyo3(signature = (buf, root, stream=None))]
    fn broadcast(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        root: &Bound<'_, PyAny>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let (b, root) = (tensor(py, buf, "buf")?, index_arg(root, "root")?);
        self.submit(py, stream, |st| self.inner.broadcast(&b, root, st))
    }

    #[pyo3(signature = (send, recv, root, op="sum", stream=None))]
    fn reduce(
        &self,
        py: Python<'_>,
        send: &Bound<'_, PyAny>,
        recv: &Bound<'_, PyAny>,
        root: &Bound<'_, PyAny>,
        op: &str,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let s = tensor(py, send, "send")?;
        let r = if recv.is_none() {
            None
        } else {
            Some(tensor(py, recv, "recv")?)
        };
        let (root, op) = (
            index_arg(root, "root")?,
            ReduceOp::parse(op).map_err(RtErr)?,
        );
        self.submit(py, stream, |st| {
            self.inner.reduce(&s, r.as_ref(), root, op, st)
        })
    }

    #[pyo3(signature = (send, recv, stream=None))]
    fn all_gather(
        &self,
        py: Python<'_>,
        send: &Bound<'_, PyAny>,
        recv: &Bound<'_, PyAny>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let (s, r) = (tensor(py, send, "send")?, tensor(py, recv, "recv")?);
        self.submit(py, stream, |st| self.inner.all_gather(&s, &r, st))
    }

    #[pyo3(signature = (send, recv, op="sum", stream=None))]
    fn reduce_scatter(
        &self,
        py: Python<'_>,
        send: &Bound<'_, PyAny>,
        recv: &Bound<'_, PyAny>,
        op: &str,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let (s, r, op) = (
            tensor(py, send, "send")?,
            tensor(py, recv, "recv")?,
            ReduceOp::parse(op).map_err(RtErr)?,
        );
        self.submit(py, stream, |st| self.inner.reduce_scatter(&s, &r, op, st))
    }

    #[pyo3(signature = (send, recv, stream=None))]
    fn all_to_all(
        &self,
        py: Python<'_>,
        send: &Bound<'_, PyAny>,
        recv: &Bound<'_, PyAny>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let (s, r) = (tensor(py, send, "send")?, tensor(py, recv, "recv")?);
        self.submit(py, stream, |st| self.inner.all_to_all(&s, &r, st))
    }

    #[pyo3(signature = (buf, peer, stream=None))]
    fn send(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        peer: &Bound<'_, PyAny>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let (b, peer) = (tensor(py, buf, "buf")?, index_arg(peer, "peer")?);
        self.submit(py, stream, |st| self.inner.send(&b, peer, st))
    }

    #[pyo3(signature = (buf, peer, stream=None))]
    fn recv(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        peer: &Bound<'_, PyAny>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let (b, peer) = (tensor(py, buf, "buf")?, index_arg(peer, "peer")?);
        self.submit(py, stream, |st| self.inner.recv(&b, peer, st))
    }

    #[pyo3(signature = (stream=None))]
    fn barrier(&self, py: Python<'_>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        self.submit(py, stream, |st| self.inner.barrier(st))
    }

    /// Whether the communicator was aborted (on any rank, or by shutdown).
    #[getter]
    fn aborted(&self) -> bool {
        self.inner.is_aborted()
    }

    fn abort(&self) {
        self.inner.abort();
    }

    fn destroy(&self) {
        self.inner.destroy();
    }
}
