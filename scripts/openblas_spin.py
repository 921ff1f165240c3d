"""Does numpy's OpenBLAS slow the runtime's next kernel? The runtime's matmul 1024^2 +
synchronize (median of 7) before any numpy matmul, right after one, and one second later.

    python scripts/openblas_spin.py                          # OpenBLAS's default
    OPENBLAS_THREAD_TIMEOUT=4 python scripts/openblas_spin.py  # what the bench sets

With the default, OpenBLAS's threads busy-spin for about 0.1 s after each call and the
runtime's matmul right after one takes about twice as long (BENCHMARKS.md, "Custom
operators").
"""

from __future__ import annotations

import time

import numpy as np

import runtime as rt


def main() -> None:
    rt.init()
    s = rt.Stream()
    m = 1024
    an = np.random.default_rng(1).random((m, m), dtype=np.float32)
    bn = np.random.default_rng(2).random((m, m), dtype=np.float32)
    cn = np.empty((m, m), np.float32)
    a, b, c = rt.to_device(an), rt.to_device(bn), rt.empty((m, m), "float32")

    def runtime_ms() -> float:
        t0 = time.perf_counter()
        rt.kernels.matmul(c, a, b, stream=s)
        s.synchronize()
        return (time.perf_counter() - t0) * 1e3

    def median_of_7() -> float:
        return sorted(runtime_ms() for _ in range(7))[3]

    runtime_ms()
    print(f"before any numpy matmul: {median_of_7():.1f} ms")
    np.matmul(an, bn, out=cn)
    print(f"right after one:         {median_of_7():.1f} ms")
    time.sleep(1)
    print(f"one second later:        {median_of_7():.1f} ms")


if __name__ == "__main__":
    main()
