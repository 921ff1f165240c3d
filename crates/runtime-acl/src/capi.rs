//! The C ABI: each ACL function as an `extern "C"` function with CANN's types, over the Rust
//! API of this crate, gathered in one table ([`TABLE`]) that the exported symbols
//! (`dispatch`) call through.
//!
//! Conventions kept here, once for every function: a panic never crosses the C boundary (it
//! becomes `ACL_ERROR_INTERNAL_ERROR`, 500000, with its message); every failure leaves its
//! message for `aclGetRecentErrMsg` and its code for `aclrtGetLastError` on the calling thread;
//! a NULL output pointer is `ACL_ERROR_INVALID_PARAM`; a NULL stream is the current context's
//! default stream. Output pointers that are not NULL must be valid, as in CANN.

#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::catch_unwind;

use crate::codes::*;
use crate::error::{self, AclError, AclResult};
use crate::memory::{self, DeviceKind, Foreign};
use crate::{lifecycle, report, state};

/// An `aclrtCallback`.
pub type AclrtCallback = Option<unsafe extern "C" fn(user_data: *mut c_void)>;

fn fail(e: &AclError) -> c_int {
    error::record(e);
    e.code()
}

/// Run one ACL call: its result as a return code, a failure recorded, a panic caught
/// ([`error::catching`]).
pub fn guard(name: &str, f: impl FnOnce() -> AclResult<()>) -> c_int {
    match error::catching(name, f) {
        Ok(()) => ACL_SUCCESS,
        Err(e) => fail(&e),
    }
}

/// Store `v` through the output pointer `out`, or `ACL_ERROR_INVALID_PARAM` for NULL.
///
/// # Safety
/// `out` is NULL or valid for a write of `T`.
unsafe fn put<T>(name: &str, what: &str, out: *mut T, v: T) -> AclResult<()> {
    if out.is_null() {
        return Err(AclError::param(format!("{name}: {what} is NULL")));
    }
    // SAFETY: not NULL, and valid for writes by the caller's contract (CANN's as well).
    unsafe { out.write(v) };
    Ok(())
}

fn not_null<T>(name: &str, what: &str, p: *mut T) -> AclResult<()> {
    if p.is_null() {
        Err(AclError::param(format!("{name}: {what} is NULL")))
    } else {
        Ok(())
    }
}

fn h(p: *mut c_void) -> state::Handle {
    p as usize as state::Handle
}

fn ptr(h: state::Handle) -> *mut c_void {
    h as usize as *mut c_void
}

// --------------------------------------------------------------------------- init

unsafe extern "C" fn aclInit(config_path: *const c_char) -> c_int {
    guard("aclInit", || {
        let path = if config_path.is_null() {
            None
        } else {
            // SAFETY: a non-NULL path is a NUL-terminated string (CANN's contract).
            let c = unsafe { CStr::from_ptr(config_path) };
            Some(c.to_str().map_err(|_| {
                AclError::new(
                    ACL_ERROR_INVALID_FILE,
                    "aclInit: the configuration path is not UTF-8",
                )
            })?)
        };
        lifecycle::init(path)
    })
}

unsafe extern "C" fn aclFinalize() -> c_int {
    guard("aclFinalize", lifecycle::finalize)
}

unsafe extern "C" fn aclGetRecentErrMsg() -> *const c_char {
    catch_unwind(error::take_recent_c).unwrap_or(std::ptr::null())
}

unsafe extern "C" fn aclrtGetLastError(_level: c_int) -> c_int {
    error::last_code(true)
}

unsafe extern "C" fn aclrtPeekAtLastError(_level: c_int) -> c_int {
    error::last_code(false)
}

unsafe extern "C" fn aclrtGetVersion(major: *mut i32, minor: *mut i32, patch: *mut i32) -> c_int {
    guard("aclrtGetVersion", || {
        let v = |s: &str| s.parse::<i32>().unwrap_or(0);
        // SAFETY: each pointer is NULL or valid (caller's contract).
        unsafe {
            put(
                "aclrtGetVersion",
                "majorVersion",
                major,
                v(env!("CARGO_PKG_VERSION_MAJOR")),
            )?;
            put(
                "aclrtGetVersion",
                "minorVersion",
                minor,
                v(env!("CARGO_PKG_VERSION_MINOR")),
            )?;
            put(
                "aclrtGetVersion",
                "patchVersion",
                patch,
                v(env!("CARGO_PKG_VERSION_PATCH")),
            )
        }
    })
}

