//! The pyACL face's native calls (`runtime.acl`): each is a thin conversion over
//! `runtime-acl`'s Rust API — the same code the C library (`libascendcl.so`) runs — returning
//! pyACL's shapes (a bare `ret`, or a tuple ending with `ret`). A failure is CANN's code, its
//! message kept for `get_recent_err_msg` in the same per-thread slot the C library uses; a
//! panic is `ACL_ERROR_INTERNAL_ERROR`. Argument *types* are checked by the Python layer
//! (pyACL raises `TypeError` for those); an out-of-range int raises `OverflowError` here,
//! which the Python layer turns into `ACL_ERROR_INVALID_PARAM`.
//!
//! Every call that may wait (synchronize, destroy, reset, finalize, blocking copies) runs
//! without the GIL; waits with a timeout or none run in 20 ms slices with Ctrl-C live.
//! Host memory here is only what the table knows (`Foreign::Refuse`): blocks from
//! `malloc_host`, and Python objects registered with [`acl_register_host`], whose memory
//! stays valid while the table holds the object.

use std::sync::Arc;
use std::time::Duration;

use ascendcl::codes::*;
use ascendcl::error::{self as acl_error, AclError, AclResult};
use ascendcl::memory::{self, Block, DeviceKind, Foreign};
use ascendcl::{lifecycle, report, state};
use pyo3::prelude::*;
use runtime_core::stream::copy::HostMemory;

use crate::handles::{PyDeviceBuffer, PyStream};
use crate::pinned::PyPinnedMemory;
use crate::wait;

/// The code of `r` (0 on success), its failure recorded.
fn code(r: AclResult<()>) -> i32 {
    match r {
        Ok(()) => ACL_SUCCESS,
        Err(e) => fail(&e),
    }
}

fn fail(e: &AclError) -> i32 {
    acl_error::record(e);
    e.code()
}

/// `(value, 0)`, or `(fill, code)` with the failure recorded.
fn pair<T>(r: AclResult<T>, fill: T) -> (T, i32) {
    match r {
        Ok(v) => (v, ACL_SUCCESS),
        Err(e) => (fill, fail(&e)),
    }
}

/// Run `f` without the GIL, a panic caught.
fn call<T: Send>(
    py: Python<'_>,
    name: &str,
    f: impl FnOnce() -> AclResult<T> + Send,
) -> AclResult<T> {
    py.detach(|| acl_error::catching(name, f))
}

/// Wait in slices with the GIL released (`wait::in_slices`), a panic in `poll` caught:
/// `poll(slice)` answers `Ok(true)` when done. `timeout` `None` waits for ever; `Ok(false)`
/// when it passed. Ctrl-C raises.
fn sliced(
    py: Python<'_>,
    name: &str,
    timeout: Option<Duration>,
    mut poll: impl FnMut(Duration) -> AclResult<bool> + Send,
) -> PyResult<AclResult<bool>> {
    let mut res = Ok(false);
    let done = wait::in_slices(py, timeout, |slice| {
        res = acl_error::catching(name, || poll(slice));
        !matches!(res, Ok(false))
    })?;
    Ok(if done { res } else { Ok(false) })
}

/// `ms` as pyACL's timeouts take it: -1 for ever, > 0 that long.
fn timeout(name: &str, ms: i32) -> AclResult<Option<Duration>> {
    report::timeout_ms(name, ms)
}

fn timed(name: &str, r: AclResult<bool>, code: i32, ms: i32) -> AclResult<()> {
    match r? {
        true => Ok(()),
        false => Err(AclError::new(
            code,
            format!("{name}: not done within {ms} ms"),
        )),
    }
}

// --------------------------------------------------------------------------- init, errors

/// `acl.init(config_path)`.
#[pyfunction]
#[pyo3(signature = (config_path=None))]
pub fn acl_init(py: Python<'_>, config_path: Option<String>) -> i32 {
    code(call(py, "aclInit", || {
        lifecycle::init(config_path.as_deref())
    }))
}

