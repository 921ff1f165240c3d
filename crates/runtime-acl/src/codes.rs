//! CANN's numbers: every return code and enum value the ACL runtime API uses, by CANN's names.
//!
//! The values are interface facts from CANN's public documentation (the `aclError` page, the
//! runtime error-code table and the enum pages of `acl_base.h` / `acl_rt.h`); the C headers in
//! `include/acl/` and the Python constants (`runtime.acl`) carry the same numbers, and
//! `tests/c/header_drift.c` checks the headers against this module's values.

#![allow(missing_docs)]

/// A CANN return code (`aclError`, a C `int`).
pub type AclError = i32;

// ACL layer (acl_base.h)
pub const ACL_SUCCESS: i32 = 0;
pub const ACL_ERROR_INVALID_PARAM: i32 = 100000;
pub const ACL_ERROR_UNINITIALIZE: i32 = 100001;
pub const ACL_ERROR_REPEAT_INITIALIZE: i32 = 100002;
pub const ACL_ERROR_INVALID_FILE: i32 = 100003;
pub const ACL_ERROR_WRITE_FILE: i32 = 100004;
pub const ACL_ERROR_INVALID_FILE_SIZE: i32 = 100005;
pub const ACL_ERROR_PARSE_FILE: i32 = 100006;
pub const ACL_ERROR_FILE_MISSING_ATTR: i32 = 100007;
pub const ACL_ERROR_FILE_ATTR_INVALID: i32 = 100008;
pub const ACL_ERROR_REPEAT_SUBSCRIBE: i32 = 100033;
pub const ACL_ERROR_STREAM_NOT_SUBSCRIBE: i32 = 100034;
pub const ACL_ERROR_THREAD_NOT_SUBSCRIBE: i32 = 100035;
pub const ACL_ERROR_WAIT_CALLBACK_TIMEOUT: i32 = 100036;
pub const ACL_ERROR_REPEAT_FINALIZE: i32 = 100037;
pub const ACL_ERROR_BAD_ALLOC: i32 = 200000;
pub const ACL_ERROR_API_NOT_SUPPORT: i32 = 200001;
pub const ACL_ERROR_INVALID_DEVICE: i32 = 200002;
pub const ACL_ERROR_MEMORY_ADDRESS_UNALIGNED: i32 = 200003;
pub const ACL_ERROR_RESOURCE_NOT_MATCH: i32 = 200004;
pub const ACL_ERROR_INVALID_RESOURCE_HANDLE: i32 = 200005;
pub const ACL_ERROR_FEATURE_UNSUPPORTED: i32 = 200006;
pub const ACL_ERROR_STORAGE_OVER_LIMIT: i32 = 300000;
pub const ACL_ERROR_INTERNAL_ERROR: i32 = 500000;
pub const ACL_ERROR_FAILURE: i32 = 500001;

// Runtime layer (rt_error_codes.h)
pub const ACL_RT_SUCCESS: i32 = 0;
pub const ACL_ERROR_RT_PARAM_INVALID: i32 = 107000;
pub const ACL_ERROR_RT_INVALID_DEVICEID: i32 = 107001;
pub const ACL_ERROR_RT_CONTEXT_NULL: i32 = 107002;
pub const ACL_ERROR_RT_STREAM_CONTEXT: i32 = 107003;
pub const ACL_ERROR_RT_STREAM_SUBSCRIBE: i32 = 107011;
pub const ACL_ERROR_RT_THREAD_SUBSCRIBE: i32 = 107012;
pub const ACL_ERROR_RT_STREAM_NO_CB_REG: i32 = 107015;
pub const ACL_ERROR_RT_WAIT_TIMEOUT: i32 = 107019;
pub const ACL_ERROR_RT_FEATURE_NOT_SUPPORT: i32 = 207000;
pub const ACL_ERROR_RT_MEMORY_ALLOCATION: i32 = 207001;
pub const ACL_ERROR_RT_MEMORY_FREE: i32 = 207002;
pub const ACL_ERROR_RT_NO_DEVICE: i32 = 207004;
pub const ACL_ERROR_RT_RESOURCE_ALLOC_FAIL: i32 = 207005;
pub const ACL_ERROR_RT_INTERNAL_ERROR: i32 = 507000;
pub const ACL_ERROR_RT_EVENT_NOT_COMPLETE: i32 = 507006;
pub const ACL_ERROR_RT_REPORT_TIMEOUT: i32 = 507012;
pub const ACL_ERROR_RT_AICORE_EXCEPTION: i32 = 507015;
pub const ACL_ERROR_RT_STREAM_SYNC_TIMEOUT: i32 = 507046;
pub const ACL_ERROR_RT_EVENT_SYNC_TIMEOUT: i32 = 507047;

// aclrtRunMode
pub const ACL_DEVICE: i32 = 0;
pub const ACL_HOST: i32 = 1;