unsafe extern "C" fn aclrtGetSocName() -> *const c_char {
    catch_unwind(soc_name).unwrap_or(std::ptr::null())
}

/// The SoC name of the devices' profile, as a C string that lives for the process.
fn soc_name() -> *const c_char {
    if !state::is_initialized() {
        error::record_text("aclrtGetSocName: aclInit has not been called".into());
        return std::ptr::null();
    }
    let Ok(rt) = runtime_core::runtime::get() else {
        return std::ptr::null();
    };
    // One name per device profile (runtime_core::config::profile::PROFILE_NAMES).
    let name: &'static CStr = match rt.config().profile.name {
        "ascend910" => c"Ascend910",
        "host" => c"host",
        _ => c"unknown",
    };
    name.as_ptr()
}

unsafe extern "C" fn aclrtGetRunMode(run_mode: *mut c_int) -> c_int {
    // Answered before aclInit too: public samples call it first.
    // SAFETY: NULL or valid (caller's contract).
    guard("aclrtGetRunMode", || unsafe {
        put("aclrtGetRunMode", "runMode", run_mode, ACL_HOST)
    })
}

// --------------------------------------------------------------------------- devices, contexts

unsafe extern "C" fn aclrtSetDevice(device_id: i32) -> c_int {
    guard("aclrtSetDevice", || state::set_device(device_id))
}

unsafe extern "C" fn aclrtResetDevice(device_id: i32) -> c_int {
    guard("aclrtResetDevice", || state::reset_device(device_id, false))
}

unsafe extern "C" fn aclrtResetDeviceForce(device_id: i32) -> c_int {
    guard("aclrtResetDeviceForce", || {
        state::reset_device(device_id, true)
    })
}

unsafe extern "C" fn aclrtGetDevice(device_id: *mut i32) -> c_int {
    guard("aclrtGetDevice", || {
        not_null("aclrtGetDevice", "deviceId", device_id)?;
        let d = state::get_device()?;
        // SAFETY: not NULL; valid by the caller's contract.
        unsafe { put("aclrtGetDevice", "deviceId", device_id, d) }
    })
}

unsafe extern "C" fn aclrtGetDeviceCount(count: *mut u32) -> c_int {
    guard("aclrtGetDeviceCount", || {
        not_null("aclrtGetDeviceCount", "count", count)?;
        let n = state::get_device_count()?;
        // SAFETY: as above.
        unsafe { put("aclrtGetDeviceCount", "count", count, n) }
    })
}

unsafe extern "C" fn aclrtQueryDeviceStatus(device_id: i32, status: *mut c_int) -> c_int {
    const NAME: &str = "aclrtQueryDeviceStatus";
    guard(NAME, || {
        not_null(NAME, "deviceStatus", status)?;
        let v = if state::query_device_status(device_id)? {
            ACL_RT_DEVICE_STATUS_NORMAL
        } else {
            ACL_RT_DEVICE_STATUS_ABNORMAL
        };
        // SAFETY: not NULL; valid by the caller's contract.
        unsafe { put(NAME, "deviceStatus", status, v) }
    })
}

/// `aclrtUtilizationInfo`, laid out as CANN documents it: four `int32_t` percentages, then
/// a reserved pointer to an extension structure (always NULL here).
#[repr(C)]
pub struct AclrtUtilizationInfo {
    /// Cube (compute) utilisation in percent.
    pub cube_utilization: i32,
    /// Vector utilisation in percent; -1 where the device has none.
    pub vector_utilization: i32,
    /// AI CPU utilisation in percent; -1 where the device has none.
    pub aicpu_utilization: i32,
    /// Device memory utilisation in percent; -1 (reserved).
    pub memory_utilization: i32,
    /// Reserved extension (`aclrtUtilizationExtendInfo *`): NULL.
    pub utilization_extend: *mut c_void,
}

