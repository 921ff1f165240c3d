/*
 * Header drift: every function of the C library, taken into a pointer of the exact type
 * CANN documents (written here from the documentation, independently of our headers), so a
 * changed parameter or return type in the acl headers fails to compile (-Werror); linking proves the
 * library exports each one. It then prints every constant as "NAME VALUE" for
 * crates/runtime-acl/tests/c_programs.rs to compare with the library's own values.
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stddef.h>
#include <stdio.h>

#include "acl/acl.h"

#define TAKE(ret, name, ...)                          \
    do {                                              \
        ret (*volatile fp_)(__VA_ARGS__) = name;      \
        printf("fn %s %d\n", #name, fp_ != NULL);     \
    } while (0)

#define SHOW(name) printf("%s %lld\n", #name, (long long)(name))

int main(void)
{
    TAKE(aclError, aclInit, const char *);
    TAKE(aclError, aclFinalize, void);
    TAKE(const char *, aclGetRecentErrMsg, void);
    TAKE(aclError, aclrtGetLastError, aclrtLastErrLevel);
    TAKE(aclError, aclrtPeekAtLastError, aclrtLastErrLevel);
    TAKE(aclError, aclrtGetVersion, int32_t *, int32_t *, int32_t *);
    TAKE(const char *, aclrtGetSocName, void);
    TAKE(aclError, aclrtGetRunMode, aclrtRunMode *);
    TAKE(aclError, aclrtSetDevice, int32_t);
    TAKE(aclError, aclrtResetDevice, int32_t);
    TAKE(aclError, aclrtResetDeviceForce, int32_t);
    TAKE(aclError, aclrtGetDevice, int32_t *);
    TAKE(aclError, aclrtGetDeviceCount, uint32_t *);
    TAKE(aclError, aclrtSynchronizeDevice, void);
    TAKE(aclError, aclrtSynchronizeDeviceWithTimeout, int32_t);
    TAKE(aclError, aclrtCreateContext, aclrtContext *, int32_t);
    TAKE(aclError, aclrtDestroyContext, aclrtContext);
    TAKE(aclError, aclrtSetCurrentContext, aclrtContext);
    TAKE(aclError, aclrtGetCurrentContext, aclrtContext *);
    TAKE(aclError, aclrtCreateStream, aclrtStream *);
    TAKE(aclError, aclrtCreateStreamWithConfig, aclrtStream *, uint32_t, uint32_t);
    TAKE(aclError, aclrtDestroyStream, aclrtStream);
    TAKE(aclError, aclrtDestroyStreamForce, aclrtStream);
    TAKE(aclError, aclrtSynchronizeStream, aclrtStream);
    TAKE(aclError, aclrtSynchronizeStreamWithTimeout, aclrtStream, int32_t);
    TAKE(aclError, aclrtStreamQuery, aclrtStream, aclrtStreamStatus *);
    TAKE(aclError, aclrtStreamWaitEvent, aclrtStream, aclrtEvent);
    TAKE(aclError, aclrtCreateEvent, aclrtEvent *);
    TAKE(aclError, aclrtCreateEventWithFlag, aclrtEvent *, uint32_t);
    TAKE(aclError, aclrtDestroyEvent, aclrtEvent);
    TAKE(aclError, aclrtRecordEvent, aclrtEvent, aclrtStream);
    TAKE(aclError, aclrtResetEvent, aclrtEvent, aclrtStream);
    TAKE(aclError, aclrtQueryEvent, aclrtEvent, aclrtEventStatus *);
    TAKE(aclError, aclrtQueryEventStatus, aclrtEvent, aclrtEventRecordedStatus *);
    TAKE(aclError, aclrtSynchronizeEvent, aclrtEvent);
    TAKE(aclError, aclrtSynchronizeEventWithTimeout, aclrtEvent, int32_t);
    TAKE(aclError, aclrtEventElapsedTime, float *, aclrtEvent, aclrtEvent);
    TAKE(aclError, aclrtMalloc, void **, size_t, aclrtMemMallocPolicy);
    TAKE(aclError, aclrtMallocAlign32, void **, size_t, aclrtMemMallocPolicy);
    TAKE(aclError, aclrtMallocCached, void **, size_t, aclrtMemMallocPolicy);
    TAKE(aclError, aclrtFree, void *);
    TAKE(aclError, aclrtMallocHost, void **, size_t);
    TAKE(aclError, aclrtFreeHost, void *);
    TAKE(aclError, aclrtMemcpy, void *, size_t, const void *, size_t, aclrtMemcpyKind);
    TAKE(aclError, aclrtMemcpyAsync, void *, size_t, const void *, size_t, aclrtMemcpyKind, aclrtStream);
    TAKE(aclError, aclrtMemset, void *, size_t, int32_t, size_t);
    TAKE(aclError, aclrtMemsetAsync, void *, size_t, int32_t, size_t, aclrtStream);
    TAKE(aclError, aclrtGetMemInfo, aclrtMemAttr, size_t *, size_t *);
    TAKE(aclError, aclrtLaunchCallback, aclrtCallback, void *, aclrtCallbackBlockType, aclrtStream);
    TAKE(aclError, aclrtSubscribeReport, uint64_t, aclrtStream);
    TAKE(aclError, aclrtUnSubscribeReport, uint64_t, aclrtStream);
    TAKE(aclError, aclrtProcessReport, int32_t);
    TAKE(aclError, aclrtQueryEventWaitStatus, aclrtEvent, aclrtEventWaitStatus *);
    TAKE(aclError, aclrtQueryDeviceStatus, int32_t, aclrtDeviceStatus *);
    TAKE(aclError, aclrtGetDeviceUtilizationRate, int32_t, aclrtUtilizationInfo *);

    /* sizes C code relies on */
    printf("sizeof_aclError %zu\n", sizeof(aclError));
    printf("sizeof_aclrtStream %zu\n", sizeof(aclrtStream));
    printf("sizeof_aclrtMemcpyKind %zu\n", sizeof(aclrtMemcpyKind));
    printf("sizeof_aclrtUtilizationInfo %zu\n", sizeof(aclrtUtilizationInfo));
    printf("offsetof_utilizationExtend %zu\n", offsetof(aclrtUtilizationInfo, utilizationExtend));

    SHOW(ACL_SUCCESS);
    SHOW(ACL_ERROR_INVALID_PARAM);
    SHOW(ACL_ERROR_UNINITIALIZE);
    SHOW(ACL_ERROR_REPEAT_INITIALIZE);
    SHOW(ACL_ERROR_INVALID_FILE);
    SHOW(ACL_ERROR_WRITE_FILE);
    SHOW(ACL_ERROR_INVALID_FILE_SIZE);
    SHOW(ACL_ERROR_PARSE_FILE);
    SHOW(ACL_ERROR_FILE_MISSING_ATTR);
    SHOW(ACL_ERROR_FILE_ATTR_INVALID);
    SHOW(ACL_ERROR_REPEAT_SUBSCRIBE);
    SHOW(ACL_ERROR_STREAM_NOT_SUBSCRIBE);
    SHOW(ACL_ERROR_THREAD_NOT_SUBSCRIBE);
    SHOW(ACL_ERROR_WAIT_CALLBACK_TIMEOUT);
    SHOW(ACL_ERROR_REPEAT_FINALIZE);
    SHOW(ACL_ERROR_BAD_ALLOC);
    SHOW(ACL_ERROR_API_NOT_SUPPORT);
    SHOW(ACL_ERROR_INVALID_DEVICE);
    SHOW(ACL_ERROR_MEMORY_ADDRESS_UNALIGNED);
    SHOW(ACL_ERROR_RESOURCE_NOT_MATCH);
    SHOW(ACL_ERROR_INVALID_RESOURCE_HANDLE);
    SHOW(ACL_ERROR_FEATURE_UNSUPPORTED);
    SHOW(ACL_ERROR_STORAGE_OVER_LIMIT);
    SHOW(ACL_ERROR_INTERNAL_ERROR);
    SHOW(ACL_ERROR_FAILURE);
    SHOW(ACL_RT_SUCCESS);
    SHOW(ACL_ERROR_RT_PARAM_INVALID);
    SHOW(ACL_ERROR_RT_INVALID_DEVICEID);
    SHOW(ACL_ERROR_RT_CONTEXT_NULL);
    SHOW(ACL_ERROR_RT_STREAM_CONTEXT);
    SHOW(ACL_ERROR_RT_STREAM_SUBSCRIBE);
    SHOW(ACL_ERROR_RT_THREAD_SUBSCRIBE);
    SHOW(ACL_ERROR_RT_STREAM_NO_CB_REG);
    SHOW(ACL_ERROR_RT_WAIT_TIMEOUT);
    SHOW(ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
    SHOW(ACL_ERROR_RT_MEMORY_ALLOCATION);
    SHOW(ACL_ERROR_RT_MEMORY_FREE);
    SHOW(ACL_ERROR_RT_NO_DEVICE);
    SHOW(ACL_ERROR_RT_RESOURCE_ALLOC_FAIL);
    SHOW(ACL_ERROR_RT_INTERNAL_ERROR);
    SHOW(ACL_ERROR_RT_EVENT_NOT_COMPLETE);
    SHOW(ACL_ERROR_RT_REPORT_TIMEOUT);
    SHOW(ACL_ERROR_RT_AICORE_EXCEPTION);
    SHOW(ACL_ERROR_RT_STREAM_SYNC_TIMEOUT);
    SHOW(ACL_ERROR_RT_EVENT_SYNC_TIMEOUT);
    SHOW(ACL_DEVICE);
    SHOW(ACL_HOST);
    SHOW(ACL_MEMCPY_HOST_TO_HOST);
    SHOW(ACL_MEMCPY_HOST_TO_DEVICE);
    SHOW(ACL_MEMCPY_DEVICE_TO_HOST);
    SHOW(ACL_MEMCPY_DEVICE_TO_DEVICE);
    SHOW(ACL_MEMCPY_DEFAULT);
    SHOW(ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE);
    SHOW(ACL_MEMCPY_INNER_DEVICE_TO_DEVICE);
    SHOW(ACL_MEMCPY_INTER_DEVICE_TO_DEVICE);
    SHOW(ACL_MEM_MALLOC_HUGE_FIRST);
    SHOW(ACL_MEM_MALLOC_HUGE_ONLY);
    SHOW(ACL_MEM_MALLOC_NORMAL_ONLY);
    SHOW(ACL_DDR_MEM);
    SHOW(ACL_HBM_MEM);
    SHOW(ACL_DDR_MEM_HUGE);
    SHOW(ACL_DDR_MEM_NORMAL);
    SHOW(ACL_HBM_MEM_HUGE);
    SHOW(ACL_HBM_MEM_NORMAL);
    SHOW(ACL_DDR_MEM_P2P_HUGE);
    SHOW(ACL_DDR_MEM_P2P_NORMAL);
    SHOW(ACL_HBM_MEM_P2P_HUGE);
    SHOW(ACL_HBM_MEM_P2P_NORMAL);
    SHOW(ACL_HBM_MEM_HUGE1G);
    SHOW(ACL_HBM_MEM_P2P_HUGE1G);
    SHOW(ACL_MEM_NORMAL);
    SHOW(ACL_MEM_HUGE);
    SHOW(ACL_MEM_HUGE1G);
    SHOW(ACL_MEM_P2P_NORMAL);
    SHOW(ACL_MEM_P2P_HUGE);
    SHOW(ACL_MEM_P2P_HUGE1G);
    SHOW(ACL_CALLBACK_NO_BLOCK);
    SHOW(ACL_CALLBACK_BLOCK);
    SHOW(ACL_EVENT_STATUS_COMPLETE);
    SHOW(ACL_EVENT_STATUS_NOT_READY);
    SHOW(ACL_EVENT_STATUS_RESERVED);
    SHOW(ACL_EVENT_RECORDED_STATUS_NOT_READY);
    SHOW(ACL_EVENT_RECORDED_STATUS_COMPLETE);
    SHOW(ACL_EVENT_WAIT_STATUS_COMPLETE);
    SHOW(ACL_EVENT_WAIT_STATUS_NOT_READY);
    SHOW(ACL_EVENT_WAIT_STATUS_RESERVED);
    SHOW(ACL_RT_DEVICE_STATUS_NORMAL);
    SHOW(ACL_RT_DEVICE_STATUS_ABNORMAL);
    SHOW(ACL_RT_DEVICE_STATUS_END);
    SHOW(ACL_STREAM_STATUS_COMPLETE);
    SHOW(ACL_STREAM_STATUS_NOT_READY);
    SHOW(ACL_EVENT_SYNC);
    SHOW(ACL_EVENT_CAPTURE_STREAM_PROGRESS);
    SHOW(ACL_EVENT_TIME_LINE);
    SHOW(ACL_EVENT_DEVICE_USE_ONLY);
    SHOW(ACL_EVENT_EXTERNAL);
    SHOW(ACL_EVENT_IPC);
    return 0;
}
