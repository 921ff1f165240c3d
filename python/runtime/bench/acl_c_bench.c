/*
 * The C-ABI cost of the ACL runtime calls (libascendcl.so): run by runtime.bench.acl_c, which
 * compiles it against the installed library and interleaves its rounds with the same
 * operations from Python. Usage: acl_c_bench ROUNDS BATCH. Prints one line per operation and
 * round: "<op> <ns per call>".
 * SPDX-License-Identifier: Apache-2.0
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "acl/acl.h"

#define MIB (1u << 20)
#define CHECK(call)                                                                  \
    do {                                                                             \
        aclError r_ = (call);                                                        \
        if (r_ != ACL_SUCCESS) {                                                     \
            fprintf(stderr, "%s: %d %s\n", #call, r_, aclGetRecentErrMsg());         \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static atomic_int g_stop;
static atomic_int g_ready;

static void *report_loop(void *arg)
{
    CHECK(aclrtSetCurrentContext((aclrtContext)arg));
    while (!atomic_load(&g_ready)) {
    }
    while (!atomic_load(&g_stop)) {
        aclError r = aclrtProcessReport(50);
        if (r != ACL_SUCCESS && r != ACL_ERROR_RT_REPORT_TIMEOUT) {
            fprintf(stderr, "aclrtProcessReport: %d\n", r);
            exit(1);
        }
    }
    return NULL;
}

static void count_cb(void *user) { (*(int *)user)++; }

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 5;
    int batch = argc > 2 ? atoi(argv[2]) : 200;
    CHECK(aclInit(NULL));
    CHECK(aclrtSetDevice(0));
    aclrtContext ctx;
    CHECK(aclrtGetCurrentContext(&ctx));
    aclrtStream s;
    CHECK(aclrtCreateStream(&s));
    aclrtEvent ev;
    CHECK(aclrtCreateEvent(&ev));
    void *host, *dev;
    CHECK(aclrtMallocHost(&host, MIB));
    CHECK(aclrtMalloc(&dev, MIB, ACL_MEM_MALLOC_HUGE_FIRST));
    aclrtStream *made = malloc(sizeof(aclrtStream) * (size_t)batch);
    pthread_t reporter;
    if (pthread_create(&reporter, NULL, report_loop, ctx) != 0) return 1;
    CHECK(aclrtSubscribeReport((uint64_t)reporter, s));
    atomic_store(&g_ready, 1);
    int calls = 0;

    /* Round -1 warms up (first calls: lazy setup, page faults, caches) and is not printed. */
    for (int r = -1; r < rounds; r++) {
        double t0 = now_ns();
        for (int i = 0; i < batch; i++) {
            void *p;
            CHECK(aclrtMalloc(&p, MIB, ACL_MEM_MALLOC_HUGE_FIRST));
            CHECK(aclrtFree(p));
        }
        if (r >= 0) printf("malloc_free_1MiB %.1f\n", (now_ns() - t0) / batch);

        t0 = now_ns();
        for (int i = 0; i < batch; i++) CHECK(aclrtCreateStream(&made[i]));
        if (r >= 0) printf("create_stream %.1f\n", (now_ns() - t0) / batch);
        for (int i = 0; i < batch; i++) CHECK(aclrtDestroyStream(made[i]));

        t0 = now_ns();
        for (int i = 0; i < batch; i++) CHECK(aclrtRecordEvent(ev, s));
        if (r >= 0) printf("record_event %.1f\n", (now_ns() - t0) / batch);
        CHECK(aclrtSynchronizeStream(s));

        int n = batch / 10 > 0 ? batch / 10 : 1;
        t0 = now_ns();
        for (int i = 0; i < n; i++) {
            CHECK(aclrtMemcpyAsync(dev, MIB, host, MIB, ACL_MEMCPY_HOST_TO_DEVICE, s));
            CHECK(aclrtSynchronizeStream(s));
        }
        if (r >= 0) printf("memcpy_async_1MiB_sync %.1f\n", (now_ns() - t0) / n);

        t0 = now_ns();
        for (int i = 0; i < n; i++) {
            CHECK(aclrtLaunchCallback(count_cb, &calls, ACL_CALLBACK_BLOCK, s));
            CHECK(aclrtSynchronizeStream(s));
        }
        if (r >= 0) printf("callback_round_trip %.1f\n", (now_ns() - t0) / n);
        fflush(stdout);
    }
    if (calls != (rounds + 1) * (batch / 10 > 0 ? batch / 10 : 1)) {
        fprintf(stderr, "callbacks ran %d times\n", calls);
        return 1;
    }
    atomic_store(&g_stop, 1);
    pthread_join(reporter, NULL);
    CHECK(aclrtUnSubscribeReport((uint64_t)reporter, s));
    CHECK(aclrtFree(dev));
    CHECK(aclrtFreeHost(host));
    CHECK(aclrtDestroyEvent(ev));
    CHECK(aclrtDestroyStream(s));
    CHECK(aclrtResetDevice(0));
    CHECK(aclFinalize());
    free(made);
    return 0;
}
