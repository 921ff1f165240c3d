"""How one process's `add` 2^16 ratio against numpy moves with the host: every `period`
seconds, probe the cross-core latency (the bench's host probe), then time the bench's
`add` 2^16 cell (`kernels.add` + `synchronize`, the block count chosen by the kernel)
alternated with `np.add(a, b, out=c)` in runs of 200 calls, and print one line: the time,
the probe's median before and after, the medians and the ratios. `--block-dims none,4,8`
times those block counts too, in turn with the others (`none`: the kernel's choice).

    python scripts/host_drift.py [minutes] [period_s] [--block-dims LIST] [--json FILE]

Why: the bench's `add` 2^16 target changes verdict between runs of one build. Sampled in
one process, minutes apart, the ratio shows what it follows: the probe (each hand-off
between the launching thread and the workers crosses between the two vCPUs), and numpy's
own time (the memory it shares with other tenants), neither of which a run chooses.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import runtime as rt
from runtime import _runtime

N = 1 << 16
RUN = 200
RUNS = 15


def probe() -> float | None:
    """The median of ten host probes (one-way ns), None on a single-CPU host."""
    got = [_runtime._cross_core_ns(1000, 0.005) for _ in range(10)]
    got = [g for g in got if g is not None]
    return float(np.median(got)) if got else None


def sample(stream, dims, da, db, dc, a, b, c) -> tuple[list[float], float]:
    """Median us of `kernels.add` + `synchronize` at each of `dims` and of `np.add`,
    alternated in runs."""
    add, sync = rt.kernels.add, stream.synchronize
    tr: list[list[int]] = [[] for _ in dims]
    tn: list[int] = []
    for _ in range(RUNS):
        for d, times in zip(dims, tr):
            for _ in range(RUN):
                t0 = time.perf_counter_ns()
                add(dc, da, db, stream=stream, block_dim=d)
                sync()
                times.append(time.perf_counter_ns() - t0)
        for _ in range(RUN):
            t0 = time.perf_counter_ns()
            np.add(a, b, out=c)
            tn.append(time.perf_counter_ns() - t0)
    return [float(np.median(t)) / 1e3 for t in tr], float(np.median(tn)) / 1e3


def block_dims(text: str) -> list[int | None]:
    """`none,4,8` -> [None, 4, 8]."""
    out: list[int | None] = []
    for part in text.split(","):
        part = part.strip().lower()
        if part == "none":
            out.append(None)
        elif part.isdigit() and int(part) > 0:
            out.append(int(part))
        else:
            raise argparse.ArgumentTypeError(
                f"block dims: expected none or a positive int, got {part!r}"
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("minutes", type=float, nargs="?", default=10.0)
    ap.add_argument("period", type=float, nargs="?", default=20.0, help="seconds between samples")
    ap.add_argument("--block-dims", type=block_dims, default=[None], help="e.g. none,4,8")
    ap.add_argument("--json", help="write the samples here as they come")
    args = ap.parse_args()
    if args.minutes <= 0 or args.period < 0:
        ap.error(f"minutes must be > 0 and period >= 0, got {args.minutes} and {args.period}")
    rt.init()
    rt.set_device(0)
    stream = rt.Stream()
    rng = np.random.default_rng(0)
    a, b = (rng.random(N, dtype=np.float32) for _ in range(2))
    c = np.empty(N, np.float32)
    da, db, dc = rt.to_device(a), rt.to_device(b), rt.empty((N,), "float32")
    rt.kernels.add(dc, da, db, stream=stream)
    stream.synchronize()
    if not np.array_equal(dc.copy_to_host(), a + b):
        raise SystemExit("kernels.add differs from numpy")
    rows = []
    end = time.monotonic() + args.minutes * 60
    while time.monotonic() < end:
        before = probe()
        rt_us, np_us = sample(stream, args.block_dims, da, db, dc, a, b, c)
        after = probe()
        probes = [p for p in (before, after) if p is not None]
        names = ["none" if d is None else str(d) for d in args.block_dims]
        row = {
            "time": time.strftime("%H:%M:%S"),
            "probe_ns": [round(p, 1) for p in probes],
            "numpy_us": round(np_us, 2),
            "runtime_us": {n: round(t, 2) for n, t in zip(names, rt_us)},
            "ratio": {n: round(t / np_us, 3) for n, t in zip(names, rt_us)},
        }
        rows.append(row)
        cells = "  ".join(
            f"block_dim={n} {t:6.2f} us ({row['ratio'][n]:.3f})" for n, t in zip(names, rt_us)
        )
        print(
            f"{row['time']}  probe {'/'.join(f'{p:.0f}' for p in probes) or '-'} ns  "
            f"numpy {np_us:6.2f} us  {cells}",
            flush=True,
        )
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
        time.sleep(args.period)


if __name__ == "__main__":
    main()
