"""``python -m runtime.bench.shapes``: the second round's rows (issue 25).

``--alloc``: stream-ordered allocation against the other ways to get a scratch buffer per
step. Each step allocates ``size`` bytes, queues a memset of it on one stream and frees it, and
the stream is synchronised once at the end (what a training step's temporaries do):

* ``malloc_async`` + ``free_async`` (the async pool: the block freed on the stream is reused by
  the next step at once, zeroed in stream order);
* ``device_malloc`` + ``device_free`` (the caching allocator: a block comes back once the
  queued memset that holds it has run, and is zeroed by the scrubber);
* a CuPy-style pool in Python: per-stream free lists of ``DeviceBuffer`` objects over
  ``device_malloc``, reused at once on the same stream (CuPy's ``MemoryPool`` reuses a chunk
  freed on the same stream without synchronising) and never zeroed.

The three are interleaved round by round (median of the rounds, µs per step) and the peak of
device memory each held is reported (the async pool's ``reserved_mem_high``, the allocator's
``peak_reserved`` over the run, the Python pool's buffers).

``--comm``: ``all_gatherv`` and ``all_to_allv`` bus bandwidth next to ``all_gather`` and
``all_to_all`` (nccl-tests' definitions: ``algbw = size / time``, ``busbw = algbw (n - 1) / n``
for both, ``size`` the bytes each rank receives), in-process ranks, the per-rank counts equal
(the v call's own cost) and uneven (rank ``q`` gets a share proportional to ``q + 1``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

KiB = 1024
MiB = 1024 * KiB


def _fmt(size: int) -> str:
    return f"{size // MiB} MiB" if size >= MiB else f"{size // KiB} KiB"


class _PyPool:
    """CuPy-style: free lists per (stream, size) of DeviceBuffer objects."""

    def __init__(self, runtime):
        self.rt = runtime
        self.free: dict[tuple[int, int], list] = {}
        self.made = 0

    def malloc(self, size: int, stream):
        lst = self.free.get((id(stream), size))
        if lst:
            return lst.pop()
        self.made += 1
        return self.rt.device_malloc(0, size)

    def release(self, buf, size: int, stream) -> None:
        self.free.setdefault((id(stream), size), []).append(buf)


def _steps_for(size: int) -> int:
    return max(20, min(2000, (256 * MiB) // size))


def _alloc_row(runtime, pool, size: int, rounds: int) -> dict:
    """One size: the three systems interleaved round by round."""
    steps = _steps_for(size)
    s = runtime.Stream(0)
    py = _PyPool(runtime)
    times: dict[str, list[float]] = {"async": [], "malloc": [], "pypool": []}
    peaks: dict[str, int] = {"async": 0, "malloc": 0, "pypool": 0}

    def run_async():
        pool.reset_peak_stats()
        t0 = time.perf_counter()
        for _ in range(steps):
            b = runtime.malloc_async(size, s)
            runtime.memset(b, 1, stream=s)
            runtime.free_async(b, s)
        s.synchronize()
        dt = time.perf_counter() - t0
        peaks["async"] = max(peaks["async"], pool.stats()["reserved_mem_high"])
        return dt

    def run_malloc():
        base = runtime.memory_stats(0)["reserved"]
        runtime.reset_peak_memory_stats(0)
        t0 = time.perf_counter()
        for _ in range(steps):
            b = runtime.device_malloc(0, size)
            runtime.memset(b, 1, stream=s)
            runtime.device_free(b)
        s.synchronize()
        dt = time.perf_counter() - t0
        peaks["malloc"] = max(peaks["malloc"], runtime.memory_stats(0)["peak_reserved"] - base)
        return dt

    def run_pypool():
        t0 = time.perf_counter()
        for _ in range(steps):
            b = py.malloc(size, s)
            runtime.memset(b, 1, stream=s)
            py.release(b, size, s)
        s.synchronize()
        dt = time.perf_counter() - t0
        peaks["pypool"] = max(peaks["pypool"], py.made * size)
        return dt

    systems = [("async", run_async), ("malloc", run_malloc), ("pypool", run_pypool)]
    for _, f in systems:  # warm-up round, not counted
        f()
    for r in range(rounds):
        for name, f in systems[r % 3 :] + systems[: r % 3]:
            times[name].append(f() / steps * 1e6)
    med = {k: float(np.median(v)) for k, v in times.items()}
    print(
        f"| {_fmt(size)} | {med['async']:.2f} | {med['malloc']:.2f} | {med['pypool']:.2f} | "
        f"{med['malloc'] / med['async']:.2f}x | {med['pypool'] / med['async']:.2f}x | "
        f"{_fmt(peaks['async'])} | {_fmt(peaks['malloc'])} | {_fmt(peaks['pypool'])} |",
        flush=True,
    )
    return {
        "size": size,
        "steps": steps,
        "rounds": rounds,
        "us_per_step": med,
        "samples_us": times,
        "peak_bytes": peaks,
    }


def bench_alloc(sizes: list[int], rounds: int) -> list[dict]:
    import runtime

    rows = []
    pool = runtime.MemoryAsyncPool(0)
    for size in sizes:
        rows.append(_alloc_row(runtime, pool, size, rounds))
        pool.free_all_blocks()
        runtime.empty_cache()
    return rows


def _comm_rows(runtime, cs, n: int, size: int, rounds: int) -> list[dict]:
    """One rank count and size: the six collectives interleaved round by round."""
    streams = [runtime.current_stream(c.device) for c in cs]
    count = size // 4  # float32 elements each rank receives
    even = [count // n] * n
    weights = np.arange(1, n + 1)
    uneven = [int(x) for x in count * weights // weights.sum()]
    uneven[-1] += count - sum(uneven)
    recvs = [runtime.empty(count, "float32", c.device) for c in cs]
    sends_ag = [runtime.empty(count // n, "float32", c.device) for c in cs]
    sends_a2a = [runtime.empty(count, "float32", c.device) for c in cs]
    sends_agv = [runtime.empty(uneven[c.rank], "float32", c.device) for c in cs]
    # uneven all_to_allv: rank a sends uneven[(a + b) % n] elements to rank b, so every rank
    # sends and receives `count` elements in all
    a2av_send = [[uneven[(a + b) % n] for b in range(n)] for a in range(n)]
    a2av_recv = [[a2av_send[a][b] for a in range(n)] for b in range(n)]
    iters = max(3, min(50, (64 * MiB) // size * 3))

    def timed(issue):
        issue()  # warm-up
        for s in streams:
            s.synchronize()
        ts = []
        for _ in range(iters):
            t0 = time.perf_counter()
            issue()
            for s in streams:
                s.synchronize()
            ts.append(time.perf_counter() - t0)
        return float(np.median(ts))

    def all_gather():
        for c, s, r in zip(cs, sends_ag, recvs):
            c.all_gather(s, r)

    def all_gatherv_even():
        for c, s, r in zip(cs, sends_ag, recvs):
            c.all_gatherv(s, r, even)

    def all_gatherv_uneven():
        for c, s, r in zip(cs, sends_agv, recvs):
            c.all_gatherv(s, r, uneven)

    def all_to_all():
        for c, s, r in zip(cs, sends_a2a, recvs):
            c.all_to_all(s, r)

    def all_to_allv_even():
        for c, s, r in zip(cs, sends_a2a, recvs):
            c.all_to_allv(s, even, r, even)

    def all_to_allv_uneven():
        for c, s, r in zip(cs, sends_a2a, recvs):
            c.all_to_allv(s, a2av_send[c.rank], r, a2av_recv[c.rank])

    cases = [
        ("all_gather", all_gather),
        ("all_gatherv (equal counts)", all_gatherv_even),
        ("all_gatherv (uneven counts)", all_gatherv_uneven),
        ("all_to_all", all_to_all),
        ("all_to_allv (equal counts)", all_to_allv_even),
        ("all_to_allv (uneven counts)", all_to_allv_uneven),
    ]
    samples: dict[str, list[float]] = {name: [] for name, _ in cases}
    for r in range(rounds):
        for name, f in cases[r % len(cases) :] + cases[: r % len(cases)]:
            samples[name].append(timed(f))
    rows = []
    for name, _ in cases:
        t = float(np.median(samples[name]))
        rows.append(
            {
                "ranks": n,
                "size": size,
                "collective": name,
                "s": t,
                "busbw_GBps": size / t * (n - 1) / n / 1e9,
                "samples_s": samples[name],
            }
        )
    for row in rows:
        ref = rows[0] if "gather" in row["collective"] else rows[3]
        print(
            f"| {n} | {_fmt(size)} | {row['collective']} | {row['busbw_GBps']:.2f} | "
            f"{row['busbw_GBps'] / ref['busbw_GBps']:.2f}x |",
            flush=True,
        )
    return rows


def bench_comm(ranks: list[int], sizes: list[int], rounds: int) -> list[dict]:
    import runtime
    from runtime import comm

    rows = []
    for n in ranks:
        cs = comm.init_all(range(n))
        for size in sizes:
            rows += _comm_rows(runtime, cs, n, size, rounds)
        for c in cs:
            c.destroy()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m runtime.bench.shapes", description=__doc__)
    ap.add_argument("--alloc", action="store_true", help="stream-ordered allocation rows")
    ap.add_argument("--comm", action="store_true", help="all_gatherv / all_to_allv rows")
    ap.add_argument("--sizes", type=int, nargs="+", default=None, help="bytes")
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", metavar="PATH", help="write the results as JSON")
    args = ap.parse_args(argv)
    if not (args.alloc or args.comm):
        args.alloc = args.comm = True

    import runtime

    out: dict = {}
    if args.alloc:
        runtime.init(device_count=1, memory="2GiB")
        print(
            "| size | malloc_async+free_async µs | device_malloc+device_free µs | "
            "CuPy-style pool µs | device_malloc / async | pool / async | "
            "peak async | peak device_malloc | peak pool |"
        )
        print("|---" * 9 + "|")
        out["alloc"] = bench_alloc(args.sizes or [4 * KiB, MiB, 64 * MiB], args.rounds)
        runtime.shutdown()
    if args.comm:
        sizes = args.sizes or [MiB, 64 * MiB]
        runtime.init(device_count=max(args.ranks), memory=max(sizes) * 4 + 64 * MiB)
        print("| ranks | size | collective | busbw GB/s | / its non-v collective |")
        print("|---" * 5 + "|")
        out["comm"] = bench_comm(args.ranks, sizes, args.rounds)
        runtime.shutdown()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
