//! The `Communicator` class, `comm_init_all`, `comm_connect` and `comm_get_unique_id`
//! (exposed as `runtime.comm` and, over mpi4py, `runtime._mpi`): argument conversion over
//! `runtime_core::comm`, the [`PyTransport`] that lets a Python object (the MPI transport of
//! `_mpi.py`) move a communicator's bytes between processes, and groups. Collectives only
//! queue work, so no call here waits, except for room in a full stream (back-pressure, GIL
//! released), and not even for that inside a group (`comm_group_start`/`comm_group_end`): a
//! group's calls never block, and its end waits for room on the streams it used. The calls
//! that make communicators (`split`, `Communicator(nranks, comm_id, rank)`) wait for the other
//! ranks (GIL released, Ctrl-C live), except inside a group, where they return a communicator
//! that is made by the group's end (or its first use): NCCL's group semantics, so that one
//! thread may make every rank's.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use runtime_core::comm::{
    self, Communicator, Exchange, Forming, Forthcoming, Pending, ReduceOp, Region, Transport,
    TransportError, UniqueId,
};
use runtime_core::kernel::{DType, Tensor};
use runtime_core::stream::Stream;

use crate::context;
use crate::convert::{buffer_arg, device_arg, device_at, resolve, type_name};
use crate::errors::{self, RtErr};
use crate::handles::{PyDevice, PyDeviceBuffer, PyStream};
use crate::wait;

/// One rank of a communicator (`runtime.comm.init_all`, `init_mpi`, `split`, or
/// `Communicator(nranks, comm_id, rank)`). Made inside a group, it is *forming* until the
/// group's end (or its first use) waits for the other ranks
/// (`runtime_core::comm::Forthcoming`).
#[pyclass(name = "Communicator", module = "runtime.comm", frozen)]
pub struct PyCommunicator {
    inner: Forthcoming,
}

impl PyCommunicator {
    fn made(inner: Communicator) -> PyCommunicator {
        PyCommunicator {
            inner: Forthcoming::made(inner),
        }
    }

    fn forming(f: Forming) -> PyCommunicator {
        PyCommunicator {
            inner: Forthcoming::forming(f),
        }
    }

    /// The core communicator, waiting (GIL released, Ctrl-C live) for a forming one.
    fn comm(&self, py: Python<'_>) -> PyResult<&Communicator> {
        self.settle(py)?.ok_or_else(|| RtErr(joined_none()).into())
    }

    /// Wait as [`PyCommunicator::comm`] does until the communicator is made: `None` for a
    /// rank that joined none (a split with no color), which is no error here.
    fn settle(&self, py: Python<'_>) -> PyResult<Option<&Communicator>> {
        if let Some(c) = self.inner.get() {
            return Ok(Some(c));
        }
        let mut out = None;
        wait::wait_result(
            py,
            || format!("{:?}", self.inner),
            None,
            |slice| {
                out = self.inner.poll(slice)?;
                Ok(out.is_some())
            },
        )?;
        Ok(out.flatten())
    }
}

fn joined_none() -> runtime_core::Error {
    runtime_core::error::StreamError::Invalid("this rank joined no communicator".into()).into()
}

/// A forming communicator: waited for now, or, inside a group, at the group's end. A split
/// with no color is waited for too (the split is a collective, as `ncclCommSplit` with
/// `NCCL_SPLIT_NOCOLOR` is): returning before the other ranks' parts had come let a process
/// go on (and exit) while its exchange with the others was still in flight.
fn finish_forming(py: Python<'_>, f: Forming) -> PyResult<Py<PyCommunicator>> {
    let c = Py::new(py, PyCommunicator::forming(f))?;
    let in_group = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.0 == 0 {
            return false;
        }
        g.2.push(c.clone_ref(py));
        true
    });
    if !in_group {
        c.get().settle(py)?;
    }
    Ok(c)
}

fn devices_arg(devices: &Bound<'_, PyAny>) -> PyResult<Vec<runtime_core::device::Device>> {
    if devices.is_instance_of::<pyo3::types::PyString>() {
        // A str is iterable, but its characters are no devices.
        return Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "devices must be a list of devices, e.g. [0, 1] or ['npu:0', 'npu:1'], got str {:?}",
            devices.to_string()
        )));
    }
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
    Ok(comms.into_iter().map(PyCommunicator::made).collect())
}