unsafe extern "C" fn aclrtGetDeviceUtilizationRate(
    device_id: i32,
    info: *mut AclrtUtilizationInfo,
) -> c_int {
    const NAME: &str = "aclrtGetDeviceUtilizationRate";
    guard(NAME, || {
        not_null(NAME, "utilizationInfo", info)?;
        let u = state::device_utilization(device_id)?;
        let v = AclrtUtilizationInfo {
            cube_utilization: u.cube,
            vector_utilization: u.vector,
            aicpu_utilization: u.aicpu,
            memory_utilization: u.memory,
            utilization_extend: std::ptr::null_mut(),
        };
        // SAFETY: not NULL; valid by the caller's contract.
        unsafe { put(NAME, "utilizationInfo", info, v) }
    })
}

fn timed(name: &str, r: AclResult<bool>, code: i32, timeout: i32) -> AclResult<()> {
    match r? {
        true => Ok(()),
        false => Err(AclError::new(
            code,
            format!("{name}: the wait did not finish within {timeout} ms"),
        )),
    }
}

unsafe extern "C" fn aclrtSynchronizeDevice() -> c_int {
    guard("aclrtSynchronizeDevice", || {
        state::synchronize_device(None).map(|_| ())
    })
}

unsafe extern "C" fn aclrtSynchronizeDeviceWithTimeout(timeout: i32) -> c_int {
    const NAME: &str = "aclrtSynchronizeDeviceWithTimeout";
    guard(NAME, || {
        let t = report::timeout_ms(NAME, timeout)?;
        timed(
            NAME,
            state::synchronize_device(t),
            ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
            timeout,
        )
    })
}

unsafe extern "C" fn aclrtCreateContext(context: *mut *mut c_void, device_id: i32) -> c_int {
    guard("aclrtCreateContext", || {
        not_null("aclrtCreateContext", "context", context)?;
        let c = state::create_context(device_id)?;
        // SAFETY: not NULL; valid by the caller's contract.
        unsafe { put("aclrtCreateContext", "context", context, ptr(c)) }
    })
}

unsafe extern "C" fn aclrtDestroyContext(context: *mut c_void) -> c_int {
    guard("aclrtDestroyContext", || state::destroy_context(h(context)))
}

unsafe extern "C" fn aclrtSetCurrentContext(context: *mut c_void) -> c_int {
    guard("aclrtSetCurrentContext", || state::set_context(h(context)))
}

unsafe extern "C" fn aclrtGetCurrentContext(context: *mut *mut c_void) -> c_int {
    guard("aclrtGetCurrentContext", || {
        not_null("aclrtGetCurrentContext", "context", context)?;
        let c = state::get_context()?;
        // SAFETY: not NULL; valid by the caller's contract.
        unsafe { put("aclrtGetCurrentContext", "context", context, ptr(c)) }
    })
}

// --------------------------------------------------------------------------- streams

unsafe extern "C" fn aclrtCreateStream(stream: *mut *mut c_void) -> c_int {
    guard("aclrtCreateStream", || {
        not_null("aclrtCreateStream", "stream", stream)?;
        let s = state::create_stream(0)?;
        // SAFETY: not NULL; valid by the caller's contract.
        unsafe { put("aclrtCreateStream", "stream", stream, ptr(s)) }
    })
}

unsafe extern "C" fn aclrtCreateStreamWithConfig(
    stream: *mut *mut c_void,
    priority: u32,
    _flag: u32,
) -> c_int {
    guard("aclrtCreateStreamWithConfig", || {
        not_null("aclrtCreateStreamWithConfig", "stream", stream)?;
        // CANN's priorities run from 0 (highest) down; the runtime's from -3 (highest) to 0.
        let p = -(3i32.saturating_sub(priority.min(3) as i32));
        let s = state::create_stream(p)?;
        // SAFETY: not NULL; valid by the caller's contract.
        unsafe { put("aclrtCreateStreamWithConfig", "stream", stream, ptr(s)) }
    })
}

unsafe extern "C" fn aclrtDestroyStream(stream: *mut c_void) -> c_int {
    guard("aclrtDestroyStream", || state::destroy_stream(h(stream)))
}

