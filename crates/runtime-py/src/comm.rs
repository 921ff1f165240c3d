//! The `Communicator` class and `comm_init_all` (exposed as `runtime.comm`): argument
//! conversion over `runtime_core::comm`. Collectives only queue work, so no call here waits,
//! except for room in a full stream (back-pressure, GIL released).

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use runtime_core::comm::{self, Communicator, ReduceOp};
use runtime_core::kernel::Tensor;
use runtime_core::stream::Stream;

use crate::context;
use crate::convert::{buffer_arg, device_arg, device_at, type_name};
use crate::errors::RtErr;
use crate::handles::{PyDevice, PyStream};
use crate::wait;

/// One rank of a communicator over devices of this process (`runtime.comm.init_all`).
#[pyclass(name = "Communicator", module = "runtime.comm", frozen)]
pub struct PyCommunicator {
    inner: Communicator,
}

/// One communicator per device, rank `i` on `devices[i]` (NCCL's `ncclCommInitAll`).
#[pyfunction]
#[pyo3(signature = (devices, timeout=300.0))]
pub fn comm_init_all(devices: &Bound<'_, PyAny>, timeout: f64) -> PyResult<Vec<PyCommunicator>> {
    let mut devs = Vec::new();
    for (i, d) in devices.try_iter()?.enumerate() {
        devs.push(device_at(device_arg(&d?, &format!("devices[{i}]"))?)?);
    }
    if !(timeout.is_finite() && timeout > 0.0) {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "timeout must be a positive number of seconds, got {timeout}"
        )));
    }
    let timeout = std::time::Duration::try_from_secs_f64(timeout)
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("timeout: {e}")))?;
    let comms = comm::init_all(&devs, timeout).map_err(RtErr)?;
    Ok(comms
        .into_iter()
        .map(|inner| PyCommunicator { inner })
        .collect())
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

    /// Queue with `f`, then wait for room if the stream's backlog is full. Never waits for
    /// the collective itself (not even with `enableAsync` off: a rank's call must return so
    /// that the same thread can issue the other ranks' calls).
    fn submit(
        &self,
        py: Python<'_>,
        stream: Option<&Bound<'_, PyAny>>,
        f: impl FnOnce(&Stream) -> runtime_core::Result<()>,
    ) -> PyResult<()> {
        let s = self.stream(py, stream)?;
        f(&s).map_err(RtErr)?;
        if let Some(target) = runtime_core::bindings::backlog_target(&s) {
            wait::wait_result(
                py,
                || format!("{s:?}"),
                None,
                |slice| runtime_core::bindings::wait_for(&s, target, Some(slice)),
            )?;
        }
        Ok(())
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
