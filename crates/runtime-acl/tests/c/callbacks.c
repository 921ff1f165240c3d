/*
 * Host callbacks with a report thread, in the style of the ACL callback samples: a thread
 * subscribes to a stream and loops on aclrtProcessReport; blocking and non-blocking callbacks
 * run in that thread, and a blocking callback holds back the stream's later work until it
 * returned.
 * SPDX-License-Identifier: Apache-2.0
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "check.h"

static atomic_int g_stop;
static atomic_int g_subscribed;
static atomic_int g_ran;
static pthread_t g_report_thread;
static atomic_int g_wrong_thread;
static aclrtContext g_ctx;

static void *report_loop(void *arg)
{
    (void)arg;
    CHECK_ACL(aclrtSetCurrentContext(g_ctx));
    while (!atomic_load(&g_subscribed)) {
        struct timespec t = {0, 1000000};
        nanosleep(&t, NULL);
    }
    while (!atomic_load(&g_stop)) {
        aclError ret = aclrtProcessReport(100);
        if (ret != ACL_SUCCESS && ret != ACL_ERROR_RT_REPORT_TIMEOUT) {
            ERROR_LOG("aclrtProcessReport failed with %d: %s", ret, aclGetRecentErrMsg());
            exit(1);
        }
    }
    return NULL;
}

struct blocking_arg {
    void *host; /* an aclrtMallocHost block the callback writes */
    size_t size;
};

static void blocking_cb(void *user)
{
    struct blocking_arg *a = (struct blocking_arg *)user;
    if (!pthread_equal(pthread_self(), g_report_thread)) {
        atomic_store(&g_wrong_thread, 1);
    }
    /* The stream's copy after this callback must see these bytes. */
    memset(a->host, 0x42, a->size);
    atomic_fetch_add(&g_ran, 1);
}

static void counting_cb(void *user)
{
    if (!pthread_equal(pthread_self(), g_report_thread)) {
        atomic_store(&g_wrong_thread, 1);
    }
    atomic_fetch_add(&g_ran, *(int *)user);
}

int main(void)
{
    CHECK_ACL(aclInit(NULL));
    CHECK_ACL(aclrtSetDevice(0));
    CHECK_ACL(aclrtGetCurrentContext(&g_ctx));
    aclrtStream stream = NULL;
    CHECK_ACL(aclrtCreateStream(&stream));
    CHECK(pthread_create(&g_report_thread, NULL, report_loop, NULL) == 0);
    EXPECT_ERR(ACL_ERROR_RT_STREAM_NO_CB_REG, aclrtLaunchCallback(counting_cb, NULL, ACL_CALLBACK_NO_BLOCK, stream));
    CHECK_ACL(aclrtSubscribeReport((uint64_t)g_report_thread, stream));
    atomic_store(&g_subscribed, 1);
    EXPECT_ERR(ACL_ERROR_REPEAT_SUBSCRIBE, aclrtSubscribeReport((uint64_t)g_report_thread, stream));

    size_t size = 1u << 16;
    void *host = NULL, *dev = NULL, *back = NULL;
    CHECK_ACL(aclrtMallocHost(&host, size));
    CHECK_ACL(aclrtMallocHost(&back, size));
    CHECK_ACL(aclrtMalloc(&dev, size, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK_ACL(aclrtMemset(host, size, 0, size));

    /* blocking callback, then a copy of the bytes it wrote: the stream waited for it */
    struct blocking_arg arg = {host, size};
    int one = 1, ten = 10;
    for (int round = 0; round < 20; round++) {
        CHECK_ACL(aclrtLaunchCallback(blocking_cb, &arg, ACL_CALLBACK_BLOCK, stream));
        CHECK_ACL(aclrtMemcpyAsync(dev, size, host, size, ACL_MEMCPY_HOST_TO_DEVICE, stream));
        CHECK_ACL(aclrtMemcpyAsync(back, size, dev, size, ACL_MEMCPY_DEVICE_TO_HOST, stream));
        CHECK_ACL(aclrtLaunchCallback(counting_cb, &ten, ACL_CALLBACK_NO_BLOCK, stream));
        CHECK_ACL(aclrtSynchronizeStream(stream));
        CHECK(((unsigned char *)back)[0] == 0x42 && ((unsigned char *)back)[size - 1] == 0x42);
        memset(host, 0, size);
        memset(back, 0, size);
    }
    /* the NULL (default) stream has no subscriber */
    EXPECT_ERR(ACL_ERROR_RT_STREAM_NO_CB_REG, aclrtLaunchCallback(counting_cb, &one, ACL_CALLBACK_BLOCK, NULL));
    /* the non-blocking callbacks run when their thread gets to them */
    for (int i = 0; i < 5000 && atomic_load(&g_ran) < 20 * 11; i++) {
        struct timespec t = {0, 1000000};
        nanosleep(&t, NULL);
    }
    CHECK(atomic_load(&g_ran) == 20 * 11);
    CHECK(!atomic_load(&g_wrong_thread));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtLaunchCallback(counting_cb, &one, (aclrtCallbackBlockType)2, stream));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtLaunchCallback(NULL, &one, ACL_CALLBACK_BLOCK, stream));
    /* this thread serves no stream */
    EXPECT_ERR(ACL_ERROR_RT_THREAD_SUBSCRIBE, aclrtProcessReport(10));

    atomic_store(&g_stop, 1);
    CHECK(pthread_join(g_report_thread, NULL) == 0);
    CHECK_ACL(aclrtUnSubscribeReport((uint64_t)g_report_thread, stream));
    EXPECT_ERR(ACL_ERROR_RT_STREAM_NO_CB_REG, aclrtUnSubscribeReport((uint64_t)g_report_thread, stream));

    /* a thread that serves itself: subscribe, launch, then process on the same thread */
    CHECK_ACL(aclrtSubscribeReport((uint64_t)pthread_self(), stream));
    EXPECT_ERR(ACL_ERROR_RT_REPORT_TIMEOUT, aclrtProcessReport(10));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtProcessReport(0));
    g_report_thread = pthread_self();
    int before = atomic_load(&g_ran);
    CHECK_ACL(aclrtLaunchCallback(counting_cb, &one, ACL_CALLBACK_NO_BLOCK, stream));
    CHECK_ACL(aclrtSynchronizeStream(stream));
    CHECK_ACL(aclrtProcessReport(1000));
    CHECK(atomic_load(&g_ran) == before + 1);
    CHECK_ACL(aclrtUnSubscribeReport((uint64_t)pthread_self(), stream));

    CHECK_ACL(aclrtFree(dev));
    CHECK_ACL(aclrtFreeHost(host));
    CHECK_ACL(aclrtFreeHost(back));
    CHECK_ACL(aclrtDestroyStream(stream));
    CHECK_ACL(aclrtResetDevice(0));
    CHECK_ACL(aclFinalize());
    INFO_LOG("run success!");
    return 0;
}