/// `acl.finalize()`.
#[pyfunction]
pub fn acl_finalize(py: Python<'_>) -> i32 {
    code(call(py, "aclFinalize", lifecycle::finalize))
}

/// Whether ACL is initialised.
#[pyfunction]
pub fn acl_is_initialized() -> bool {
    state::is_initialized()
}

/// This thread's recent error message (then cleared), shared with the C library.
#[pyfunction]
pub fn acl_recent_err_msg() -> Option<String> {
    acl_error::take_recent()
}

/// Keep `text` as this thread's recent error message.
#[pyfunction]
pub fn acl_record_err_msg(text: String) {
    acl_error::record_text(text);
}

/// Keep `text` as this thread's recent error message and `code` as its last error code (a
/// failure the Python layer found itself).
#[pyfunction]
pub fn acl_record_error(code: i32, text: String) {
    acl_error::record_text(text);
    acl_error::record_code(code);
}

/// This thread's last error code, shared with the C library: `acl.rt.get_last_error`
/// (`clear`) or `acl.rt.peek_at_last_error`.
#[pyfunction]
pub fn acl_last_error(clear: bool) -> i32 {
    acl_error::last_code(clear)
}

/// A handle number never used (for the Python layer's own objects).
#[pyfunction]
pub fn acl_new_handle() -> u64 {
    state::new_handle_number()
}

// --------------------------------------------------------------------------- devices, contexts

/// `acl.rt.set_device`.
#[pyfunction]
pub fn acl_set_device(py: Python<'_>, device_id: i32) -> i32 {
    code(call(py, "aclrtSetDevice", || state::set_device(device_id)))
}

/// `acl.rt.reset_device` / `reset_device_force`.
#[pyfunction]
pub fn acl_reset_device(py: Python<'_>, device_id: i32, force: bool) -> i32 {
    code(call(py, "aclrtResetDevice", || {
        state::reset_device(device_id, force)
    }))
}

/// `acl.rt.get_device`.
#[pyfunction]
pub fn acl_get_device(py: Python<'_>) -> (i32, i32) {
    pair(call(py, "aclrtGetDevice", state::get_device), 0)
}

/// `acl.rt.get_device_count`.
#[pyfunction]
pub fn acl_get_device_count(py: Python<'_>) -> (u32, i32) {
    pair(call(py, "aclrtGetDeviceCount", state::get_device_count), 0)
}

/// `acl.rt.synchronize_device[_with_timeout]` (`timeout` ms, -1 for ever).
#[pyfunction]
pub fn acl_synchronize_device(py: Python<'_>, timeout_ms: i32) -> PyResult<i32> {
    const NAME: &str = "aclrtSynchronizeDevice";
    let t = match timeout(NAME, timeout_ms) {
        Ok(t) => t,
        Err(e) => return Ok(fail(&e)),
    };
    let r = sliced(py, NAME, t, |s| state::synchronize_device(Some(s)))?;
    Ok(code(timed(
        NAME,
        r,
        ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
        timeout_ms,
    )))
}

/// `acl.rt.create_context`.
#[pyfunction]
pub fn acl_create_context(py: Python<'_>, device_id: i32) -> (u64, i32) {
    pair(
        call(py, "aclrtCreateContext", || {
            state::create_context(device_id)
        }),
        0,
    )
}

/// `acl.rt.destroy_context`.
#[pyfunction]
pub fn acl_destroy_context(py: Python<'_>, context: u64) -> i32 {
    code(call(py, "aclrtDestroyContext", || {
        state::destroy_context(context)
    }))
}

/// `acl.rt.set_context`.
#[pyfunction]
pub fn acl_set_context(py: Python<'_>, context: u64) -> i32 {
    code(call(py, "aclrtSetCurrentContext", || {
        state::set_context(context)
    }))
}

/// `acl.rt.get_context`.
#[pyfunction]
pub fn acl_get_context(py: Python<'_>) -> (u64, i32) {
    pair(call(py, "aclrtGetCurrentContext", state::get_context), 0)
}

