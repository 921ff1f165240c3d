/*
 * Streams and events, in the style of the ACL stream and event samples: asynchronous copies
 * and memsets on two streams ordered by an event, timing between two records, the two query
 * calls (whose status values are inverted), waits with timeouts, the NULL (default) stream,
 * and destroying a context whose streams are still alive.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "check.h"

#define SIZE (4u << 20)

int main(void)
{
    CHECK_ACL(aclInit(""));
    CHECK_ACL(aclrtSetDevice(0));
    aclrtStream s1 = NULL, s2 = NULL;
    CHECK_ACL(aclrtCreateStream(&s1));
    CHECK_ACL(aclrtCreateStream(&s2));
    aclrtEvent start = NULL, stop = NULL, ready = NULL;
    CHECK_ACL(aclrtCreateEvent(&start));
    CHECK_ACL(aclrtCreateEvent(&stop));
    CHECK_ACL(aclrtCreateEventWithFlag(&ready, ACL_EVENT_SYNC));

    /* never recorded: complete, in both numberings */
    aclrtEventRecordedStatus rec = ACL_EVENT_RECORDED_STATUS_NOT_READY;
    aclrtEventStatus st = ACL_EVENT_STATUS_NOT_READY;
    CHECK_ACL(aclrtQueryEventStatus(ready, &rec));
    CHECK_ACL(aclrtQueryEvent(ready, &st));
    CHECK(rec == ACL_EVENT_RECORDED_STATUS_COMPLETE && st == ACL_EVENT_STATUS_COMPLETE);

    void *host = NULL, *dev = NULL, *back = NULL;
    CHECK_ACL(aclrtMallocHost(&host, SIZE));
    CHECK_ACL(aclrtMallocHost(&back, SIZE));
    CHECK_ACL(aclrtMalloc(&dev, SIZE, ACL_MEM_MALLOC_HUGE_FIRST));

    /* stream 1 fills the host buffer, copies it up and records; stream 2 waits and copies back */
    CHECK_ACL(aclrtRecordEvent(start, s1));
    CHECK_ACL(aclrtMemsetAsync(host, SIZE, 7, SIZE, s1));
    CHECK_ACL(aclrtMemcpyAsync(dev, SIZE, host, SIZE, ACL_MEMCPY_HOST_TO_DEVICE, s1));
    CHECK_ACL(aclrtMemsetAsync(dev, SIZE, 3, SIZE / 2, s1));
    CHECK_ACL(aclrtRecordEvent(ready, s1));
    CHECK_ACL(aclrtRecordEvent(stop, s1));
    CHECK_ACL(aclrtStreamWaitEvent(s2, ready));
    CHECK_ACL(aclrtMemcpyAsync(back, SIZE, dev, SIZE, ACL_MEMCPY_DEVICE_TO_HOST, s2));
    CHECK_ACL(aclrtSynchronizeStreamWithTimeout(s2, 10000));
    const unsigned char *b = (const unsigned char *)back;
    for (size_t i = 0; i < SIZE; i++) {
        CHECK(b[i] == (i < SIZE / 2 ? 3 : 7));
    }

    /* the events completed: timing and status */
    CHECK_ACL(aclrtSynchronizeEvent(stop));
    CHECK_ACL(aclrtSynchronizeEventWithTimeout(ready, 1000));
    CHECK_ACL(aclrtQueryEventStatus(stop, &rec));
    CHECK(rec == ACL_EVENT_RECORDED_STATUS_COMPLETE);
    float ms = -1.0f, back_ms = 0.0f;
    CHECK_ACL(aclrtEventElapsedTime(&ms, start, stop));
    CHECK_ACL(aclrtEventElapsedTime(&back_ms, stop, start));
    CHECK(ms >= 0.0f && back_ms <= 0.0f);
    INFO_LOG("memset + 4 MiB copy + memset on stream 1: %.3f ms between the events", ms);
    aclrtStreamStatus ss = ACL_STREAM_STATUS_NOT_READY;
    CHECK_ACL(aclrtSynchronizeStream(s1));
    CHECK_ACL(aclrtStreamQuery(s1, &ss));
    CHECK(ss == ACL_STREAM_STATUS_COMPLETE);

    /* reset: never recorded again (complete); recorded on the NULL (default) stream */
    CHECK_ACL(aclrtResetEvent(ready, s2));
    CHECK_ACL(aclrtQueryEventStatus(ready, &rec));
    CHECK(rec == ACL_EVENT_RECORDED_STATUS_COMPLETE);
    CHECK_ACL(aclrtMemsetAsync(dev, SIZE, 1, SIZE, NULL));
    CHECK_ACL(aclrtRecordEvent(ready, NULL));
    CHECK_ACL(aclrtStreamWaitEvent(s1, ready));
    CHECK_ACL(aclrtMemcpyAsync(back, SIZE, dev, SIZE, ACL_MEMCPY_DEVICE_TO_HOST, s1));
    CHECK_ACL(aclrtSynchronizeStream(s1));
    CHECK(b[0] == 1 && b[SIZE - 1] == 1);
    CHECK_ACL(aclrtSynchronizeStream(NULL));
    CHECK_ACL(aclrtSynchronizeDevice());
    CHECK_ACL(aclrtSynchronizeDeviceWithTimeout(5000));

    /* an explicit context destroyed with its stream still alive (as the memcpy samples do) */
    aclrtContext ctx = NULL;
    aclrtStream s3 = NULL;
    CHECK_ACL(aclrtCreateContext(&ctx, 0));
    CHECK_ACL(aclrtCreateStream(&s3));
    CHECK_ACL(aclrtMemsetAsync(dev, SIZE, 5, SIZE, s3));
    CHECK_ACL(aclrtDestroyContext(ctx)); /* waits for s3's work, destroys it */
    EXPECT_ERR(ACL_ERROR_INVALID_RESOURCE_HANDLE, aclrtSynchronizeStream(s3));
    EXPECT_ERR(ACL_ERROR_RT_CONTEXT_NULL, aclrtCreateStream(&s3));
    CHECK_ACL(aclrtSetDevice(0)); /* back to the default context */
    CHECK_ACL(aclrtMemcpy(back, SIZE, dev, SIZE, ACL_MEMCPY_DEVICE_TO_HOST));
    CHECK(b[0] == 5 && b[SIZE - 1] == 5);

    CHECK_ACL(aclrtDestroyEvent(start));
    CHECK_ACL(aclrtDestroyEvent(stop));
    CHECK_ACL(aclrtDestroyEvent(ready));
    CHECK_ACL(aclrtDestroyStream(s1));
    CHECK_ACL(aclrtDestroyStreamForce(s2));
    CHECK_ACL(aclrtFree(dev));
    CHECK_ACL(aclrtFreeHost(host));
    CHECK_ACL(aclrtFreeHost(back));
    CHECK_ACL(aclrtResetDevice(0)); /* set twice: two references */
    CHECK_ACL(aclrtResetDevice(0));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtResetDevice(0));
    CHECK_ACL(aclFinalize());
    INFO_LOG("run success!");
    return 0;
}
