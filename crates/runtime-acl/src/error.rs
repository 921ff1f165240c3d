//! Failures as CANN reports them: a return code and a message, the message kept per thread for
//! `aclGetRecentErrMsg`, and the one mapping from `runtime-core` errors to return codes.

use std::cell::{Cell, RefCell};
use std::ffi::{c_char, CString};

use runtime_core::error::{DeviceError, Error, MemoryError, StreamError};

use crate::codes::*;

/// A failed ACL call: CANN's return code and a message naming the call, the argument and the
/// numbers involved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AclError {
    code: i32,
    msg: String,
}

/// Result of an ACL call.
pub type AclResult<T> = Result<T, AclError>;

impl AclError {
    /// A failure with `code` and `msg` (which should start with the call's name).
    pub fn new(code: i32, msg: impl Into<String>) -> Self {
        AclError {
            code,
            msg: msg.into(),
        }
    }

    /// `ACL_ERROR_INVALID_PARAM` with `msg`.
    pub fn param(msg: impl Into<String>) -> Self {
        Self::new(ACL_ERROR_INVALID_PARAM, msg)
    }

    /// The return code.
    pub fn code(&self) -> i32 {
        self.code
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.msg
    }

    /// A core error met by the call `name`, with its CANN code ([`code_of`]).
    pub fn core(name: &str, e: &Error) -> Self {
        Self::new(code_of(e), format!("{name}: {e}"))
    }
}

impl std::fmt::Display for AclError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (error code {})", self.msg, self.code)
    }
}

impl std::error::Error for AclError {}

/// The CANN return code for a `runtime-core` error.
pub fn code_of(e: &Error) -> i32 {
    match e {
        Error::Device(DeviceError::NotInitialized) => ACL_ERROR_UNINITIALIZE,
        Error::Device(DeviceError::InvalidDevice { .. }) => ACL_ERROR_RT_INVALID_DEVICEID,
        Error::Device(DeviceError::InvalidHandle { .. }) => ACL_ERROR_INVALID_RESOURCE_HANDLE,
        Error::Device(DeviceError::ThreadSpawn { .. }) => ACL_ERROR_RT_RESOURCE_ALLOC_FAIL,
        Error::Memory(
            MemoryError::OutOfMemory { .. }
            | MemoryError::OverFraction { .. }
            | MemoryError::HostAlloc { .. },
        ) => ACL_ERROR_BAD_ALLOC,
        Error::Memory(MemoryError::OutOfBounds { .. } | MemoryError::HostViewOverlap { .. }) => {
            ACL_ERROR_INVALID_PARAM
        }
        Error::Memory(MemoryError::Corrupt { .. }) => ACL_ERROR_INTERNAL_ERROR,
        Error::Stream(StreamError::Kernel(_)) => ACL_ERROR_RT_AICORE_EXCEPTION,
        Error::Stream(StreamError::Timeout { .. }) => ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
        Error::Stream(StreamError::NotReady { .. }) => ACL_ERROR_RT_EVENT_NOT_COMPLETE,
        Error::Stream(StreamError::Multiple(all)) => all.first().map_or(ACL_ERROR_FAILURE, code_of),
        Error::Stream(
            StreamError::Invalid(_)
            | StreamError::Capturing { .. }
            | StreamError::NotPermitted { .. },
        ) => ACL_ERROR_INVALID_PARAM,
        Error::Arg(_) | Error::Config(_) => ACL_ERROR_INVALID_PARAM,
    }
}

/// Run one ACL call with a panic caught: it becomes `ACL_ERROR_INTERNAL_ERROR` (500000) with
/// its message, so no caller (C or Python) ever sees an unwind.
pub fn catching<T>(name: &str, f: impl FnOnce() -> AclResult<T>) -> AclResult<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let text = if let Some(s) = payload.downcast_ref::<&str>() {
                (*s).to_string()
            } else if let Some(s) = payload.downcast_ref::<String>() {
                s.clone()
            } else {
                "a panic without a message".to_string()
            };
            // A payload whose own drop panics must not unwind out of here either.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(payload)));
            Err(AclError::new(
                ACL_ERROR_INTERNAL_ERROR,
                format!("{name}: internal error (a panic in the runtime): {text}"),
            ))
        }
    }
}

