"""A fixed workload for comparing two builds: launches, a small kernel, 1 MiB copies and
allocations, each timed over many calls; prints one "row<TAB>microseconds per call" line per row.

    python scripts/before_after.py [all|launch|copy|alloc] [calls]

Install the two builds in two virtualenvs and run this script from each in turn, alternating,
several rounds (BENCHMARKS.md "Before and after the sound-core rework" gives the medians).
"""

import sys
import time

import numpy as np

import runtime

which = sys.argv[1] if len(sys.argv) > 1 else "all"
n = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
runtime.init()
s = runtime.Stream()
noop = runtime.kernels.noop
buf = runtime.device_malloc(0, 1 << 20)
host = np.ones(1 << 20, np.uint8)
out = np.empty_like(host)
a = runtime.to_device(np.ones(1 << 16, np.float32))
b = runtime.to_device(np.ones(1 << 16, np.float32))
c = runtime.empty((1 << 16,), np.float32)
rows: dict[str, float] = {}


def timeit(name, f, reps):
    f()  # warm
    t = time.perf_counter()
    for _ in range(reps):
        f()
    rows[name] = (time.perf_counter() - t) / reps * 1e6


def launches():
    for _ in range(100):
        s.launch_kernel(noop, ())
    s.synchronize()


def add():
    s.launch_kernel(runtime.kernels.add, (c, a, b))
    s.synchronize()


if which in ("all", "launch"):
    timeit("launch x100 + sync", launches, max(n // 100, 1))
    timeit("add 2^16 + sync", add, n)
if which in ("all", "copy"):
    timeit("H2D 1 MiB", lambda: runtime.memcpy_host_to_device(buf, host), n)
    timeit("D2H 1 MiB", lambda: runtime.memcpy_device_to_host(out, buf), n)
if which in ("all", "alloc"):
    timeit("alloc+free 1 MiB", lambda: runtime.device_free(runtime.device_malloc(0, 1 << 20)), n)
    timeit("alloc+free 4 KiB", lambda: runtime.device_free(runtime.device_malloc(0, 4096)), n)
for k, v in rows.items():
    print(f"{k}\t{v:.3f}")
