//! Inter-process buffers: `DeviceBuffer.ipc_handle()`, `ipc_open` and pickling
//! (`__reduce__`, `__copy__`, `__deepcopy__`). The core (`memory::ipc`) checks and maps.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use crate::convert::resolve;
use crate::errors::RtErr;
use crate::handles::{PyDeviceBuffer, PyEvent};

/// The allocation's IPC handle (bytes).
pub fn handle<'py>(py: Python<'py>, buf: &PyDeviceBuffer) -> PyResult<Bound<'py, PyBytes>> {
    let b = buf.buffer(py)?;
    let h = b.ipc_handle().map_err(RtErr)?;
    Ok(PyBytes::new(py, &h))
}

/// Open a handle made by `DeviceBuffer.ipc_handle()` (in another process of the same user, or
/// in this one) on `device` (default: the current device): a buffer mapping the exporter's
/// memory zero-copy. With `dtype`, the result is `buf.view(dtype, shape, offset)`.
#[pyfunction]
#[pyo3(signature = (handle, dtype=None, shape=None, offset=None, device=None))]
pub fn ipc_open<'py>(
    py: Python<'py>,
    handle: &[u8],
    dtype: Option<&Bound<'py, PyAny>>,
    shape: Option<&Bound<'py, PyAny>>,
    offset: Option<&Bound<'py, PyAny>>,
    device: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let d = resolve(py, device, "device")?;
    let h = handle.to_vec();
    let b = py
        .detach(|| d.memory().open_ipc_handle(&h))
        .map_err(RtErr)?;
    let raw = Bound::new(py, PyDeviceBuffer::raw(b))?.into_any();
    match dtype {
        Some(t) if !t.is_none() => raw.call_method1("view", (t, shape, offset)),
        _ => Ok(raw),
    }
}

/// `pickle` support: the buffer travels as its allocation's IPC handle plus its view (dtype,
/// shape, byte offset from the allocation's start: a handle made by slicing or pointer
/// arithmetic is a core view starting inside the allocation, and its own offset is relative
/// to that view) and is opened with `ipc_open` where it is loaded. An allocation of zero
/// bytes has no memory to share: it travels as its dtype and shape and is loaded as a new
/// empty buffer (as `torch.multiprocessing` sends empty tensors).
pub fn reduce<'py>(slf: &Bound<'py, PyDeviceBuffer>) -> PyResult<Bound<'py, PyTuple>> {
    let py = slf.py();
    let me = slf.get();
    let b = me.buffer(py)?;
    me.require_c_contiguous("buf", "pickling and IPC handles")?;
    let dtype = slf.getattr("dtype")?.getattr("str")?;
    let shape = PyTuple::new(py, me.shape.iter())?;
    if b.allocation_size() == 0 {
        let empty = py.import("runtime")?.getattr("empty")?;
        let args = (shape, dtype).into_pyobject(py)?;
        return PyTuple::new(py, [empty, args.into_any()]);
    }
    let h = handle(py, me)?;
    let open = py.import("runtime")?.getattr("ipc_open")?;
    let args = (h, dtype, shape, b.offset() + me.offset).into_pyobject(py)?;
    PyTuple::new(py, [open, args.into_any()])
}

/// `copy.deepcopy`: a new buffer on the same device holding a copy of this view's bytes (via
/// the host, ordered on the current stream).
pub fn deepcopy<'py>(slf: &Bound<'py, PyDeviceBuffer>) -> PyResult<Bound<'py, PyAny>> {
    let py = slf.py();
    let host = slf.call_method0("copy_to_host")?;
    py.import("runtime")?
        .getattr("to_device")?
        .call1((host, slf.get().device))
}

/// `Event(interprocess=True)`.
pub fn event_create(options: runtime_core::event::EventOptions) -> PyResult<PyEvent> {
    let ev = runtime_core::ipc_event::create(options).map_err(RtErr)?;
    Ok(PyEvent::made_now(ev))
}

/// `Event.ipc_handle()`.
pub fn event_handle<'py>(py: Python<'py>, ev: &PyEvent) -> PyResult<Bound<'py, PyBytes>> {
    let h = runtime_core::ipc_event::handle(ev.raw()).map_err(RtErr)?;
    Ok(PyBytes::new(py, &h))
}

/// `Event.from_ipc(handle)`; works before `init()` (an unpickled event), like an event made
/// then: it belongs to the first runtime it is used under.
pub fn event_open(handle: &[u8]) -> PyResult<PyEvent> {
    let ev = runtime_core::ipc_event::open(handle).map_err(RtErr)?;
    Ok(PyEvent::made_now(ev))
}

/// `pickle` support for events: `(Event.from_ipc, (handle,))`; a plain event cannot be sent.
pub fn event_reduce<'py>(py: Python<'py>, ev: &PyEvent) -> PyResult<Bound<'py, PyTuple>> {
    let h = event_handle(py, ev)?;
    let open = py
        .import("runtime")?
        .getattr("Event")?
        .getattr("from_ipc")?;
    let args = PyTuple::new(py, [h])?;
    PyTuple::new(py, [open, args.into_any()])
}
