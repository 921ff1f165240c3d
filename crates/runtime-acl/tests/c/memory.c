/*
 * Memory round trips, in the style of the ACL memory-management samples: device and host
 * allocations, synchronous copies of every kind, offsets inside allocations, memsets, plain
 * malloc'd host memory, and the device memory information before and after.
 * SPDX-License-Identifier: Apache-2.0
 */
#include "check.h"

#define SIZE (1u << 20)

static int all_equal(const unsigned char *p, size_t n, unsigned char v)
{
    for (size_t i = 0; i < n; i++) {
        if (p[i] != v) {
            return 0;
        }
    }
    return 1;
}

int main(void)
{
    aclrtRunMode mode;
    CHECK_ACL(aclrtGetRunMode(&mode)); /* before aclInit, as the samples do */
    CHECK(mode == ACL_HOST);
    CHECK_ACL(aclInit(NULL));
    CHECK_ACL(aclrtSetDevice(0));
    aclrtContext ctx = NULL;
    CHECK_ACL(aclrtCreateContext(&ctx, 0));
    aclrtContext cur = NULL;
    CHECK_ACL(aclrtGetCurrentContext(&cur));
    CHECK(cur == ctx);
    int32_t dev = -1;
    CHECK_ACL(aclrtGetDevice(&dev));
    CHECK(dev == 0);
    uint32_t count = 0;
    CHECK_ACL(aclrtGetDeviceCount(&count));
    CHECK(count >= 1);

    size_t free0 = 0, total = 0, free1 = 0, ddr_free = 1, ddr_total = 1;
    CHECK_ACL(aclrtGetMemInfo(ACL_HBM_MEM, &free0, &total));
    CHECK(free0 > 0 && free0 <= total);
    CHECK_ACL(aclrtGetMemInfo(ACL_DDR_MEM, &ddr_free, &ddr_total));
    CHECK(ddr_free == 0 && ddr_total == 0);

    void *host = NULL, *back = NULL, *dev_a = NULL, *dev_b = NULL;
    CHECK_ACL(aclrtMallocHost(&host, SIZE));
    CHECK_ACL(aclrtMallocHost(&back, SIZE));
    CHECK_ACL(aclrtMalloc(&dev_a, SIZE, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK_ACL(aclrtMalloc(&dev_b, SIZE, ACL_MEM_MALLOC_NORMAL_ONLY));
    CHECK(((uintptr_t)dev_a % 64) == 0 && ((uintptr_t)dev_b % 64) == 0);
    CHECK_ACL(aclrtGetMemInfo(ACL_HBM_MEM, &free1, &total));
    CHECK(free1 <= free0 - 2 * SIZE);
    INFO_LOG("HBM free %zu of %zu bytes after two 1 MiB allocations (was %zu)", free1, total, free0);

    /* host -> device -> device -> host, every byte checked */
    unsigned char *h = (unsigned char *)host;
    for (size_t i = 0; i < SIZE; i++) {
        h[i] = (unsigned char)(i * 7 + 3);
    }
    CHECK_ACL(aclrtMemcpy(dev_a, SIZE, host, SIZE, ACL_MEMCPY_HOST_TO_DEVICE));
    CHECK_ACL(aclrtMemcpy(dev_b, SIZE, dev_a, SIZE, ACL_MEMCPY_DEVICE_TO_DEVICE));
    CHECK_ACL(aclrtMemcpy(back, SIZE, dev_b, SIZE, ACL_MEMCPY_DEVICE_TO_HOST));
    CHECK(memcmp(host, back, SIZE) == 0);

    /* memset on device memory, then offsets inside the allocations */
    CHECK_ACL(aclrtMemset(dev_a, SIZE, 0, SIZE));
    CHECK_ACL(aclrtMemset(host, SIZE, 9, 64));
    CHECK_ACL(aclrtMemcpy((char *)dev_a + 4096, SIZE - 4096, (char *)host + 8, 16,
                          ACL_MEMCPY_HOST_TO_DEVICE));
    CHECK_ACL(aclrtMemcpy(back, SIZE, dev_a, SIZE, ACL_MEMCPY_DEVICE_TO_HOST));
    const unsigned char *b = (const unsigned char *)back;
    CHECK(all_equal(b, 4096, 0) && all_equal(b + 4096, 16, 9) && all_equal(b + 4112, SIZE - 4112, 0));

    /* host to host between aclrtMallocHost blocks, and ACL_MEMCPY_DEFAULT (from the addresses) */
    CHECK_ACL(aclrtMemset(host, SIZE, 0x5A, SIZE));
    CHECK_ACL(aclrtMemcpy(back, SIZE, host, SIZE, ACL_MEMCPY_HOST_TO_HOST));
    CHECK(all_equal(b, SIZE, 0x5A));
    CHECK_ACL(aclrtMemcpy(dev_b, SIZE, host, SIZE, ACL_MEMCPY_DEFAULT));
    CHECK_ACL(aclrtMemset(back, SIZE, 0, SIZE));
    CHECK_ACL(aclrtMemcpy(back, SIZE, dev_b, SIZE, ACL_MEMCPY_DEFAULT));
    CHECK(all_equal(b, SIZE, 0x5A));

    /* plain malloc'd host memory (not ACL's) works both ways */
    unsigned char *plain = (unsigned char *)malloc(SIZE);
    unsigned char stack_buf[256];
    CHECK(plain != NULL);
    memset(plain, 0x11, SIZE);
    CHECK_ACL(aclrtMemcpy(dev_a, SIZE, plain, SIZE, ACL_MEMCPY_HOST_TO_DEVICE));
    memset(plain, 0, SIZE);
    CHECK_ACL(aclrtMemcpy(plain, SIZE, dev_a, SIZE, ACL_MEMCPY_DEVICE_TO_HOST));
    CHECK(all_equal(plain, SIZE, 0x11));
    CHECK_ACL(aclrtMemset(stack_buf, sizeof stack_buf, 0x22, sizeof stack_buf));
    CHECK(all_equal(stack_buf, sizeof stack_buf, 0x22));
    CHECK_ACL(aclrtMemcpy(plain, SIZE, stack_buf, sizeof stack_buf, ACL_MEMCPY_HOST_TO_HOST));
    CHECK(all_equal(plain, sizeof stack_buf, 0x22) && plain[sizeof stack_buf] == 0x11);
    free(plain);

    /* aclrtMallocAlign32 and a zero-byte copy */
    void *aligned = NULL;
    CHECK_ACL(aclrtMallocAlign32(&aligned, 100, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK_ACL(aclrtMemcpy(aligned, 100, host, 0, ACL_MEMCPY_HOST_TO_DEVICE));
    CHECK_ACL(aclrtFree(aligned));

    CHECK_ACL(aclrtFree(dev_a));
    CHECK_ACL(aclrtFree(dev_b));
    CHECK_ACL(aclrtFreeHost(host));
    CHECK_ACL(aclrtFreeHost(back));
    size_t free2 = 0;
    CHECK_ACL(aclrtGetMemInfo(ACL_HBM_MEM, &free2, &total));
    CHECK(free2 == free0);
    INFO_LOG("HBM free %zu of %zu bytes after the frees", free2, total);

    CHECK_ACL(aclrtDestroyContext(ctx));
    CHECK_ACL(aclrtResetDevice(0));
    CHECK_ACL(aclFinalize());
    INFO_LOG("run success!");
    return 0;
}