unsafe extern "C" fn aclrtDestroyStreamForce(stream: *mut c_void) -> c_int {
    guard("aclrtDestroyStreamForce", || {
        state::destroy_stream(h(stream))
    })
}

unsafe extern "C" fn aclrtSynchronizeStream(stream: *mut c_void) -> c_int {
    guard("aclrtSynchronizeStream", || {
        state::synchronize_stream(h(stream), None).map(|_| ())
    })
}

unsafe extern "C" fn aclrtSynchronizeStreamWithTimeout(stream: *mut c_void, timeout: i32) -> c_int {
    const NAME: &str = "aclrtSynchronizeStreamWithTimeout";
    guard(NAME, || {
        let t = report::timeout_ms(NAME, timeout)?;
        timed(
            NAME,
            state::synchronize_stream(h(stream), t),
            ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
            timeout,
        )
    })
}

unsafe extern "C" fn aclrtStreamQuery(stream: *mut c_void, status: *mut c_int) -> c_int {
    guard("aclrtStreamQuery", || {
        not_null("aclrtStreamQuery", "status", status)?;
        let done = state::stream_query(h(stream))?;
        let v = if done {
            ACL_STREAM_STATUS_COMPLETE
        } else {
            ACL_STREAM_STATUS_NOT_READY
        };
        // SAFETY: not NULL; valid by the caller's contract.
        unsafe { put("aclrtStreamQuery", "status", status, v) }
    })
}

unsafe extern "C" fn aclrtStreamWaitEvent(stream: *mut c_void, event: *mut c_void) -> c_int {
    guard("aclrtStreamWaitEvent", || {
        state::stream_wait_event(h(stream), h(event))
    })
}

// --------------------------------------------------------------------------- events

unsafe extern "C" fn aclrtCreateEvent(event: *mut *mut c_void) -> c_int {
    guard("aclrtCreateEvent", || {
        not_null("aclrtCreateEvent", "event", event)?;
        let e = state::create_event(0)?;
        // SAFETY: not NULL; valid by the caller's contract.
        unsafe { put("aclrtCreateEvent", "event", event, ptr(e)) }
    })
}

unsafe extern "C" fn aclrtCreateEventWithFlag(event: *mut *mut c_void, flag: u32) -> c_int {
    guard("aclrtCreateEventWithFlag", || {
        not_null("aclrtCreateEventWithFlag", "event", event)?;
        let e = state::create_event(flag)?;
        // SAFETY: not NULL; valid by the caller's contract.
        unsafe { put("aclrtCreateEventWithFlag", "event", event, ptr(e)) }
    })
}

unsafe extern "C" fn aclrtDestroyEvent(event: *mut c_void) -> c_int {
    guard("aclrtDestroyEvent", || state::destroy_event(h(event)))
}

unsafe extern "C" fn aclrtRecordEvent(event: *mut c_void, stream: *mut c_void) -> c_int {
    guard("aclrtRecordEvent", || {
        state::record_event(h(event), h(stream))
    })
}

unsafe extern "C" fn aclrtResetEvent(event: *mut c_void, stream: *mut c_void) -> c_int {
    guard("aclrtResetEvent", || {
        state::reset_event(h(event), h(stream))
    })
}

unsafe extern "C" fn aclrtQueryEvent(event: *mut c_void, status: *mut c_int) -> c_int {
    const NAME: &str = "aclrtQueryEvent";
    guard(NAME, || {
        not_null(NAME, "status", status)?;
        let v = if state::query_event(NAME, h(event))? {
            ACL_EVENT_STATUS_COMPLETE
        } else {
            ACL_EVENT_STATUS_NOT_READY
        };
        // SAFETY: not NULL; valid by the caller's contract.
        unsafe { put(NAME, "status", status, v) }
    })
}

