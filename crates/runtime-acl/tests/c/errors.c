/*
 * Every error path of the runtime API: calls before aclInit, repeated init and finalize,
 * NULL and bad arguments, stale and wrong-kind handles, bogus pointers to aclrtFree and
 * aclrtMemcpy (an error, never a crash or a write into another allocation), and the
 * per-thread error message and last-error code.
 * SPDX-License-Identifier: Apache-2.0
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"

static const char *g_other_msg = "unset";

static void *other_thread(void *arg)
{
    (void)arg;
    /* a thread with no current context; its message is its own */
    void *p = NULL;
    aclError ret = aclrtMalloc(&p, 64, ACL_MEM_MALLOC_HUGE_FIRST);
    g_other_msg = (ret == ACL_ERROR_RT_CONTEXT_NULL && aclGetRecentErrMsg() != NULL) ? "ok" : "bad";
    return NULL;
}

int main(void)
{
    void *p = NULL;
    aclrtStream s = NULL;
    aclrtEvent e = NULL;
    aclrtContext c = NULL;
    int32_t dev = 0;
    uint32_t count = 0;

    /* ---- before aclInit ---- */
    CHECK(aclGetRecentErrMsg() == NULL);
    EXPECT_ERR(ACL_ERROR_UNINITIALIZE, aclFinalize());
    EXPECT_ERR(ACL_ERROR_UNINITIALIZE, aclrtSetDevice(0));
    EXPECT_ERR(ACL_ERROR_UNINITIALIZE, aclrtMalloc(&p, 64, ACL_MEM_MALLOC_HUGE_FIRST));
    EXPECT_ERR(ACL_ERROR_UNINITIALIZE, aclrtCreateStream(&s));
    EXPECT_ERR(ACL_ERROR_UNINITIALIZE, aclrtGetDeviceCount(&count));
    EXPECT_ERR(ACL_ERROR_UNINITIALIZE, aclrtMallocHost(&p, 64));
    CHECK(aclrtGetSocName() == NULL);
    aclGetRecentErrMsg();
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtGetRunMode(NULL));

    /* ---- init ---- */
    EXPECT_ERR(ACL_ERROR_INVALID_FILE, aclInit("/no/such/acl.json"));
    char path[] = "/tmp/runtime-acl-test-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    CHECK(write(fd, "[1, 2]", 6) == 6);
    close(fd);
    EXPECT_ERR(ACL_ERROR_PARSE_FILE, aclInit(path));
    fd = open(path, O_WRONLY | O_TRUNC);
    CHECK(fd >= 0);
    CHECK(write(fd, "{\"dump\": {}}", 12) == 12);
    close(fd);
    CHECK_ACL(aclInit(path));
    unlink(path);
    EXPECT_ERR(ACL_ERROR_REPEAT_INITIALIZE, aclInit(NULL));
    CHECK(strcmp(aclrtGetSocName(), "Ascend910") == 0);

    /* ---- devices and contexts ---- */
    CHECK_ACL(aclrtGetDeviceCount(&count));
    EXPECT_ERR(ACL_ERROR_RT_CONTEXT_NULL, aclrtGetDevice(&dev));
    EXPECT_ERR(ACL_ERROR_RT_CONTEXT_NULL, aclrtCreateStream(&s));
    EXPECT_ERR(ACL_ERROR_RT_INVALID_DEVICEID, aclrtSetDevice((int32_t)count));
    EXPECT_ERR(ACL_ERROR_RT_INVALID_DEVICEID, aclrtSetDevice(-1));
    EXPECT_ERR(ACL_ERROR_RT_INVALID_DEVICEID, aclrtCreateContext(&c, (int32_t)count));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtResetDevice(0)); /* never set */
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtGetDeviceCount(NULL));
    CHECK_ACL(aclrtSetDevice(0));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtGetDevice(NULL));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtCreateContext(NULL, 0));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtGetCurrentContext(NULL));
    aclrtContext def = NULL;
    CHECK_ACL(aclrtGetCurrentContext(&def));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtDestroyContext(def)); /* the default context */
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtDestroyContext(NULL));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtSetCurrentContext(NULL));
    CHECK_ACL(aclrtCreateContext(&c, 0));
    CHECK_ACL(aclrtDestroyContext(c));
    EXPECT_ERR(ACL_ERROR_INVALID_RESOURCE_HANDLE, aclrtDestroyContext(c)); /* stale */
    EXPECT_ERR(ACL_ERROR_INVALID_RESOURCE_HANDLE, aclrtSetCurrentContext(c));
    EXPECT_ERR(ACL_ERROR_INVALID_RESOURCE_HANDLE, aclrtSetCurrentContext((aclrtContext)0x1234));
    CHECK_ACL(aclrtSetCurrentContext(def));

    /* ---- streams and events: NULL, stale, wrong kind ---- */
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtCreateStream(NULL));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtCreateEvent(NULL));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtDestroyStream(NULL));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtCreateEventWithFlag(&e, 0x1000));
    CHECK_ACL(aclrtCreateStream(&s));
    CHECK_ACL(aclrtCreateEvent(&e));
    EXPECT_ERR(ACL_ERROR_INVALID_RESOURCE_HANDLE, aclrtSynchronizeStream((aclrtStream)e));
    EXPECT_ERR(ACL_ERROR_INVALID_RESOURCE_HANDLE, aclrtRecordEvent((aclrtEvent)s, s));
    EXPECT_ERR(ACL_ERROR_INVALID_RESOURCE_HANDLE, aclrtDestroyEvent((aclrtEvent)s));
    CHECK_ACL(aclrtSynchronizeStream(s)); /* still alive after the wrong-kind calls */
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtSynchronizeStreamWithTimeout(s, 0));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtSynchronizeEventWithTimeout(e, -5));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtQueryEventStatus(e, NULL));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtEventElapsedTime(NULL, e, e));
    float ms = 0;
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtEventElapsedTime(&ms, e, e)); /* never recorded */
    CHECK_ACL(aclrtDestroyEvent(e));
    EXPECT_ERR(ACL_ERROR_INVALID_RESOURCE_HANDLE, aclrtRecordEvent(e, s));
    EXPECT_ERR(ACL_ERROR_INVALID_RESOURCE_HANDLE, aclrtSynchronizeEvent(e));
    EXPECT_ERR(ACL_ERROR_INVALID_RESOURCE_HANDLE, aclrtStreamWaitEvent(s, e));
    EXPECT_ERR(ACL_ERROR_INVALID_RESOURCE_HANDLE, aclrtDestroyEvent(e));
    CHECK_ACL(aclrtDestroyStream(s));
    EXPECT_ERR(ACL_ERROR_INVALID_RESOURCE_HANDLE, aclrtSynchronizeStream(s));
    EXPECT_ERR(ACL_ERROR_INVALID_RESOURCE_HANDLE, aclrtDestroyStream(s));
    EXPECT_ERR(ACL_ERROR_INVALID_RESOURCE_HANDLE, aclrtMemsetAsync(p, 1, 0, 1, s));
    EXPECT_ERR(ACL_ERROR_INVALID_RESOURCE_HANDLE, aclrtSynchronizeStream((aclrtStream)0xDEAD0));

    /* ---- memory: sizes, bogus pointers ---- */
    void *d = NULL, *d2 = NULL, *h = NULL;
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtMalloc(NULL, 64, ACL_MEM_MALLOC_HUGE_FIRST));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtMalloc(&d, 0, ACL_MEM_MALLOC_HUGE_FIRST));
    EXPECT_ERR(ACL_ERROR_BAD_ALLOC, aclrtMalloc(&d, (size_t)1 << 62, ACL_MEM_MALLOC_HUGE_FIRST));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtMallocHost(&h, 0));
    CHECK_ACL(aclrtMalloc(&d, 64, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK_ACL(aclrtMalloc(&d2, 64, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK_ACL(aclrtMallocHost(&h, 64));
    CHECK_ACL(aclrtMemset(d, 64, 0, 64));
    CHECK_ACL(aclrtMemset(d2, 64, 0x77, 64));
    unsigned char src[256], out[64];
    memset(src, 0xEE, sizeof src);

    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtFree(NULL));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtFree((char *)d + 16)); /* inside, not the start */
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtFree(src));             /* stack memory */
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtFree((void *)0x10));    /* unmapped */
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtFree(h));               /* host memory */
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtFreeHost(d));           /* device memory */
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtFreeHost((char *)h + 1));

    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtMemcpy(d, 64, src, 64, (aclrtMemcpyKind)9));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtMemcpy(d, 64, src, 64, (aclrtMemcpyKind)-1));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtMemcpy(d, 32, src, 64, ACL_MEMCPY_HOST_TO_DEVICE));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtMemcpy(d, 128, src, 128, ACL_MEMCPY_HOST_TO_DEVICE));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtMemcpy((char *)d + 60, 8, src, 8, ACL_MEMCPY_HOST_TO_DEVICE));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtMemcpy(NULL, 64, src, 64, ACL_MEMCPY_HOST_TO_DEVICE));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtMemcpy(d, 64, NULL, 64, ACL_MEMCPY_HOST_TO_DEVICE));
    /* device memory outside every live allocation (the device mapping around d2) */
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtMemcpy((char *)d2 + 4096, 64, src, 64, ACL_MEMCPY_HOST_TO_DEVICE));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtMemcpy(out, 64, (char *)d2 + 4096, 64, ACL_MEMCPY_DEVICE_TO_HOST));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtMemcpy((char *)d2 + 4096, 64, src, 64, ACL_MEMCPY_HOST_TO_HOST));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtMemcpy(d, 64, h, 65, ACL_MEMCPY_HOST_TO_DEVICE)); /* past the host block */
    /* host ranges that run into a device allocation, unmapped and read-only host memory */
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtMemcpy(d, 64, (char *)d2 - 8, 16, ACL_MEMCPY_DEFAULT));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtMemcpy(d, 64, (void *)0x10, 64, ACL_MEMCPY_HOST_TO_DEVICE));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtMemcpy((void *)0x10, 64, d, 64, ACL_MEMCPY_DEVICE_TO_HOST));
    void *ro = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(ro != MAP_FAILED);
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtMemcpy(ro, 64, d, 64, ACL_MEMCPY_DEVICE_TO_HOST));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtMemcpy(ro, 64, src, 64, ACL_MEMCPY_HOST_TO_HOST));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtMemset(ro, 64, 1, 64));
    munmap(ro, 4096);
    /* nothing above wrote anything: d is still zero, d2 still 0x77 */
    CHECK_ACL(aclrtMemcpy(out, 64, d, 64, ACL_MEMCPY_DEVICE_TO_HOST));
    for (int i = 0; i < 64; i++) CHECK(out[i] == 0);
    CHECK_ACL(aclrtMemcpy(out, 64, d2, 64, ACL_MEMCPY_DEVICE_TO_HOST));
    for (int i = 0; i < 64; i++) CHECK(out[i] == 0x77);

    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtMemset(d, 32, 1, 64)); /* count > maxCount */
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtMemset(d, 65, 1, 65)); /* past the end */
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtMemset((char *)d + 4096 * 1024, 4, 1, 4));
    EXPECT_ERR(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, aclrtMemcpyAsync(out, 64, src, 64, ACL_MEMCPY_HOST_TO_HOST, NULL));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtGetMemInfo((aclrtMemAttr)18, (size_t *)out, (size_t *)out));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtGetMemInfo(ACL_HBM_MEM, NULL, (size_t *)out));

    /* use after free: the pointer is refused whatever the kind says, nothing is written */
    CHECK_ACL(aclrtFree(d));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtFree(d));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtMemcpy(d, 64, src, 64, ACL_MEMCPY_HOST_TO_DEVICE));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtMemcpy(d, 64, src, 64, ACL_MEMCPY_HOST_TO_HOST));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtMemcpy(out, 64, d, 64, ACL_MEMCPY_DEFAULT));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtMemset(d, 64, 1, 64));
    /* a kind that names the wrong side: the direction follows the addresses */
    CHECK_ACL(aclrtMemcpy(out, 64, d2, 64, ACL_MEMCPY_HOST_TO_HOST));
    for (int i = 0; i < 64; i++) CHECK(out[i] == 0x77);
    CHECK_ACL(aclrtFreeHost(h));
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtFreeHost(h));

    /* ---- callbacks ---- */
    EXPECT_ERR(ACL_ERROR_RT_THREAD_SUBSCRIBE, aclrtProcessReport(10));
    EXPECT_ERR(ACL_ERROR_RT_STREAM_NO_CB_REG, aclrtUnSubscribeReport((uint64_t)pthread_self(), NULL));

    /* ---- messages and last errors are per thread ---- */
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtFree(NULL));
    CHECK(aclGetRecentErrMsg() == NULL); /* read once */
    EXPECT_ERR(ACL_ERROR_INVALID_PARAM, aclrtFree(NULL));
    CHECK(aclrtPeekAtLastError(ACL_RT_THREAD_LEVEL) == ACL_ERROR_INVALID_PARAM);
    CHECK(aclrtGetLastError(ACL_RT_THREAD_LEVEL) == ACL_ERROR_INVALID_PARAM);
    CHECK(aclrtGetLastError(ACL_RT_THREAD_LEVEL) == ACL_SUCCESS);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, other_thread, NULL) == 0);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK(strcmp(g_other_msg, "ok") == 0);
    CHECK(aclGetRecentErrMsg() == NULL); /* the other thread's failure is not this thread's */

    CHECK_ACL(aclrtFree(d2));
    CHECK_ACL(aclrtResetDevice(0));
    CHECK_ACL(aclFinalize());
    EXPECT_ERR(ACL_ERROR_REPEAT_FINALIZE, aclFinalize());
    EXPECT_ERR(ACL_ERROR_UNINITIALIZE, aclrtSetDevice(0));
    /* and again: init after finalize works */
    CHECK_ACL(aclInit(NULL));
    CHECK_ACL(aclFinalize());
    INFO_LOG("run success!");
    return 0;
}