// aclrtMemcpyKind
pub const ACL_MEMCPY_HOST_TO_HOST: i32 = 0;
pub const ACL_MEMCPY_HOST_TO_DEVICE: i32 = 1;
pub const ACL_MEMCPY_DEVICE_TO_HOST: i32 = 2;
pub const ACL_MEMCPY_DEVICE_TO_DEVICE: i32 = 3;
pub const ACL_MEMCPY_DEFAULT: i32 = 4;
pub const ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE: i32 = 5;
pub const ACL_MEMCPY_INNER_DEVICE_TO_DEVICE: i32 = 6;
pub const ACL_MEMCPY_INTER_DEVICE_TO_DEVICE: i32 = 7;

// aclrtMemMallocPolicy
pub const ACL_MEM_MALLOC_HUGE_FIRST: u32 = 0;
pub const ACL_MEM_MALLOC_HUGE_ONLY: u32 = 1;
pub const ACL_MEM_MALLOC_NORMAL_ONLY: u32 = 2;

// aclrtMemAttr
pub const ACL_DDR_MEM: i32 = 0;
pub const ACL_HBM_MEM: i32 = 1;
pub const ACL_DDR_MEM_HUGE: i32 = 2;
pub const ACL_DDR_MEM_NORMAL: i32 = 3;
pub const ACL_HBM_MEM_HUGE: i32 = 4;
pub const ACL_HBM_MEM_NORMAL: i32 = 5;
pub const ACL_DDR_MEM_P2P_HUGE: i32 = 6;
pub const ACL_DDR_MEM_P2P_NORMAL: i32 = 7;
pub const ACL_HBM_MEM_P2P_HUGE: i32 = 8;
pub const ACL_HBM_MEM_P2P_NORMAL: i32 = 9;
pub const ACL_HBM_MEM_HUGE1G: i32 = 10;
pub const ACL_HBM_MEM_P2P_HUGE1G: i32 = 11;
pub const ACL_MEM_NORMAL: i32 = 12;
pub const ACL_MEM_HUGE: i32 = 13;
pub const ACL_MEM_HUGE1G: i32 = 14;
pub const ACL_MEM_P2P_NORMAL: i32 = 15;
pub const ACL_MEM_P2P_HUGE: i32 = 16;
pub const ACL_MEM_P2P_HUGE1G: i32 = 17;

// aclrtCallbackBlockType
pub const ACL_CALLBACK_NO_BLOCK: i32 = 0;
pub const ACL_CALLBACK_BLOCK: i32 = 1;

// aclrtEventStatus (aclrtQueryEvent) and the inverted aclrtEventRecordedStatus
// (aclrtQueryEventStatus)
pub const ACL_EVENT_STATUS_COMPLETE: i32 = 0;
pub const ACL_EVENT_STATUS_NOT_READY: i32 = 1;
pub const ACL_EVENT_STATUS_RESERVED: i32 = 2;
pub const ACL_EVENT_RECORDED_STATUS_NOT_READY: i32 = 0;
pub const ACL_EVENT_RECORDED_STATUS_COMPLETE: i32 = 1;

// aclrtEventWaitStatus (aclrtQueryEventWaitStatus)
pub const ACL_EVENT_WAIT_STATUS_COMPLETE: i32 = 0;
pub const ACL_EVENT_WAIT_STATUS_NOT_READY: i32 = 1;
pub const ACL_EVENT_WAIT_STATUS_RESERVED: i32 = 0xFFFF;

// aclrtDeviceStatus (aclrtQueryDeviceStatus)
pub const ACL_RT_DEVICE_STATUS_NORMAL: i32 = 0;
pub const ACL_RT_DEVICE_STATUS_ABNORMAL: i32 = 1;
pub const ACL_RT_DEVICE_STATUS_END: i32 = 0xFFFF;

// aclrtLastErrLevel
pub const ACL_RT_THREAD_LEVEL: i32 = 0;

// aclrtStreamStatus
pub const ACL_STREAM_STATUS_COMPLETE: i32 = 0;
pub const ACL_STREAM_STATUS_NOT_READY: i32 = 1;

// Event flags (aclrtCreateEventWithFlag); every bit CANN defines
pub const ACL_EVENT_SYNC: u32 = 0x1;
pub const ACL_EVENT_CAPTURE_STREAM_PROGRESS: u32 = 0x2;
pub const ACL_EVENT_TIME_LINE: u32 = 0x8;
pub const ACL_EVENT_DEVICE_USE_ONLY: u32 = 0x10;
pub const ACL_EVENT_EXTERNAL: u32 = 0x20;
pub const ACL_EVENT_IPC: u32 = 0x40;
/// The union of the event flags above.
pub const EVENT_FLAGS: u32 = 0x7F;
