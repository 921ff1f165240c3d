"""Where the blocks of a small multi-block launch ran: a C kernel that adds 2^16 float32 in
`block_dim` blocks and writes, for each block, its start and end time, its CPU and its
thread, launched + synchronized in a loop from this thread.

    python scripts/block_timeline.py [block_dim] [iterations]

It prints the median call, the share of calls in which the waiting thread sat on the CPU of
the thread that ran block 0 (after `synchronize` returned), the share in which one thread
ran every block, and the median call in each case; then numpy's `np.add` into a
preallocated output for scale. The kernel is compiled with `cc` into a temporary folder (no
compiler: a message and exit code 2).

Why: a launch of two blocks is fast only when the op's thread and the thread waiting in
`synchronize` run one block each on two cores. When the two share a core, the op's thread
runs both blocks while the waiter yields to it and the other core idles; this measures how
often that happens and what it costs, where a timed loop sees only the sum.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

import runtime as rt

SOURCE = r"""
#define _GNU_SOURCE
#include <sched.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>

/* params: out, a, b, n (int64), record (int64 buffer), call (int64) */
int32_t add_timed(uint32_t block, uint32_t blocks, void **params) {
    float *out = params[0];
    const float *a = params[1], *b = params[2];
    int64_t n = *(int64_t *)params[3], call = *(int64_t *)params[5];
    int64_t *rec = (int64_t *)params[4] + (call * blocks + block) * 4;
    int64_t lo = n * block / blocks, hi = n * (block + 1) / blocks;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int64_t i = lo; i < hi; i++) out[i] = a[i] + b[i];
    clock_gettime(CLOCK_MONOTONIC, &t1);
    rec[0] = t0.tv_sec * 1000000000LL + t0.tv_nsec;
    rec[1] = t1.tv_sec * 1000000000LL + t1.tv_nsec;
    rec[2] = sched_getcpu();
    rec[3] = (int64_t)syscall(SYS_gettid);
    return 0;
}
"""


def build(folder: str) -> str:
    src, lib = os.path.join(folder, "add_timed.c"), os.path.join(folder, "add_timed.so")
    with open(src, "w") as f:
        f.write(SOURCE)
    subprocess.run(["cc", "-O3", "-march=native", "-shared", "-fPIC", src, "-o", lib], check=True)
    return lib


def main() -> int:
    blocks = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    calls = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    if blocks < 2 or calls < 1:
        print("block_timeline: block_dim must be at least 2 and iterations at least 1")
        return 2
    if shutil.which("cc") is None:
        print("block_timeline: no C compiler (cc) on PATH")
        return 2
    n = 1 << 16
    with tempfile.TemporaryDirectory() as folder:
        kernel = rt.Kernel.load(build(folder), "add_timed", nargs=6, read_only=(1, 2))
        rt.init()
        rt.set_device(0)
        s = rt.Stream()
        a = np.ones(n, np.float32)
        da, db, out = rt.to_device(a), rt.to_device(a), rt.empty((n,), "float32")
        record = rt.empty((calls * blocks * 4,), "int64")
        cpu_of = ctypes.CDLL(None).sched_getcpu
        total, waiter_cpu = np.empty(calls), np.empty(calls, np.int64)
        starts = np.empty(calls, np.int64)
        for i in range(calls):
            t0 = time.perf_counter_ns()
            kernel(out, da, db, n, record, i, stream=s, block_dim=blocks)
            s.synchronize()
            t1 = time.perf_counter_ns()
            total[i], starts[i] = (t1 - t0) / 1e3, t0
            waiter_cpu[i] = cpu_of()
        r = record.copy_to_host().reshape(calls, blocks, 4)
        if not np.array_equal(out.copy_to_host(), a + a):
            print("block_timeline: the kernel's result differs from numpy")
            return 1
    me = threading.get_native_id()
    shared = waiter_cpu == r[:, 0, 2]
    one_thread = (r[:, :, 3] == r[:, :1, 3]).all(axis=1)
    waiter_ran = (r[:, :, 3] == me).any(axis=1)
    # Block 0 is the op's thread's first claim (helpers claim from the last block down).
    new_runner = r[1:, 0, 3] != r[:-1, 0, 3]
    moved = (r[1:, :, 2] != r[:-1, :, 2]).any(axis=1)
    # perf_counter_ns and the kernel's CLOCK_MONOTONIC are the same clock on Linux.
    first = (r[:, :, 0].min(axis=1) - starts) / 1e3
    last = (r[:, :, 1].max(axis=1) - starts) / 1e3
    block = (r[:, :, 1] - r[:, :, 0]).ravel() / 1e3

    def med(x):
        return f"{np.median(x):.1f}" if len(x) else "-"

    b, c = np.ones(n, np.float32), np.empty(n, np.float32)
    t = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        np.add(a, b, out=c)
        t.append((time.perf_counter_ns() - t0) / 1e3)
    print(f"{calls} calls of a {blocks}-block add of 2^16 float32 + synchronize")
    print(f"  median call {med(total)} us, mean {total.mean():.1f} us")
    print(
        f"  waiter on block 0's CPU: {shared.mean():.1%} of calls "
        f"(median {med(total[shared])} us, others {med(total[~shared])} us)"
    )
    print(f"  one thread ran every block: {one_thread.mean():.1%} of calls")
    print(f"  the waiting thread ran a block: {waiter_ran.mean():.1%} of calls")
    print(f"  block 0 on another thread than in the call before: {new_runner.mean():.1%} of calls")
    print(f"  a block ran on another CPU than in the call before: {moved.mean():.1%} of calls")
    print(
        f"  medians: first block starts {med(first)} us into the call, last ends at "
        f"{med(last)} us; a block takes {med(block)} us"
    )
    print(f"  np.add(a, b, out=c): median {med(np.array(t))} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
