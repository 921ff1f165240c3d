/*
 * The device and event queries: aclrtQueryDeviceStatus, aclrtGetDeviceUtilizationRate and
 * aclrtQueryEventWaitStatus, with the values runtime.acl's query_device_status,
 * get_device_utilization_rate and query_event_wait_status give for the same state, and the
 * last error each failure leaves (aclrtPeekAtLastError keeps it, aclrtGetLastError takes it).
 * SPDX-License-Identifier: Apache-2.0
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdatomic.h>

#include "check.h"

static atomic_int g_ran;

static void hold_cb(void *user)
{
    (void)user;
    atomic_fetch_add(&g_ran, 1);
}

int main(void)
{
    /* before aclInit: uninitialised, and that is the thread's last error */
    aclrtDeviceStatus dst = ACL_RT_DEVICE_STATUS_END;
    EXPECT_ERR(ACL_ERROR_UNINITIALIZE, aclrtQueryDeviceStatus(0, &dst));
    CHECK(dst == ACL_RT_DEVICE_STATUS_END); /* a failure writes nothing */
    CHECK(aclrtGetLastError(ACL_RT_THREAD_LEVEL) == ACL_ERROR_UNINITIALIZE);

    CHECK_ACL(aclInit(NULL));
    CHECK_ACL(aclrtSetDevice(0));
    uint32_t count = 0;
    CHECK_ACL(aclrtGetDeviceCount(&count));
    CHECK(count == 2);

    /* ---- device status: every device normal; a bad id or a NULL output is refused ---- */
    for (int32_t d = 0; d < (int32_t)count; d++) {
        dst = ACL_RT_DEVICE_STATUS_END;
        CHECK_ACL(aclrtQueryDeviceStatus(d, &dst));
        CHECK(dst == ACL_RT_DEVICE_STATUS_NORMAL);
    }
    EXPECT_ERR(ACL_ERROR_RT_INVALID_DEVICEID, aclrtQueryDeviceStatus((int32_t)count, &dst));
    CHECK(aclrtPeekAtLastError(ACL_RT_THREAD_LEVEL) == ACL_ERROR_RT_INVALID_DEVICEID);
    EXPECT_ERR(ACL_ERROR_RT_INVALID_DEVICEID, aclrtQueryDeviceStatus(-1, &dst));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtQueryDeviceStatus(0, NULL));
    /* peek leaves the latest failure, get takes it, a success does not clear it */
    CHECK_ACL(aclrtQueryDeviceStatus(0, &dst));
    CHECK(aclrtPeekAtLastError(ACL_RT_THREAD_LEVEL) == ACL_ERROR_INVALID_PARAM);
    CHECK(aclrtGetLastError(ACL_RT_THREAD_LEVEL) == ACL_ERROR_INVALID_PARAM);
    CHECK(aclrtGetLastError(ACL_RT_THREAD_LEVEL) == ACL_SUCCESS);

    /* ---- utilisation: units the device lacks read -1; idle windows read 0 ---- */
    aclrtUtilizationInfo info;
    memset(&info, 0x5a, sizeof info);
    CHECK_ACL(aclrtGetDeviceUtilizationRate(1, &info)); /* opens a window on device 1 */
    CHECK(info.cubeUtilization >= 0 && info.cubeUtilization <= 100);
    CHECK(info.vectorUtilization == -1 && info.aicpuUtilization == -1);
    CHECK(info.memoryUtilization == -1);
    CHECK(info.utilizationExtend == NULL);
    /* nothing ran on device 1 since the previous query */
    CHECK_ACL(aclrtGetDeviceUtilizationRate(1, &info));
    CHECK(info.cubeUtilization == 0);
    EXPECT_ERR(ACL_ERROR_RT_INVALID_DEVICEID, aclrtGetDeviceUtilizationRate((int32_t)count, &info));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtGetDeviceUtilizationRate(0, NULL));
    CHECK(aclrtGetLastError(ACL_RT_THREAD_LEVEL) == ACL_ERROR_INVALID_PARAM);

    /* ---- event wait status: COMPLETE with no waiter; NOT_READY while a waiting stream has
     * not passed its wait; COMPLETE once it has ---- */
    aclrtStream a = NULL, b = NULL;
    CHECK_ACL(aclrtCreateStream(&a));
    CHECK_ACL(aclrtCreateStream(&b));
    aclrtEvent ev = NULL;
    CHECK_ACL(aclrtCreateEvent(&ev));
    aclrtEventWaitStatus ws = ACL_EVENT_WAIT_STATUS_RESERVED;
    CHECK_ACL(aclrtQueryEventWaitStatus(ev, &ws));
    CHECK(ws == ACL_EVENT_WAIT_STATUS_COMPLETE);

    /* stream a is held by a blocking callback this very thread serves, so the event it
     * records next cannot complete before aclrtProcessReport below runs the callback */
    CHECK_ACL(aclrtSubscribeReport((uint64_t)pthread_self(), a));
    CHECK_ACL(aclrtLaunchCallback(hold_cb, NULL, ACL_CALLBACK_BLOCK, a));
    CHECK_ACL(aclrtRecordEvent(ev, a));
    CHECK_ACL(aclrtStreamWaitEvent(b, ev));
    CHECK_ACL(aclrtQueryEventWaitStatus(ev, &ws));
    CHECK(ws == ACL_EVENT_WAIT_STATUS_NOT_READY);
    aclrtEventRecordedStatus rec = ACL_EVENT_RECORDED_STATUS_COMPLETE;
    CHECK_ACL(aclrtQueryEventStatus(ev, &rec));
    CHECK(rec == ACL_EVENT_RECORDED_STATUS_NOT_READY);
    CHECK(atomic_load(&g_ran) == 0);

    CHECK_ACL(aclrtProcessReport(10000)); /* runs hold_cb: stream a goes on */
    CHECK(atomic_load(&g_ran) == 1);
    CHECK_ACL(aclrtSynchronizeStream(b));
    CHECK_ACL(aclrtQueryEventWaitStatus(ev, &ws));
    CHECK(ws == ACL_EVENT_WAIT_STATUS_COMPLETE);
    CHECK_ACL(aclrtQueryEventStatus(ev, &rec));
    CHECK(rec == ACL_EVENT_RECORDED_STATUS_COMPLETE);
    CHECK_ACL(aclrtUnSubscribeReport((uint64_t)pthread_self(), a));

    /* record + synchronize with a waiter: complete */
    CHECK_ACL(aclrtRecordEvent(ev, a));
    CHECK_ACL(aclrtStreamWaitEvent(b, ev));
    CHECK_ACL(aclrtSynchronizeStream(b));
    CHECK_ACL(aclrtQueryEventWaitStatus(ev, &ws));
    CHECK(ws == ACL_EVENT_WAIT_STATUS_COMPLETE);

    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtQueryEventWaitStatus(ev, NULL));
    CHECK_ACL(aclrtDestroyEvent(ev));
    EXPECT_ERR(ACL_ERROR_INVALID_RESOURCE_HANDLE, aclrtQueryEventWaitStatus(ev, &ws));
    CHECK(aclrtGetLastError(ACL_RT_THREAD_LEVEL) == ACL_ERROR_INVALID_RESOURCE_HANDLE);

    CHECK_ACL(aclrtDestroyStream(a));
    CHECK_ACL(aclrtDestroyStream(b));
    CHECK_ACL(aclrtResetDevice(0));
    CHECK_ACL(aclFinalize());
    /* after aclFinalize: uninitialised again */
    EXPECT_ERR(ACL_ERROR_UNINITIALIZE, aclrtGetDeviceUtilizationRate(0, &info));
    INFO_LOG("run success!");
    return 0;
}