unsafe extern "C" fn aclrtQueryEventStatus(event: *mut c_void, status: *mut c_int) -> c_int {
    const NAME: &str = "aclrtQueryEventStatus";
    guard(NAME, || {
        not_null(NAME, "status", status)?;
        // aclrtEventRecordedStatus: 1 is COMPLETE, 0 NOT_READY (the inverse of aclrtEventStatus).
        let v = if state::query_event(NAME, h(event))? {
            ACL_EVENT_RECORDED_STATUS_COMPLETE
        } else {
            ACL_EVENT_RECORDED_STATUS_NOT_READY
        };
        // SAFETY: not NULL; valid by the caller's contract.
        unsafe { put(NAME, "status", status, v) }
    })
}

unsafe extern "C" fn aclrtQueryEventWaitStatus(event: *mut c_void, status: *mut c_int) -> c_int {
    const NAME: &str = "aclrtQueryEventWaitStatus";
    guard(NAME, || {
        not_null(NAME, "status", status)?;
        // COMPLETE once every stream made to wait for the event has passed its wait.
        let v = if state::query_event_wait_status(h(event))? {
            ACL_EVENT_WAIT_STATUS_COMPLETE
        } else {
            ACL_EVENT_WAIT_STATUS_NOT_READY
        };
        // SAFETY: not NULL; valid by the caller's contract.
        unsafe { put(NAME, "status", status, v) }
    })
}

unsafe extern "C" fn aclrtSynchronizeEvent(event: *mut c_void) -> c_int {
    guard("aclrtSynchronizeEvent", || {
        state::synchronize_event(h(event), None).map(|_| ())
    })
}

unsafe extern "C" fn aclrtSynchronizeEventWithTimeout(event: *mut c_void, timeout: i32) -> c_int {
    const NAME: &str = "aclrtSynchronizeEventWithTimeout";
    guard(NAME, || {
        let t = report::timeout_ms(NAME, timeout)?;
        timed(
            NAME,
            state::synchronize_event(h(event), t),
            ACL_ERROR_RT_EVENT_SYNC_TIMEOUT,
            timeout,
        )
    })
}

unsafe extern "C" fn aclrtEventElapsedTime(
    ms: *mut f32,
    start: *mut c_void,
    end: *mut c_void,
) -> c_int {
    guard("aclrtEventElapsedTime", || {
        not_null("aclrtEventElapsedTime", "ms", ms)?;
        let t = state::event_elapsed_time(h(start), h(end))?;
        // SAFETY: not NULL; valid by the caller's contract.
        unsafe { put("aclrtEventElapsedTime", "ms", ms, t) }
    })
}

// --------------------------------------------------------------------------- memory

fn device_malloc(name: &str, dev_ptr: *mut *mut c_void, size: usize) -> AclResult<()> {
    not_null(name, "devPtr", dev_ptr)?;
    let p = memory::malloc(size as u64, DeviceKind::Malloc)?;
    // SAFETY: not NULL; valid by the caller's contract.
    unsafe { put(name, "devPtr", dev_ptr, p as *mut c_void) }
}

unsafe extern "C" fn aclrtMalloc(dev_ptr: *mut *mut c_void, size: usize, _policy: c_int) -> c_int {
    guard("aclrtMalloc", || {
        device_malloc("aclrtMalloc", dev_ptr, size)
    })
}

unsafe extern "C" fn aclrtMallocAlign32(
    dev_ptr: *mut *mut c_void,
    size: usize,
    _policy: c_int,
) -> c_int {
    guard("aclrtMallocAlign32", || {
        device_malloc("aclrtMallocAlign32", dev_ptr, size)
    })
}

unsafe extern "C" fn aclrtMallocCached(
    dev_ptr: *mut *mut c_void,
    size: usize,
    _policy: c_int,
) -> c_int {
    guard("aclrtMallocCached", || {
        device_malloc("aclrtMallocCached", dev_ptr, size)
    })
}

unsafe extern "C" fn aclrtFree(dev_ptr: *mut c_void) -> c_int {
    guard("aclrtFree", || {
        memory::free(dev_ptr as usize, DeviceKind::Malloc)
    })
}

unsafe extern "C" fn aclrtMallocHost(host_ptr: *mut *mut c_void, size: usize) -> c_int {
    guard("aclrtMallocHost", || {
        not_null("aclrtMallocHost", "hostPtr", host_ptr)?;
        let p = memory::malloc_host(size as u64)?;
        // SAFETY: not NULL; valid by the caller's contract.
        unsafe { put("aclrtMallocHost", "hostPtr", host_ptr, p as *mut c_void) }
    })
}

