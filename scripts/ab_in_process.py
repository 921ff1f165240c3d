"""Two builds of the package in one process, timed in turn: launch loops of each, the order
swapped every round, and the second build's time over the first's per round.

    python scripts/ab_in_process.py DIR_A DIR_B [rounds]

DIR_A and DIR_B each hold a `runtime` package (`pip install --no-deps --target DIR wheel`).
The first is imported as `runtime`, the second under the name `runtime_b` (its modules
import one another relatively; its MPI face's `import runtime` finds the first build, which
no loop here uses).

Why in one process: on a shared 2-core host the cost of a hand-off between cores changes
from process to process and within one (BENCHMARKS.md, "the host's two states"), by up to
2x, so two builds run in separate processes, even alternated, differ by more than a change
of a few percent. Here each round times both builds back to back in the same host state,
and swapping the order each round cancels the advantage of going first or second. Each
build has its own runtime and workers; the idle one's workers sleep while the other runs.
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
import time

import numpy as np


def load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(
        name, f"{path}/runtime/__init__.py", submodule_search_locations=[f"{path}/runtime"]
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def loops(rt):
    """The timed loops of one build, each returning microseconds per launch."""
    rt.init()
    rt.set_device(0)
    s = rt.Stream()
    one = np.ones(16, np.float32)
    args = (rt.empty((16,), "float32"), rt.to_device(one), rt.to_device(one))
    launch, sync, add, noop = s.launch_kernel, s.synchronize, rt.kernels.add, rt.kernels.noop

    def per_launch(f, n):
        t = time.perf_counter()
        f(n)
        return (time.perf_counter() - t) / n * 1e6

    def noop_sync(n):
        for _ in range(n):
            launch(noop)
            sync()

    def add_sync(n):
        for _ in range(n):
            launch(add, args)
            sync()

    def add_amortised(n):
        for _ in range(n):
            launch(add, args)
        sync()

    return {
        "no-op launch + sync": lambda: per_launch(noop_sync, 300),
        "add of 16 floats (3 buffers) launch + sync": lambda: per_launch(add_sync, 300),
        "add of 16 floats launch, amortised over 3,000": lambda: per_launch(add_amortised, 3000),
    }


def main() -> None:
    a_dir, b_dir = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 60
    builds = [loops(load(a_dir, "runtime")), loops(load(b_dir, "runtime_b"))]
    times = {name: ([], []) for name in builds[0]}
    for r in range(rounds):
        for name in times:
            for i in (0, 1) if r % 2 == 0 else (1, 0):
                times[name][i].append(builds[i][name]())
    print(
        f"{rounds} rounds; medians in us (A: {a_dir}, B: {b_dir}); B/A per round: median, quartiles"
    )
    for name, (a, b) in times.items():
        ratios = sorted(y / x for x, y in zip(a, b))
        q = statistics.quantiles(ratios, n=4)
        print(
            f"{name:48s} A {statistics.median(a):7.3f}  B {statistics.median(b):7.3f}  "
            f"B/A {statistics.median(ratios):.3f} ({q[0]:.3f}-{q[2]:.3f})"
        )


if __name__ == "__main__":
    main()