thread_local! {
    /// This thread's latest failure message, not yet read.
    static RECENT: RefCell<Option<String>> = const { RefCell::new(None) };
    /// The message `aclGetRecentErrMsg` returned last on this thread (its pointer stays valid
    /// until the thread's next call).
    static RETURNED: RefCell<Option<CString>> = const { RefCell::new(None) };
}

thread_local! {
    /// This thread's latest failure code (`aclrtGetLastError` / `aclrtPeekAtLastError`).
    static LAST: Cell<i32> = const { Cell::new(0) };
}

/// Keep `e`'s message (with its code) as this thread's recent error, and its code as the
/// thread's last error.
pub fn record(e: &AclError) {
    let text = e.to_string();
    let _ = RECENT.try_with(|r| *r.borrow_mut() = Some(text));
    record_code(e.code());
}

/// Keep `code` as this thread's last error code.
pub fn record_code(code: i32) {
    let _ = LAST.try_with(|l| l.set(code));
}

/// This thread's last error code (0 when none): `aclrtGetLastError` (`clear`: then cleared)
/// or `aclrtPeekAtLastError`.
pub fn last_code(clear: bool) -> i32 {
    LAST.try_with(|l| if clear { l.replace(0) } else { l.get() })
        .unwrap_or(0)
}

/// Keep `text` as this thread's recent error message, as is.
pub fn record_text(text: String) {
    let _ = RECENT.try_with(|r| *r.borrow_mut() = Some(text));
}

/// This thread's recent error message, cleared once read (`None` when there is none).
pub fn take_recent() -> Option<String> {
    RECENT.try_with(|r| r.borrow_mut().take()).ok().flatten()
}

/// [`take_recent`] as a C string that stays valid until this thread's next call (NULL when
/// there is none).
pub(crate) fn take_recent_c() -> *const c_char {
    let Some(text) = take_recent() else {
        return std::ptr::null();
    };
    let c = CString::new(text.replace('\0', " ")).unwrap_or_default();
    RETURNED
        .try_with(|r| {
            let mut slot = r.borrow_mut();
            *slot = Some(c);
            slot.as_ref().map_or(std::ptr::null(), |c| c.as_ptr())
        })
        .unwrap_or(std::ptr::null())
}

#[cfg(test)]
mod tests {
    use super::*;
    use runtime_core::error::{arg_error, KernelFailure};

    #[test]
    fn core_errors_map_to_cann_codes() {
        assert_eq!(
            code_of(&DeviceError::NotInitialized.into()),
            ACL_ERROR_UNINITIALIZE
        );
        assert_eq!(
            code_of(&DeviceError::InvalidDevice { index: 9, count: 2 }.into()),
            ACL_ERROR_RT_INVALID_DEVICEID
        );
        assert_eq!(code_of(&arg_error("x", "bad")), ACL_ERROR_INVALID_PARAM);
        assert_eq!(
            code_of(&KernelFailure::new("k", "boom").into()),
            ACL_ERROR_RT_AICORE_EXCEPTION
        );
        let many = StreamError::Multiple(vec![
            DeviceError::NotInitialized.into(),
            arg_error("x", "bad"),
        ]);
        assert_eq!(code_of(&many.into()), ACL_ERROR_UNINITIALIZE);
    }

    #[test]
    fn the_recent_message_is_per_thread_and_read_once() {
        record(&AclError::param("aclrtMalloc: size 0"));
        std::thread::spawn(|| assert_eq!(take_recent(), None))
            .join()
            .unwrap();
        assert_eq!(
            take_recent().as_deref(),
            Some("aclrtMalloc: size 0 (error code 100000)")
        );
        assert_eq!(take_recent(), None);
        assert!(take_recent_c().is_null());
    }
}