unsafe extern "C" fn aclrtFreeHost(host_ptr: *mut c_void) -> c_int {
    guard("aclrtFreeHost", || memory::free_host(host_ptr as usize))
}

unsafe extern "C" fn aclrtMemcpy(
    dst: *mut c_void,
    dest_max: usize,
    src: *const c_void,
    count: usize,
    kind: c_int,
) -> c_int {
    guard("aclrtMemcpy", || {
        // SAFETY: a C caller's unknown addresses are its own host memory (CANN's contract),
        // reached only through checked kernel copies.
        unsafe {
            memory::memcpy(
                dst as usize,
                dest_max as u64,
                src as usize,
                count as u64,
                kind,
                None,
                Foreign::Allow,
            )
        }
    })
}

unsafe extern "C" fn aclrtMemcpyAsync(
    dst: *mut c_void,
    dest_max: usize,
    src: *const c_void,
    count: usize,
    kind: c_int,
    stream: *mut c_void,
) -> c_int {
    const NAME: &str = "aclrtMemcpyAsync";
    guard(NAME, || {
        let s = state::stream(NAME, h(stream))?;
        // SAFETY: as for aclrtMemcpy.
        unsafe {
            memory::memcpy(
                dst as usize,
                dest_max as u64,
                src as usize,
                count as u64,
                kind,
                Some(&s),
                Foreign::Allow,
            )
        }
    })
}

unsafe extern "C" fn aclrtMemset(
    dev_ptr: *mut c_void,
    max_count: usize,
    value: i32,
    count: usize,
) -> c_int {
    guard("aclrtMemset", || {
        // SAFETY: as for aclrtMemcpy.
        unsafe {
            memory::memset(
                dev_ptr as usize,
                max_count as u64,
                value,
                count as u64,
                None,
                Foreign::Allow,
            )
        }
    })
}

unsafe extern "C" fn aclrtMemsetAsync(
    dev_ptr: *mut c_void,
    max_count: usize,
    value: i32,
    count: usize,
    stream: *mut c_void,
) -> c_int {
    const NAME: &str = "aclrtMemsetAsync";
    guard(NAME, || {
        let s = state::stream(NAME, h(stream))?;
        // SAFETY: as for aclrtMemcpy.
        unsafe {
            memory::memset(
                dev_ptr as usize,
                max_count as u64,
                value,
                count as u64,
                Some(&s),
                Foreign::Allow,
            )
        }
    })
}

unsafe extern "C" fn aclrtGetMemInfo(attr: c_int, free: *mut usize, total: *mut usize) -> c_int {
    const NAME: &str = "aclrtGetMemInfo";
    guard(NAME, || {
        not_null(NAME, "free", free)?;
        not_null(NAME, "total", total)?;
        let (f, t) = memory::get_mem_info(attr)?;
        // SAFETY: not NULL; valid by the caller's contract.
        unsafe {
            put(NAME, "free", free, f as usize)?;
            put(NAME, "total", total, t as usize)
        }
    })
}

// --------------------------------------------------------------------------- callbacks

/// The user data pointer of a C callback, carried to the reporting thread.
struct UserData(*mut c_void);
// SAFETY: the pointer is handed back to the C callback on the thread ACL's contract names;
// what it points to is the caller's business, as in CANN.
unsafe impl Send for UserData {}

unsafe extern "C" fn aclrtLaunchCallback(
    func: AclrtCallback,
    user_data: *mut c_void,
    block_type: c_int,
    stream: *mut c_void,
) -> c_int {
    const NAME: &str = "aclrtLaunchCallback";
    guard(NAME, || {
        let Some(f) = func else {
            return Err(AclError::param(format!("{NAME}: fn is NULL")));
        };
        let data = UserData(user_data);
        report::launch(
            Box::new(move || {
                let d = data;
                // SAFETY: the caller's callback with the caller's data, as CANN calls it.
                unsafe { f(d.0) }
            }),
            block_type,
            h(stream),
        )
    })
}