// --------------------------------------------------------------------------- streams

/// `acl.rt.create_stream[_with_config]` (`priority` clamped to the runtime's range).
#[pyfunction]
pub fn acl_create_stream(py: Python<'_>, priority: i32) -> (u64, i32) {
    pair(
        call(py, "aclrtCreateStream", || state::create_stream(priority)),
        0,
    )
}

/// `acl.rt.destroy_stream[_force]`: its queued work is waited for (in slices), then it goes.
#[pyfunction]
pub fn acl_destroy_stream(py: Python<'_>, stream: u64) -> PyResult<i32> {
    const NAME: &str = "aclrtDestroyStream";
    if let Ok(s) = acl_error::catching(NAME, || state::stream(NAME, stream)) {
        if stream != 0 {
            let target = runtime_core::bindings::submitted(&s);
            let _ = sliced(py, NAME, None, |sl| {
                runtime_core::bindings::wait_for(&s, target, Some(sl))
                    .map_err(|e| AclError::core(NAME, &e))
            })?;
        }
    }
    Ok(code(call(py, NAME, || state::destroy_stream(stream))))
}

/// `acl.rt.synchronize_stream[_with_timeout]` (`timeout` ms, -1 for ever; 0 is the default
/// stream).
#[pyfunction]
pub fn acl_synchronize_stream(py: Python<'_>, stream: u64, timeout_ms: i32) -> PyResult<i32> {
    const NAME: &str = "aclrtSynchronizeStream";
    let t = match timeout(NAME, timeout_ms) {
        Ok(t) => t,
        Err(e) => return Ok(fail(&e)),
    };
    let r = sliced(py, NAME, t, |s| state::synchronize_stream(stream, Some(s)))?;
    Ok(code(timed(
        NAME,
        r,
        ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
        timeout_ms,
    )))
}

/// `acl.rt.stream_query`: `(ACL_STREAM_STATUS_COMPLETE or _NOT_READY, ret)`.
#[pyfunction]
pub fn acl_stream_query(py: Python<'_>, stream: u64) -> (i32, i32) {
    let r = call(py, "aclrtStreamQuery", || state::stream_query(stream)).map(|done| {
        if done {
            ACL_STREAM_STATUS_COMPLETE
        } else {
            ACL_STREAM_STATUS_NOT_READY
        }
    });
    pair(r, 0)
}

/// `acl.rt.stream_wait_event`.
#[pyfunction]
pub fn acl_stream_wait_event(py: Python<'_>, stream: u64, event: u64) -> i32 {
    code(call(py, "aclrtStreamWaitEvent", || {
        state::stream_wait_event(stream, event)
    }))
}

/// The runtime stream behind an ACL stream handle (0: the current context's default
/// stream), for the operator calls: `(stream or None, ret)`.
#[pyfunction]
pub fn acl_stream(py: Python<'_>, stream: u64) -> (Option<PyStream>, i32) {
    let (s, c) = pair(
        call(py, "aclStream", || {
            state::stream("aclStream", stream).map(Some)
        }),
        None,
    );
    (s.map(PyStream::wrap), c)
}

// --------------------------------------------------------------------------- events

/// `acl.rt.create_event[_with_flag]`.
#[pyfunction]
pub fn acl_create_event(py: Python<'_>, flag: u32) -> (u64, i32) {
    pair(
        call(py, "aclrtCreateEvent", || state::create_event(flag)),
        0,
    )
}

/// `acl.rt.destroy_event`.
#[pyfunction]
pub fn acl_destroy_event(py: Python<'_>, event: u64) -> i32 {
    code(call(py, "aclrtDestroyEvent", || {
        state::destroy_event(event)
    }))
}

/// `acl.rt.record_event`.
#[pyfunction]
pub fn acl_record_event(py: Python<'_>, event: u64, stream: u64) -> i32 {
    code(call(py, "aclrtRecordEvent", || {
        state::record_event(event, stream)
    }))
}