/// A new id for `Communicator(nranks, comm_id, rank)` (NCCL's `ncclGetUniqueId`): 128 bytes.
#[pyfunction]
pub fn comm_get_unique_id(py: Python<'_>) -> Bound<'_, PyBytes> {
    PyBytes::new(py, &comm::unique_id().0)
}

/// A unique id from bytes, or from a sequence of 128 ints (CuPy's `get_unique_id()` form).
fn unique_id_arg(obj: &Bound<'_, PyAny>) -> PyResult<UniqueId> {
    let bytes: Vec<u8> = if let Ok(b) = obj.extract::<Vec<u8>>() {
        b
    } else if let Ok(ints) = obj.extract::<Vec<i64>>() {
        // NCCL's id is `char[128]`: CuPy gives its bytes as signed (-128..=127); unsigned
        // (0..=255) are taken too. Anything else is not a byte of an id.
        ints.iter()
            .map(|&i| match u8::try_from(i) {
                Ok(b) => Ok(b),
                Err(_) => i8::try_from(i).map(|b| b as u8).map_err(|_| {
                    PyValueError::new_err(format!(
                        "comm_id: {i} is not a byte (ids hold -128..=255)"
                    ))
                }),
            })
            .collect::<PyResult<_>>()?
    } else {
        return Err(PyTypeError::new_err(format!(
            "comm_id must be the bytes get_unique_id() returned, got {}",
            type_name(obj)
        )));
    };
    Ok(UniqueId::from_bytes(&bytes).map_err(RtErr)?)
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
        .map(PyCommunicator::made)
        .collect())
}

// --- groups -------------------------------------------------------------------------------

/// A thread's group: its depth, the streams whose back-pressure wait it deferred, and the
/// communicators it left forming.
type Group = (usize, Vec<Stream>, Vec<Py<PyCommunicator>>);

thread_local! {
    static GROUP: RefCell<Group> = const { RefCell::new((0, Vec::new(), Vec::new())) };
}

/// Start a group (`ncclGroupStart`): until the matching end, this thread's collectives and
/// point-to-point calls never wait for room in a full stream. Groups nest.
#[pyfunction]
pub fn comm_group_start() {
    GROUP.with(|g| g.borrow_mut().0 += 1);
}

/// End a group (`ncclGroupEnd`): at the outermost end, with `wait`, wait (GIL released,
/// Ctrl-C live) for room on each stream the group filled past its backlog limit, and for the
/// communicators the group left forming; every rank's calls are made by then. (`wait=False`:
/// a group left by an exception, whose other ranks' calls may never come: its communicators
/// are waited for at their first use.)
#[pyfunction]
#[pyo3(signature = (wait=true))]
pub fn comm_group_end(py: Python<'_>, wait: bool) -> PyResult<()> {
    let (streams, forming) = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.0 == 0 {
            return Err(PyRuntimeError::new_err(
                "comm_group_end() without a matching comm_group_start()",
            ));
        }
        g.0 -= 1;
        Ok(if g.0 == 0 {
            (std::mem::take(&mut g.1), std::mem::take(&mut g.2))
        } else {
            (Vec::new(), Vec::new())
        })
    })?;
    if wait {
        for c in forming {
            c.get().settle(py)?;
        }
        for s in streams {
            backpressure(py, &s)?;
        }
    }
    Ok(())
}