unsafe extern "C" fn aclrtSubscribeReport(thread_id: u64, stream: *mut c_void) -> c_int {
    guard("aclrtSubscribeReport", || {
        report::subscribe(thread_id, h(stream))
    })
}

unsafe extern "C" fn aclrtUnSubscribeReport(thread_id: u64, stream: *mut c_void) -> c_int {
    guard("aclrtUnSubscribeReport", || {
        report::unsubscribe(thread_id, h(stream))
    })
}

unsafe extern "C" fn aclrtProcessReport(timeout: i32) -> c_int {
    guard("aclrtProcessReport", || report::process(timeout))
}

// --------------------------------------------------------------------------- the table

/// Applies `$m` to the list of every exported ACL function: name, parameters, return type.
/// One list, so the table, the implementations and the exported symbols cannot drift apart.
macro_rules! acl_functions {
    ($m:ident) => {
        $m! {
            aclInit(config_path: *const c_char) -> c_int;
            aclFinalize() -> c_int;
            aclGetRecentErrMsg() -> *const c_char;
            aclrtGetLastError(level: c_int) -> c_int;
            aclrtPeekAtLastError(level: c_int) -> c_int;
            aclrtGetVersion(major: *mut i32, minor: *mut i32, patch: *mut i32) -> c_int;
            aclrtGetSocName() -> *const c_char;
            aclrtGetRunMode(run_mode: *mut c_int) -> c_int;
            aclrtSetDevice(device_id: i32) -> c_int;
            aclrtResetDevice(device_id: i32) -> c_int;
            aclrtResetDeviceForce(device_id: i32) -> c_int;
            aclrtGetDevice(device_id: *mut i32) -> c_int;
            aclrtGetDeviceCount(count: *mut u32) -> c_int;
            aclrtSynchronizeDevice() -> c_int;
            aclrtSynchronizeDeviceWithTimeout(timeout: i32) -> c_int;
            aclrtCreateContext(context: *mut *mut c_void, device_id: i32) -> c_int;
            aclrtDestroyContext(context: *mut c_void) -> c_int;
            aclrtSetCurrentContext(context: *mut c_void) -> c_int;
            aclrtGetCurrentContext(context: *mut *mut c_void) -> c_int;
            aclrtCreateStream(stream: *mut *mut c_void) -> c_int;
            aclrtCreateStreamWithConfig(stream: *mut *mut c_void, priority: u32, flag: u32) -> c_int;
            aclrtDestroyStream(stream: *mut c_void) -> c_int;
            aclrtDestroyStreamForce(stream: *mut c_void) -> c_int;
            aclrtSynchronizeStream(stream: *mut c_void) -> c_int;
            aclrtSynchronizeStreamWithTimeout(stream: *mut c_void, timeout: i32) -> c_int;
            aclrtStreamQuery(stream: *mut c_void, status: *mut c_int) -> c_int;
            aclrtStreamWaitEvent(stream: *mut c_void, event: *mut c_void) -> c_int;
            aclrtCreateEvent(event: *mut *mut c_void) -> c_int;
            aclrtCreateEventWithFlag(event: *mut *mut c_void, flag: u32) -> c_int;
            aclrtDestroyEvent(event: *mut c_void) -> c_int;
            aclrtRecordEvent(event: *mut c_void, stream: *mut c_void) -> c_int;
            aclrtResetEvent(event: *mut c_void, stream: *mut c_void) -> c_int;
            aclrtQueryEvent(event: *mut c_void, status: *mut c_int) -> c_int;
            aclrtQueryEventStatus(event: *mut c_void, status: *mut c_int) -> c_int;
            aclrtSynchronizeEvent(event: *mut c_void) -> c_int;
            aclrtSynchronizeEventWithTimeout(event: *mut c_void, timeout: i32) -> c_int;
            aclrtEventElapsedTime(ms: *mut f32, start: *mut c_void, end: *mut c_void) -> c_int;
            aclrtMalloc(dev_ptr: *mut *mut c_void, size: usize, policy: c_int) -> c_int;
            aclrtMallocAlign32(dev_ptr: *mut *mut c_void, size: usize, policy: c_int) -> c_int;
            aclrtMallocCached(dev_ptr: *mut *mut c_void, size: usize, policy: c_int) -> c_int;
            aclrtFree(dev_ptr: *mut c_void) -> c_int;
            aclrtMallocHost(host_ptr: *mut *mut c_void, size: usize) -> c_int;
            aclrtFreeHost(host_ptr: *mut c_void) -> c_int;
            aclrtMemcpy(dst: *mut c_void, dest_max: usize, src: *const c_void, count: usize, kind: c_int) -> c_int;
            aclrtMemcpyAsync(dst: *mut c_void, dest_max: usize, src: *const c_void, count: usize, kind: c_int, stream: *mut c_void) -> c_int;
            aclrtMemset(dev_ptr: *mut c_void, max_count: usize, value: i32, count: usize) -> c_int;
            aclrtMemsetAsync(dev_ptr: *mut c_void, max_count: usize, value: i32, count: usize, stream: *mut c_void) -> c_int;
            aclrtGetMemInfo(attr: c_int, free: *mut usize, total: *mut usize) -> c_int;
            aclrtLaunchCallback(func: $crate::capi::AclrtCallback, user_data: *mut c_void, block_type: c_int, stream: *mut c_void) -> c_int;
            aclrtSubscribeReport(thread_id: u64, stream: *mut c_void) -> c_int;
            aclrtUnSubscribeReport(thread_id: u64, stream: *mut c_void) -> c_int;
            aclrtProcessReport(timeout: i32) -> c_int;
            aclrtQueryEventWaitStatus(event: *mut c_void, status: *mut c_int) -> c_int;
            aclrtQueryDeviceStatus(device_id: i32, status: *mut c_int) -> c_int;
            aclrtGetDeviceUtilizationRate(device_id: i32, info: *mut $crate::capi::AclrtUtilizationInfo) -> c_int;
        }
    };
}

