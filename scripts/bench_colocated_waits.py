"""Launch / replay + synchronize round trips on two cores with a third busy thread.

The regime behind the 27 us round trips measured while numpy's OpenBLAS thread (or torch's
OpenMP threads, or PoCL's) still spin after a call: one of the runtime's threads then
shares a core with the thread it waits for. Runs the three loops ``rounds`` times and
prints median / p90 in microseconds; with ``--busy N`` it starts N busy-looping processes
first (the loaded-machine case).

    python scripts/bench_colocated_waits.py [--rounds 4] [--busy 0]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import runtime as rt


def med_p90(f, n: int) -> tuple[float, float]:
    v = []
    for _ in range(n):
        t = time.perf_counter_ns()
        f()
        v.append(time.perf_counter_ns() - t)
    v.sort()
    return v[n // 2] / 1e3, v[int(n * 0.9)] / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--busy", type=int, default=0, help="busy-looping processes to start")
    a = ap.parse_args()
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.busy)]
    try:
        rt.init()
        s = rt.Stream(0)
        s.begin_capture()
        for _ in range(100):
            s.launch_kernel(rt.kernels.noop)
        g = s.end_capture()

        def replay():
            g.launch(s)
            s.synchronize()

        def launches():
            for _ in range(100):
                s.launch_kernel(rt.kernels.noop)
            s.synchronize()

        def one():
            s.launch_kernel(rt.kernels.noop)
            s.synchronize()

        for _ in range(a.rounds):
            r, l100, l1 = med_p90(replay, 2000), med_p90(launches, 500), med_p90(one, 2000)
            print(
                f"replay+sync {r[0]:.2f}/{r[1]:.2f}  100 launches+sync {l100[0]:.2f}/{l100[1]:.2f}"
                f"  launch+sync {l1[0]:.2f}/{l1[1]:.2f}",
                flush=True,
            )
    finally:
        for h in hogs:
            h.kill()


if __name__ == "__main__":
    main()