/// Drop what this thread's open group holds (streams to wait for, communicators forming),
/// keeping its depth: at shutdown or in a forked child they belong to a runtime that is
/// gone, and the group's end, still to come, has nothing of it left to wait for.
pub fn forget_group() {
    let held = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        (std::mem::take(&mut g.1), std::mem::take(&mut g.2))
    });
    drop(held); // after the borrow: a drop that came back to this group would find it borrowed
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
    if let Some(target) = runtime_core::bindings::backlog_target(s) {
        wait::wait_result(
            py,
            || format!("{s:?}"),
            None,
            |slice| runtime_core::bindings::wait_for(s, target, Some(slice)),
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
    // SAFETY: the Python transport is handed the region's memory as a `DeviceBuffer` for
    // the step, to view with numpy, whose views are unsynchronised by contract (the package
    // documents numpy views of device memory as numpy's semantics): what Python code does
    // with that memory, during the step or after, is ordered by the program, as for any
    // numpy view. The buffer's safe runtime operations wait for the collective's op, or for
    // the core's own use of staging memory, to let go of it.
    let t = unsafe { r.tensor() };
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
            Exchange::Gather { buf, counts, root } => {
                ("gather", region(py, &buf)?, counts, root).into_pyobject(py)?
            }
            Exchange::Scatter { buf, counts, root } => {
                ("scatter", region(py, &buf)?, counts, root).into_pyobject(py)?
            }
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
        let Some(_inside) = crate::interp::prepare() else {
            return false;
        };
        Python::attach(|py| {
            self.obj()
                .bind(py)
                .call_method1("reduces", (dtype.name(), op.name()))
                .and_then(|r| r.is_truthy())
                .unwrap_or(false)
        })
    }

    fn start(&self, exchange: Exchange) -> Result<Box<dyn Pending>, TransportError> {
        let Some(_inside) = crate::interp::prepare() else {
            return Err(finalizing());
        };
        Python::attach(|py| {
            let req = Self::call(py, self.obj().bind(py), exchange)
                .map_err(|e| transport_error(py, e))?;
            Ok(Box::new(PyPending {
                req: (!req.is_none(py)).then_some(req),
            }) as Box<dyn Pending>)
        })
    }

    /// `split(processes, color)` of the Python object: a transport object over those
    /// processes.
    fn split(&self, processes: &[usize], color: u64) -> Result<Arc<dyn Transport>, TransportError> {
        let Some(_inside) = crate::interp::prepare() else {
            return Err(finalizing());
        };
        Python::attach(|py| {
            let obj = self
                .obj()
                .bind(py)
                .call_method1("split", (processes.to_vec(), color))
                .map_err(|e| transport_error(py, e))?;
            Ok(Arc::new(PyTransport {
                obj: Some(obj.unbind()),
            }) as Arc<dyn Transport>)
        })
    }

    fn host_object(&self) -> Option<&(dyn std::any::Any + Send + Sync)> {
        self.obj
            .as_ref()
            .map(|o| o as &(dyn std::any::Any + Send + Sync))
    }
}

impl Drop for PyTransport {
    /// Release the Python object attached (as `PyOp` does its arguments), so that its
    /// finaliser (freeing MPI communicators) runs now rather than at some later attach.
    fn drop(&mut self) {
        let Some(obj) = self.obj.take() else { return };
        let Some(_inside) = crate::interp::prepare() else {
            std::mem::forget(obj);
            return;
        };
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
        let Some(_inside) = crate::interp::prepare() else {
            return Err(finalizing());
        };
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
        let Some(_inside) = crate::interp::prepare() else {
            std::mem::forget(req);
            return;
        };
        Python::attach(|_| drop(req));
    }
}