/// `acl.rt.reset_event`.
#[pyfunction]
pub fn acl_reset_event(py: Python<'_>, event: u64, stream: u64) -> i32 {
    code(call(py, "aclrtResetEvent", || {
        state::reset_event(event, stream)
    }))
}

/// `acl.rt.query_event_status` (`recorded`: aclrtEventRecordedStatus, 1 = complete) and the
/// deprecated `acl.rt.query_event` (aclrtEventStatus, 0 = complete).
#[pyfunction]
pub fn acl_query_event(py: Python<'_>, event: u64, recorded: bool) -> (i32, i32) {
    let name = if recorded {
        "aclrtQueryEventStatus"
    } else {
        "aclrtQueryEvent"
    };
    let r = call(py, name, || state::query_event(name, event)).map(|done| match (recorded, done) {
        (true, true) => ACL_EVENT_RECORDED_STATUS_COMPLETE,
        (true, false) => ACL_EVENT_RECORDED_STATUS_NOT_READY,
        (false, true) => ACL_EVENT_STATUS_COMPLETE,
        (false, false) => ACL_EVENT_STATUS_NOT_READY,
    });
    pair(r, 0)
}

/// `acl.rt.query_event_wait_status`: `(ACL_EVENT_WAIT_STATUS_COMPLETE (0) or _NOT_READY
/// (1), ret)`.
#[pyfunction]
pub fn acl_query_event_wait_status(py: Python<'_>, event: u64) -> (i32, i32) {
    let r = call(py, "aclrtQueryEventWaitStatus", || {
        state::query_event_wait_status(event)
    })
    .map(|done| {
        if done {
            ACL_EVENT_WAIT_STATUS_COMPLETE
        } else {
            ACL_EVENT_WAIT_STATUS_NOT_READY
        }
    });
    pair(r, 0)
}

/// `acl.rt.query_device_status`: `(ACL_RT_DEVICE_STATUS_NORMAL (0) or _ABNORMAL (1), ret)`.
#[pyfunction]
pub fn acl_query_device_status(py: Python<'_>, device_id: i32) -> (i32, i32) {
    let r = call(py, "aclrtQueryDeviceStatus", || {
        state::query_device_status(device_id)
    })
    .map(|ok| {
        if ok {
            ACL_RT_DEVICE_STATUS_NORMAL
        } else {
            ACL_RT_DEVICE_STATUS_ABNORMAL
        }
    });
    pair(r, 0)
}

/// `acl.rt.get_device_utilization_rate`: `((cube, vector, aicpu, memory) in percent, -1
/// for a unit the device lacks, ret)`, the numbers `aclrtGetDeviceUtilizationRate` writes
/// (the Python layer builds pyACL's dict).
#[pyfunction]
pub fn acl_device_utilization(py: Python<'_>, device_id: i32) -> ((i32, i32, i32, i32), i32) {
    let r = call(py, "aclrtGetDeviceUtilizationRate", || {
        state::device_utilization(device_id)
    })
    .map(|u| (u.cube, u.vector, u.aicpu, u.memory));
    pair(r, (0, 0, 0, 0))
}

/// `acl.rt.synchronize_event[_with_timeout]` (`timeout` ms, -1 for ever).
#[pyfunction]
pub fn acl_synchronize_event(py: Python<'_>, event: u64, timeout_ms: i32) -> PyResult<i32> {
    const NAME: &str = "aclrtSynchronizeEvent";
    let t = match timeout(NAME, timeout_ms) {
        Ok(t) => t,
        Err(e) => return Ok(fail(&e)),
    };
    let r = sliced(py, NAME, t, |s| state::synchronize_event(event, Some(s)))?;
    Ok(code(timed(
        NAME,
        r,
        ACL_ERROR_RT_EVENT_SYNC_TIMEOUT,
        timeout_ms,
    )))
}

/// `acl.rt.event_elapsed_time`: `(ms, ret)`.
#[pyfunction]
pub fn acl_event_elapsed_time(py: Python<'_>, start: u64, end: u64) -> (f64, i32) {
    let r = call(py, "aclrtEventElapsedTime", || {
        state::event_elapsed_time(start, end)
    });
    pair(r.map(f64::from), 0.0)
}