macro_rules! define_table {
    ($($name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        /// Every exported ACL function of one copy of this library, as function pointers
        /// (`#[repr(C)]`, so that another copy loaded in the same process can call them: see
        /// `dispatch`).
        #[repr(C)]
        #[allow(missing_docs)]
        pub struct Table {
            /// [`TABLE_VERSION`].
            pub version: u32,
            /// `size_of::<Table>()`.
            pub size: u32,
            $(pub $name: unsafe extern "C" fn($($ty),*) -> $ret,)*
        }

        /// The name of every exported function, in table order.
        pub const NAMES: &[&str] = &[$(stringify!($name)),*];

        /// This copy's functions.
        pub static TABLE: Table = Table {
            version: TABLE_VERSION,
            size: std::mem::size_of::<Table>() as u32,
            $($name,)*
        };
    };
}

pub(crate) use acl_functions;

/// The layout version of [`Table`]; another copy's table is used only if it matches (2: the
/// event wait, device status and utilisation queries were appended).
pub const TABLE_VERSION: u32 = 2;

acl_functions!(define_table);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_is_internal_error_with_its_message() {
        let code = guard("aclrtTest", || panic!("the invariant broke"));
        assert_eq!(code, ACL_ERROR_INTERNAL_ERROR);
        let msg = error::take_recent().expect("a message");
        assert!(
            msg.contains("aclrtTest") && msg.contains("the invariant broke"),
            "{msg}"
        );
        // SAFETY: no arguments.
        assert_eq!(unsafe { aclrtGetLastError(0) }, ACL_ERROR_INTERNAL_ERROR);
        assert_eq!(guard("aclrtTest", || Ok(())), ACL_SUCCESS);
    }

    #[test]
    fn run_mode_is_host_before_init_and_null_is_refused() {
        let mut mode = -1;
        // SAFETY: a valid pointer, then NULL (refused).
        unsafe {
            assert_eq!(aclrtGetRunMode(&mut mode), ACL_SUCCESS);
            assert_eq!(
                aclrtGetRunMode(std::ptr::null_mut()),
                ACL_ERROR_INVALID_PARAM
            );
        }
        assert_eq!(mode, ACL_HOST);
        assert!(error::take_recent().is_some());
    }
}