fn tensor(py: Python<'_>, obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<Tensor> {
    let b = buffer_arg(obj, arg)?.get();
    b.require_c_contiguous(arg, "collectives")?;
    Ok(Tensor::new(b.buffer(py)?, b.offset, b.dtype, b.layout().shape()).map_err(RtErr)?)
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

/// A reduction operator: a name (`"sum"`, ..., `"band"`, `"bor"`, `"bxor"`) or
/// `("premul_sum", factor)`.
fn op_arg(obj: &Bound<'_, PyAny>) -> PyResult<ReduceOp> {
    if let Ok(name) = obj.extract::<String>() {
        return Ok(ReduceOp::parse(&name).map_err(RtErr)?);
    }
    if let Ok((name, factor)) = obj.extract::<(String, Bound<'_, PyAny>)>() {
        if name == "premul_sum" {
            if factor.is_instance_of::<pyo3::types::PyBool>() {
                return Err(PyTypeError::new_err("factor must be a number, got bool"));
            }
            let f: f64 = factor.extract().map_err(|_| {
                PyTypeError::new_err(format!(
                    "factor must be a real number, got {}",
                    type_name(&factor)
                ))
            })?;
            return Ok(ReduceOp::premul_sum(f).map_err(RtErr)?);
        }
        return Err(PyValueError::new_err(format!(
            "op: ({name:?}, ...) is not an operator; only premul_sum takes a factor"
        )));
    }
    Err(PyTypeError::new_err(format!(
        "op must be an operator name or (\"premul_sum\", factor), got {}",
        type_name(obj)
    )))
}

/// A list of counts (non-negative ints).
fn counts_arg(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<Vec<usize>> {
    let mut out = Vec::new();
    for (i, x) in obj
        .try_iter()
        .map_err(|_| {
            PyTypeError::new_err(format!(
                "{arg} must be a sequence of counts, got {}",
                type_name(obj)
            ))
        })?
        .enumerate()
    {
        out.push(index_arg(&x?, &format!("{arg}[{i}]"))?);
    }
    Ok(out)
}

/// A list of buffers.
fn tensors_arg(py: Python<'_>, obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<Vec<Tensor>> {
    let mut out = Vec::new();
    for (i, x) in obj
        .try_iter()
        .map_err(|_| {
            PyTypeError::new_err(format!(
                "{arg} must be a sequence of DeviceBuffers, got {}",
                type_name(obj)
            ))
        })?
        .enumerate()
    {
        out.push(tensor(py, &x?, &format!("{arg}[{i}]"))?);
    }
    Ok(out)
}

/// An optional buffer argument (None on ranks that do not need it).
fn opt_tensor(
    py: Python<'_>,
    obj: Option<&Bound<'_, PyAny>>,
    arg: &str,
) -> PyResult<Option<Tensor>> {
    match obj {
        Some(o) if !o.is_none() => Ok(Some(tensor(py, o, arg)?)),
        _ => Ok(None),
    }
}

/// torch's `all_to_all_single` split sizes (rows of dim 0) as element counts: `None` splits
/// `t` evenly over `n` ranks.
fn splits(t: &Tensor, sizes: Option<Vec<usize>>, n: usize, arg: &str) -> PyResult<Vec<usize>> {
    let rows = t.shape().first().copied().unwrap_or(1);
    let row = if t.shape().is_empty() {
        1
    } else {
        t.shape()[1..].iter().product()
    };
    match sizes {
        Some(s) => s
            .iter()
            .enumerate()
            .map(|(i, &r)| {
                r.checked_mul(row).ok_or_else(|| {
                    PyValueError::new_err(format!(
                        "{arg}_split_sizes[{i}]: {r} rows of {row} elements overflow an element count"
                    ))
                })
            })
            .collect(),
        None => {
            if rows % n != 0 {
                return Err(PyValueError::new_err(format!(
                    "{arg}: {rows} rows do not split evenly over {n} ranks; pass split sizes"
                )));
            }
            Ok(vec![rows / n * row; n])
        }
    }
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
            _ => context::stream(py, self.comm(py)?.device()),
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
        f: impl FnOnce(&Communicator, &Stream) -> runtime_core::Result<()>,
    ) -> PyResult<()> {
        let c = self.comm(py)?;
        let s = self.stream(py, stream)?;
        f(c, &s).map_err(RtErr)?;
        if deferred(&s) {
            return Ok(());
        }
        backpressure(py, &s)
    }
}

#[pymethods]
impl PyCommunicator {
    /// Join the communicator of `nranks` ranks named by `comm_id` (from `get_unique_id()`) as
    /// rank `rank`, on `device` (default: the current device); NCCL's `ncclCommInitRank`.
    /// Waits for every rank, except inside a group (made at the group's end).
    #[new]
    #[pyo3(signature = (nranks, comm_id, rank, device=None, timeout=300.0))]
    fn new(
        py: Python<'_>,
        nranks: &Bound<'_, PyAny>,
        comm_id: &Bound<'_, PyAny>,
        rank: &Bound<'_, PyAny>,
        device: Option<&Bound<'_, PyAny>>,
        timeout: f64,
    ) -> PyResult<Py<PyCommunicator>> {
        let nranks = index_arg(nranks, "nranks")?;
        let rank = index_arg(rank, "rank")?;
        let id = unique_id_arg(comm_id)?;
        let d = resolve(py, device, "device")?;
        let timeout = timeout_secs(timeout)?;
        let f = comm::init_rank(nranks, &id, rank, &d, timeout).map_err(RtErr)?;
        finish_forming(py, f)
    }

    /// This rank.
    #[getter]
    fn rank(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.comm(py)?.rank())
    }

    /// Number of ranks.
    #[getter]
    fn size(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.comm(py)?.size())
    }

    /// This rank's device.
    #[getter]
    fn device(&self, py: Python<'_>) -> PyResult<PyDevice> {
        Ok(PyDevice::from_index(self.comm(py)?.device().index()))
    }

    /// This process's index among the processes the communicator spans (0 in-process).
    #[getter]
    fn process(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.comm(py)?.process().0)
    }

    /// Number of processes the communicator spans (1 in-process).
    #[getter]
    fn processes(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.comm(py)?.process().1)
    }

    /// Seconds a collective waits for the other ranks.
    #[getter]
    fn timeout(&self, py: Python<'_>) -> PyResult<f64> {
        Ok(self.comm(py)?.timeout().as_secs_f64())
    }

    /// The Python transport object of a communicator spanning processes (None in-process).
    #[getter]
    fn transport(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        Ok(self
            .comm(py)?
            .transport()
            .and_then(|t| t.host_object())
            .and_then(|a| a.downcast_ref::<Py<PyAny>>())
            .map(|o| o.clone_ref(py)))
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.inner)
    }

    #[pyo3(signature = (send, recv, op=None, stream=None))]
    fn all_reduce(
        &self,
        py: Python<'_>,
        send: &Bound<'_, PyAny>,
        recv: &Bound<'_, PyAny>,
        op: Option<&Bound<'_, PyAny>>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let (s, r) = (tensor(py, send, "send")?, tensor(py, recv, "recv")?);
        let op = op.map_or(Ok(ReduceOp::Sum), op_arg)?;
        self.submit(py, stream, |c, st| c.all_reduce(&s, &r, op, st))
    }

    /// `all_reduce` of a list of buffers in one collective; `recv=None` reduces in place.
    #[pyo3(signature = (send, recv=None, op=None, stream=None))]
    fn all_reduce_coalesced(
        &self,
        py: Python<'_>,
        send: &Bound<'_, PyAny>,
        recv: Option<&Bound<'_, PyAny>>,
        op: Option<&Bound<'_, PyAny>>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let sends = tensors_arg(py, send, "send")?;
        let recvs = match recv {
            Some(r) if !r.is_none() => tensors_arg(py, r, "recv")?,
            _ => sends.clone(),
        };
        let op = op.map_or(Ok(ReduceOp::Sum), op_arg)?;
        self.submit(py, stream, |c, st| {
            c.all_reduce_coalesced(&sends, &recvs, op, st)
        })
    }

    /// In place: root's `buf` to every rank's `buf`. With `recv`: root's `buf` (ignored
    /// elsewhere; None allowed there) to every rank's `recv`, the root's own included.
    #[pyo3(signature = (buf, root, stream=None, recv=None))]
    fn broadcast(
        &self,
        py: Python<'_>,
        buf: Option<&Bound<'_, PyAny>>,
        root: &Bound<'_, PyAny>,
        stream: Option<&Bound<'_, PyAny>>,
        recv: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let root = index_arg(root, "root")?;
        let b = opt_tensor(py, buf, "buf")?;
        match opt_tensor(py, recv, "recv")? {
            Some(r) => self.submit(py, stream, |c, st| {
                c.broadcast_from(b.as_ref(), &r, root, st)
            }),
            None => {
                let b = b.ok_or_else(|| {
                    PyTypeError::new_err("buf must be a DeviceBuffer (None only with recv=)")
                })?;
                self.submit(py, stream, |c, st| c.broadcast(&b, root, st))
            }
        }
    }

    #[pyo3(signature = (send, recv, root, op=None, stream=None))]
    fn reduce(
        &self,
        py: Python<'_>,
        send: &Bound<'_, PyAny>,
        recv: &Bound<'_, PyAny>,
        root: &Bound<'_, PyAny>,
        op: Option<&Bound<'_, PyAny>>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let s = tensor(py, send, "send")?;
        let r = opt_tensor(py, Some(recv), "recv")?;
        let root = index_arg(root, "root")?;
        let op = op.map_or(Ok(ReduceOp::Sum), op_arg)?;
        self.submit(py, stream, |c, st| c.reduce(&s, r.as_ref(), root, op, st))
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
        self.submit(py, stream, |c, st| c.all_gather(&s, &r, st))
    }

    #[pyo3(signature = (send, recv, counts, stream=None))]
    fn all_gatherv(
        &self,
        py: Python<'_>,
        send: &Bound<'_, PyAny>,
        recv: &Bound<'_, PyAny>,
        counts: &Bound<'_, PyAny>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let (s, r) = (tensor(py, send, "send")?, tensor(py, recv, "recv")?);
        let counts = counts_arg(counts, "counts")?;
        self.submit(py, stream, |c, st| c.all_gatherv(&s, &r, &counts, st))
    }

    #[pyo3(signature = (send, recv, op=None, stream=None))]
    fn reduce_scatter(
        &self,
        py: Python<'_>,
        send: &Bound<'_, PyAny>,
        recv: &Bound<'_, PyAny>,
        op: Option<&Bound<'_, PyAny>>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let (s, r) = (tensor(py, send, "send")?, tensor(py, recv, "recv")?);
        let op = op.map_or(Ok(ReduceOp::Sum), op_arg)?;
        self.submit(py, stream, |c, st| c.reduce_scatter(&s, &r, op, st))
    }

    #[pyo3(signature = (send, recv, counts, op=None, stream=None))]
    fn reduce_scatterv(
        &self,
        py: Python<'_>,
        send: &Bound<'_, PyAny>,
        recv: &Bound<'_, PyAny>,
        counts: &Bound<'_, PyAny>,
        op: Option<&Bound<'_, PyAny>>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let (s, r) = (tensor(py, send, "send")?, tensor(py, recv, "recv")?);
        let counts = counts_arg(counts, "counts")?;
        let op = op.map_or(Ok(ReduceOp::Sum), op_arg)?;
        self.submit(py, stream, |c, st| {
            c.reduce_scatterv(&s, &r, &counts, op, st)
        })
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
        self.submit(py, stream, |c, st| c.all_to_all(&s, &r, st))
    }

    #[pyo3(signature = (send, send_counts, recv, recv_counts, stream=None))]
    fn all_to_allv(
        &self,
        py: Python<'_>,
        send: &Bound<'_, PyAny>,
        send_counts: &Bound<'_, PyAny>,
        recv: &Bound<'_, PyAny>,
        recv_counts: &Bound<'_, PyAny>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let (s, r) = (tensor(py, send, "send")?, tensor(py, recv, "recv")?);
        let sc = counts_arg(send_counts, "send_counts")?;
        let rc = counts_arg(recv_counts, "recv_counts")?;
        self.submit(py, stream, |c, st| c.all_to_allv(&s, &sc, &r, &rc, st))
    }

    /// torch's `all_to_all_single(output, input, output_split_sizes, input_split_sizes)`:
    /// split sizes count rows of dim 0; None splits evenly.
    #[pyo3(signature = (output, input, output_split_sizes=None, input_split_sizes=None, stream=None))]
    fn all_to_all_single(
        &self,
        py: Python<'_>,
        output: &Bound<'_, PyAny>,
        input: &Bound<'_, PyAny>,
        output_split_sizes: Option<&Bound<'_, PyAny>>,
        input_split_sizes: Option<&Bound<'_, PyAny>>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let (r, s) = (tensor(py, output, "output")?, tensor(py, input, "input")?);
        let n = self.comm(py)?.size();
        let opt_counts = |o: Option<&Bound<'_, PyAny>>, arg: &str| match o {
            Some(o) if !o.is_none() => counts_arg(o, arg).map(Some),
            _ => Ok(None),
        };
        let rc = splits(
            &r,
            opt_counts(output_split_sizes, "output_split_sizes")?,
            n,
            "output",
        )?;
        let sc = splits(
            &s,
            opt_counts(input_split_sizes, "input_split_sizes")?,
            n,
            "input",
        )?;
        self.submit(py, stream, |c, st| c.all_to_allv(&s, &sc, &r, &rc, st))
    }

    /// Every rank's `send` to rank `root`'s `recv` (block `q` from rank `q`); `recv` is
    /// ignored (may be None) elsewhere.
    #[pyo3(signature = (send, recv, root, stream=None))]
    fn gather(
        &self,
        py: Python<'_>,
        send: &Bound<'_, PyAny>,
        recv: Option<&Bound<'_, PyAny>>,
        root: &Bound<'_, PyAny>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let s = tensor(py, send, "send")?;
        let r = opt_tensor(py, recv, "recv")?;
        let root = index_arg(root, "root")?;
        self.submit(py, stream, |c, st| c.gather(&s, r.as_ref(), root, st))
    }

    /// Block `q` of rank `root`'s `send` to rank `q`'s `recv`; `send` is ignored (may be
    /// None) elsewhere.
    #[pyo3(signature = (send, recv, root, stream=None))]
    fn scatter(
        &self,
        py: Python<'_>,
        send: Option<&Bound<'_, PyAny>>,
        recv: &Bound<'_, PyAny>,
        root: &Bound<'_, PyAny>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let s = opt_tensor(py, send, "send")?;
        let r = tensor(py, recv, "recv")?;
        let root = index_arg(root, "root")?;
        self.submit(py, stream, |c, st| c.scatter(s.as_ref(), &r, root, st))
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
        self.submit(py, stream, |c, st| c.send(&b, peer, st))
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
        self.submit(py, stream, |c, st| c.recv(&b, peer, st))
    }

    #[pyo3(signature = (stream=None))]
    fn barrier(&self, py: Python<'_>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        self.submit(py, stream, |c, st| c.barrier(st))
    }

    /// `ncclCommSplit`: the ranks of one `color` form a new communicator, ranked by `key`
    /// (default: this rank), then old rank; `color=None` joins none (returns None). Every
    /// rank calls it; it waits for them, except inside a group.
    #[pyo3(signature = (color, key=None))]
    fn split(
        &self,
        py: Python<'_>,
        color: Option<&Bound<'_, PyAny>>,
        key: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<Py<PyCommunicator>>> {
        let c = self.comm(py)?;
        let color = match color {
            Some(o) if !o.is_none() => {
                let v = index_arg(o, "color")?;
                Some(u32::try_from(v).map_err(|_| {
                    PyValueError::new_err(format!("color: {v} is too large (at most 2**32 - 1)"))
                })?)
            }
            _ => None,
        };
        let key = match key {
            Some(k) if !k.is_none() => {
                if k.is_instance_of::<pyo3::types::PyBool>() {
                    return Err(PyTypeError::new_err("key must be an int, got bool"));
                }
                k.extract::<i64>().map_err(|_| {
                    PyTypeError::new_err(format!("key must be an int, got {}", type_name(k)))
                })?
            }
            _ => c.rank() as i64,
        };
        let f = c.split(color, key).map_err(RtErr)?;
        let made = finish_forming(py, f)?;
        Ok(color.is_some().then_some(made))
    }

    /// Raise the error that made the communicator unusable (an abort on any rank, a
    /// shutdown, a failed collective across processes), if any (NCCL's
    /// `ncclCommGetAsyncError`, CuPy's `check_async_error`).
    fn check_async_error(&self, py: Python<'_>) -> PyResult<()> {
        match self.comm(py)?.async_error() {
            Some(e) => Err(RtErr(e).into()),
            None => Ok(()),
        }
    }

    /// Whether the communicator was aborted (on any rank, or by shutdown).
    #[getter]
    fn aborted(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.comm(py)?.is_aborted())
    }

    fn abort(&self, py: Python<'_>) -> PyResult<()> {
        self.comm(py)?.abort();
        Ok(())
    }

    fn destroy(&self, py: Python<'_>) -> PyResult<()> {
        self.comm(py)?.destroy();
        Ok(())
    }
}