// --------------------------------------------------------------------------- memory

fn kind(dvpp: bool) -> DeviceKind {
    if dvpp {
        DeviceKind::Dvpp
    } else {
        DeviceKind::Malloc
    }
}

/// `acl.rt.malloc` (`dvpp`: `acl.media.dvpp_malloc`): `(ptr, ret)`.
#[pyfunction]
pub fn acl_malloc(py: Python<'_>, size: u64, dvpp: bool) -> (usize, i32) {
    pair(
        call(py, "aclrtMalloc", || memory::malloc(size, kind(dvpp))),
        0,
    )
}

/// `acl.rt.free` (`dvpp`: `acl.media.dvpp_free`).
#[pyfunction]
pub fn acl_free(py: Python<'_>, ptr: usize, dvpp: bool) -> i32 {
    code(call(py, "aclrtFree", || memory::free(ptr, kind(dvpp))))
}

/// `acl.rt.malloc_host`: `(ptr, ret)`.
#[pyfunction]
pub fn acl_malloc_host(py: Python<'_>, size: u64) -> (usize, i32) {
    pair(call(py, "aclrtMallocHost", || memory::malloc_host(size)), 0)
}

/// `acl.rt.free_host`.
#[pyfunction]
pub fn acl_free_host(py: Python<'_>, ptr: usize) -> i32 {
    code(call(py, "aclrtFreeHost", || memory::free_host(ptr)))
}

/// `acl.rt.memcpy` (`stream` None) and `memcpy_async`.
#[pyfunction]
#[pyo3(signature = (dst, dest_max, src, count, kind, stream=None))]
pub fn acl_memcpy(
    py: Python<'_>,
    dst: usize,
    dest_max: u64,
    src: usize,
    count: u64,
    kind: i32,
    stream: Option<u64>,
) -> i32 {
    const NAME: &str = "aclrtMemcpy";
    code(call(py, NAME, || {
        let s = stream
            .map(|h| state::stream("aclrtMemcpyAsync", h))
            .transpose()?;
        // SAFETY: Foreign::Refuse: only addresses of live table entries are touched.
        unsafe { memory::memcpy(dst, dest_max, src, count, kind, s.as_ref(), Foreign::Refuse) }
    }))
}

/// `acl.rt.memset` (`stream` None) and `memset_async`.
#[pyfunction]
#[pyo3(signature = (ptr, max_count, value, count, stream=None))]
pub fn acl_memset(
    py: Python<'_>,
    ptr: usize,
    max_count: u64,
    value: i64,
    count: u64,
    stream: Option<u64>,
) -> i32 {
    const NAME: &str = "aclrtMemset";
    code(call(py, NAME, || {
        let s = stream
            .map(|h| state::stream("aclrtMemsetAsync", h))
            .transpose()?;
        // The low byte is used, whatever the int.
        let v = (value & 0xFF) as i32;
        // SAFETY: Foreign::Refuse: only addresses of live table entries are touched.
        unsafe { memory::memset(ptr, max_count, v, count, s.as_ref(), Foreign::Refuse) }
    }))
}

/// `acl.rt.get_mem_info`: `(free, total, ret)`.
#[pyfunction]
pub fn acl_get_mem_info(py: Python<'_>, attr: i32) -> (u64, u64, i32) {
    let ((f, t), c) = pair(
        call(py, "aclrtGetMemInfo", || memory::get_mem_info(attr)),
        (0, 0),
    );
    (f, t, c)
}

/// The memory of a Python object the table holds (bytes, numpy array): valid at `ptr` for
/// `len` bytes while `owner` is referenced.
struct Borrowed {
    ptr: usize,
    len: usize,
    writable: bool,
    _owner: Py<PyAny>,
}

