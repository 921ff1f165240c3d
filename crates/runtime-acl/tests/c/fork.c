/*
 * fork() while other threads use ACL: the parent goes on with its devices, memory and
 * streams; the child starts with ACL uninitialised (its parent's runtime is not its own) and
 * can aclInit and use devices of its own. Repeated, with a thread busy in ACL calls, so that
 * a fork lands while that thread is inside the library's locks.
 * SPDX-License-Identifier: Apache-2.0
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

static atomic_int g_stop;
static atomic_int g_rounds;

static void *busy(void *arg)
{
    CHECK_ACL(aclrtSetCurrentContext((aclrtContext)arg));
    aclrtStream s;
    CHECK_ACL(aclrtCreateStream(&s));
    aclrtEvent e;
    CHECK_ACL(aclrtCreateEvent(&e));
    while (!atomic_load(&g_stop)) {
        void *p = NULL;
        CHECK_ACL(aclrtMalloc(&p, 4096, ACL_MEM_MALLOC_HUGE_FIRST));
        CHECK_ACL(aclrtMemsetAsync(p, 4096, 1, 4096, s));
        CHECK_ACL(aclrtRecordEvent(e, s));
        CHECK_ACL(aclrtSynchronizeEvent(e));
        CHECK_ACL(aclrtFree(p));
        atomic_fetch_add(&g_rounds, 1);
    }
    CHECK_ACL(aclrtDestroyEvent(e));
    CHECK_ACL(aclrtDestroyStream(s));
    return NULL;
}

static int child_main(void)
{
    void *p = NULL;
    aclError first = aclrtMalloc(&p, 64, ACL_MEM_MALLOC_HUGE_FIRST);
    if (first != ACL_ERROR_UNINITIALIZE) {
        fprintf(stderr, "child: aclrtMalloc before aclInit returned %d: %s\n", first, aclGetRecentErrMsg());
        return 10;
    }
    if (aclInit(NULL) != ACL_SUCCESS) return 11;
    if (aclrtSetDevice(0) != ACL_SUCCESS) return 12;
    unsigned char host[64], back[64];
    memset(host, 0x3C, sizeof host);
    if (aclrtMalloc(&p, 64, ACL_MEM_MALLOC_HUGE_FIRST) != ACL_SUCCESS) return 13;
    if (aclrtMemcpy(p, 64, host, 64, ACL_MEMCPY_HOST_TO_DEVICE) != ACL_SUCCESS) return 14;
    if (aclrtMemcpy(back, 64, p, 64, ACL_MEMCPY_DEVICE_TO_HOST) != ACL_SUCCESS) return 15;
    if (memcmp(host, back, sizeof back) != 0) return 16;
    if (aclrtFree(p) != ACL_SUCCESS) return 17;
    if (aclrtResetDevice(0) != ACL_SUCCESS) return 18;
    if (aclFinalize() != ACL_SUCCESS) return 19;
    return 0;
}

int main(void)
{
    CHECK_ACL(aclInit(NULL));
    CHECK_ACL(aclrtSetDevice(0));
    aclrtContext ctx;
    CHECK_ACL(aclrtGetCurrentContext(&ctx));
    pthread_t t;
    CHECK(pthread_create(&t, NULL, busy, ctx) == 0);
    void *keep = NULL;
    CHECK_ACL(aclrtMalloc(&keep, 1 << 16, ACL_MEM_MALLOC_HUGE_FIRST));
    /* Forks from here on land in steady state (the runtime's one-time setup, done at the first
     * submissions, is over), while the other thread is inside ACL calls. */
    while (atomic_load(&g_rounds) < 10) {
    }
    for (int i = 0; i < 20; i++) {
        fflush(stdout);
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            _exit(child_main());
        }
        int status = 0;
        CHECK(waitpid(pid, &status, 0) == pid);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            ERROR_LOG("child %d ended with status %d", i, status);
            return 1;
        }
        /* the parent's ACL is untouched */
        CHECK_ACL(aclrtMemset(keep, 1 << 16, i, 1 << 16));
    }
    atomic_store(&g_stop, 1);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_ACL(aclrtFree(keep));
    CHECK_ACL(aclrtResetDevice(0));
    CHECK_ACL(aclFinalize());
    INFO_LOG("run success!");
    return 0;
}