// SAFETY: `ptr..ptr + len` is the data of `owner` (a `bytes` object or a C-contiguous numpy
// array, as the Python layer checks), which neither moves nor shrinks while referenced
// (numpy refuses to resize a referenced array); this value holds the reference. The bytes are
// only touched through raw copies, which the ACL program orders as it orders its arrays' other
// users (no tracker of its own; pinned and registered memory are found by address).
unsafe impl HostMemory for Borrowed {
    fn as_ptr(&self) -> *const u8 {
        self.ptr as *const u8
    }
    fn as_mut_ptr(&self) -> Option<*mut u8> {
        self.writable.then_some(self.ptr as *mut u8)
    }
    fn len(&self) -> usize {
        self.len
    }
}

/// Register `len` bytes at `ptr`, the data of `owner`, as host memory the copy calls accept
/// (`acl.util.bytes_to_ptr` / `numpy_to_ptr`). False when the range lies inside one
/// registered already; `ValueError` for device memory (a host view of a device buffer).
#[pyfunction]
pub fn acl_register_host(
    owner: Py<PyAny>,
    ptr: usize,
    len: usize,
    writable: bool,
    tag: &str,
) -> PyResult<bool> {
    let tag: &'static str = match tag {
        "bytes_to_ptr" => "acl.util.bytes_to_ptr",
        _ => "acl.util.numpy_to_ptr",
    };
    memory::register_host(
        Arc::new(Borrowed {
            ptr,
            len,
            writable,
            _owner: owner,
        }),
        tag,
    )
    .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.message().to_string()))
}

/// Forget a registered range (its object is released).
#[pyfunction]
pub fn acl_unregister_host(py: Python<'_>, ptr: usize) -> bool {
    // The object's last reference may go here: with the GIL held.
    let _ = py;
    memory::unregister_host(ptr)
}

/// Counts changes of the pointer table that may invalidate a resolved address (frees).
#[pyfunction]
pub fn acl_memory_generation() -> u64 {
    memory::generation()
}

/// Host memory `[ptr, ptr + size)` for reading or wrapping from Python:
/// `(owner, offset, writable, ret)` where `owner` exports the memory with the buffer protocol
/// from its byte `offset` on (a `PinnedMemory` for `malloc_host` blocks) or is None for a
/// registered range (the Python layer holds that object).
#[pyfunction]
pub fn acl_host_range(
    py: Python<'_>,
    ptr: usize,
    size: u64,
) -> (Option<PyPinnedMemory>, u64, bool, i32) {
    const NAME: &str = "acl.util.ptr_to_bytes";
    let r = memory::resolve_known(NAME, ptr, size).and_then(|(e, off)| match e.block() {
        Block::Device { .. } => Err(AclError::param(format!(
            "{NAME}: ptr {ptr:#x} is device memory; copy it to host memory with acl.rt.memcpy first"
        ))),
        Block::Pinned(p) => Ok((Some(PyPinnedMemory::wrap(p.clone())), off, true)),
        Block::Registered { mem, .. } => Ok((None, off, mem.as_mut_ptr().is_some())),
    });
    let _ = py;
    match r {
        Ok((o, off, w)) => (o, off, w, ACL_SUCCESS),
        Err(e) => (None, 0, false, fail(&e)),
    }
}

/// The device allocation holding `[ptr, ptr + size)`, for the operator calls:
/// `(buffer over the whole allocation, offset, ret)`.
#[pyfunction]
pub fn acl_resolve_device(
    ptr: usize,
    size: u64,
    what: &str,
    name: &str,
) -> (Option<PyDeviceBuffer>, u64, i32) {
    let r = memory::resolve_known(name, ptr, size).and_then(|(e, off)| match e.block() {
        Block::Device { buf, .. } => Ok((PyDeviceBuffer::raw(buf.clone()), off)),
        _ => Err(AclError::param(format!(
            "{name}: {what} {ptr:#x} is host memory; operators need device memory"
        ))),
    });
    match r {
        Ok((b, off)) => (Some(b), off, ACL_SUCCESS),
        Err(e) => (None, 0, fail(&e)),
    }
}

// --------------------------------------------------------------------------- callbacks

/// `acl.rt.subscribe_report`.
#[pyfunction]
pub fn acl_subscribe_report(py: Python<'_>, thread_id: u64, stream: u64) -> i32 {
    code(call(py, "aclrtSubscribeReport", || {
        report::subscribe(thread_id, stream)
    }))
}

/// `acl.rt.unsubscribe_report`.
#[pyfunction]
pub fn acl_unsubscribe_report(py: Python<'_>, thread_id: u64, stream: u64) -> i32 {
    code(call(py, "aclrtUnSubscribeReport", || {
        report::unsubscribe(thread_id, stream)
    }))
}

/// `acl.rt.launch_callback`: `fn(user_data)` runs in the subscribed thread (inside its
/// `process_report`); an exception it raises is printed, as pyACL does.
#[pyfunction]
pub fn acl_launch_callback(
    py: Python<'_>,
    func: Py<PyAny>,
    user_data: Py<PyAny>,
    block_type: i32,
    stream: u64,
) -> i32 {
    let f: Box<dyn FnOnce() + Send> = Box::new(move || {
        Python::attach(|py| {
            if let Err(e) = func.call1(py, (user_data,)) {
                e.display(py);
            }
        })
    });
    code(call(py, "aclrtLaunchCallback", || {
        report::launch(f, block_type, stream)
    }))
}

/// `acl.rt.process_report(timeout)`: run the callbacks that reached this thread, waiting up
/// to `timeout` ms (-1: for ever) for the first, in slices with the GIL released.
#[pyfunction]
pub fn acl_process_report(py: Python<'_>, timeout_ms: i32) -> PyResult<i32> {
    const NAME: &str = "aclrtProcessReport";
    let t = match timeout(NAME, timeout_ms) {
        Ok(t) => t,
        Err(e) => return Ok(fail(&e)),
    };
    let mut first = None;
    let r = sliced(py, NAME, t, |s| {
        first = report::next(Some(s))?;
        Ok(first.is_some())
    })?;
    match r {
        Err(e) => return Ok(fail(&e)),
        Ok(false) => {
            return Ok(fail(&AclError::new(
                ACL_ERROR_RT_REPORT_TIMEOUT,
                format!("{NAME}: no callback within {timeout_ms} ms"),
            )))
        }
        Ok(true) => {}
    }
    let mut next = first;
    while let Some(r) = next {
        r.run();
        next = report::try_next();
    }
    Ok(ACL_SUCCESS)
}

/// Register the functions on the extension module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    macro_rules! add {
        ($($f:ident),* $(,)?) => { $(m.add_function(wrap_pyfunction!($f, m)?)?;)* };
    }
    add!(
        acl_init,
        acl_finalize,
        acl_is_initialized,
        acl_recent_err_msg,
        acl_record_err_msg,
        acl_record_error,
        acl_last_error,
        acl_query_event_wait_status,
        acl_query_device_status,
        acl_device_utilization,
        acl_new_handle,
        acl_set_device,
        acl_reset_device,
        acl_get_device,
        acl_get_device_count,
        acl_synchronize_device,
        acl_create_context,
        acl_destroy_context,
        acl_set_context,
        acl_get_context,
        acl_create_stream,
        acl_destroy_stream,
        acl_synchronize_stream,
        acl_stream_query,
        acl_stream_wait_event,
        acl_stream,
        acl_create_event,
        acl_destroy_event,
        acl_record_event,
        acl_reset_event,
        acl_query_event,
        acl_synchronize_event,
        acl_event_elapsed_time,
        acl_malloc,
        acl_free,
        acl_malloc_host,
        acl_free_host,
        acl_memcpy,
        acl_memset,
        acl_get_mem_info,
        acl_register_host,
        acl_unregister_host,
        acl_memory_generation,
        acl_host_range,
        acl_resolve_device,
        acl_subscribe_report,
        acl_unsubscribe_report,
        acl_launch_callback,
        acl_process_report,
    );
    Ok(())
}
