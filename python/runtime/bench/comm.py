"""``python -m runtime.bench.comm``: all_reduce bus bandwidth, in-process ranks vs peers.

Bus bandwidth as nccl-tests computes it (doc/PERFORMANCE.md): ``algbw = bytes / time`` and
``busbw = algbw * 2 (n - 1) / n`` for all_reduce. This runtime runs ``n`` ranks in this process
(one device each, one thread issuing every rank's call, then synchronizing every rank's
stream). Peers, with the same rank count and float32 data: ``torch.distributed`` with the gloo
backend (``n`` spawned processes) and ``mpi4py`` ``Allreduce`` on numpy arrays (under
``mpiexec -n n``); a peer that is not installed is reported as missing, never faked.

The floor is the time to move the data once at the machine's memory bandwidth: an all_reduce
must read every rank's input and write every rank's output, ``2 x n x size`` bytes, at the
measured 2-thread memcpy bandwidth (numpy copies of 64 MiB in two threads).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

KiB = 1024
MiB = 1024 * KiB
DEFAULT_SIZES = [4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 64 * MiB, 256 * MiB]


def iters_for(size: int) -> int:
    """Enough repetitions for a stable median without minutes at 256 MiB."""
    return max(3, min(200, (64 * MiB) // max(size, 1) // 4 + 3))


def busbw(n: int, size: int, seconds: float) -> float:
    """nccl-tests' all_reduce bus bandwidth in GB/s."""
    if n == 1 or seconds <= 0:
        return float("nan") if n == 1 else 0.0
    return size / seconds * 2 * (n - 1) / n / 1e9


def memcpy_bandwidth(threads: int = 2, size: int = 64 * MiB, reps: int = 5) -> float:
    """Bytes/s moved (read + write) by ``threads`` threads each copying ``size`` bytes."""
    srcs = [np.ones(size, np.uint8) for _ in range(threads)]
    dsts = [np.zeros(size, np.uint8) for _ in range(threads)]
    best = float("inf")
    for _ in range(reps):
        barrier = threading.Barrier(threads + 1)

        def work(i: int, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            np.copyto(dsts[i], srcs[i])

        ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        for t in ts:
            t.start()
        t0 = time.perf_counter()
        barrier.wait()
        for t in ts:
            t.join()
        best = min(best, time.perf_counter() - t0)
    return 2 * threads * size / best


def measure_runtime(n: int, sizes: list[int]) -> dict[int, float]:
    """Median seconds per in-process all_reduce of ``size`` bytes of float32 on ``n`` ranks."""
    import runtime
    from runtime import comm

    cs = comm.init_all(range(n))
    streams = [runtime.current_stream(c.device) for c in cs]
    out: dict[int, float] = {}
    for size in sizes:
        count = size // 4
        bufs = [runtime.to_device(np.ones(count, np.float32), device=c.device) for c in cs]
        times = []
        for _ in range(iters_for(size)):
            t0 = time.perf_counter()
            for c, b in zip(cs, bufs):
                c.all_reduce(b, b)
            for s in streams:
                s.synchronize()
            times.append(time.perf_counter() - t0)
        out[size] = float(np.median(times))
        del bufs
    for c in cs:
        c.destroy()
    return out


_GLOO_WORKER = r"""
import json, os, sys, time
import numpy as np
import torch, torch.distributed as dist
rank, n, port, sizes, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4]), sys.argv[5]
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
res = {}
for size, iters in sizes:
    t = torch.ones(size // 4, dtype=torch.float32)
    dist.all_reduce(t)
    times = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(t)
        times.append(time.perf_counter() - t0)
    res[size] = float(np.median(times))
if rank == 0:
    json.dump(res, open(out, "w"))
dist.destroy_process_group()
"""

_MPI_WORKER = r"""
import json, sys, time
import numpy as np
from mpi4py import MPI
comm = MPI.COMM_WORLD
sizes, out = json.loads(sys.argv[1]), sys.argv[2]
res = {}
for size, iters in sizes:
    a = np.ones(size // 4, np.float32)
    b = np.empty_like(a)
    comm.Allreduce(a, b)
    times = []
    for _ in range(iters):
        comm.Barrier()
        t0 = time.perf_counter()
        comm.Allreduce(a, b)
        times.append(time.perf_counter() - t0)
    # The slowest rank's time is the collective's.
    res[size] = comm.allreduce(float(np.median(times)), op=MPI.MAX)
if comm.rank == 0:
    json.dump(res, open(out, "w"))
"""


def _run_script(cmd: list[str], out: str, timeout: float) -> dict[int, float] | str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout:.0f} s"
    if p.returncode != 0 or not os.path.exists(out):
        return (
            (p.stderr or p.stdout).strip().splitlines()[-1:][0]
            if (p.stderr or p.stdout)
            else "failed"
        )
    with open(out) as f:
        return {int(k): v for k, v in json.load(f).items()}


def measure_gloo(n: int, sizes: list[int], timeout: float = 900) -> dict[int, float] | str:
    """torch.distributed gloo all_reduce in ``n`` processes, or why it could not run."""
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed (pip install torch --index-url https://download.pytorch.org/whl/cpu)"
    with tempfile.TemporaryDirectory() as d:
        script, out = os.path.join(d, "gloo.py"), os.path.join(d, "out.json")
        with open(script, "w") as f:
            f.write(_GLOO_WORKER)
        port = str(29500 + os.getpid() % 1000)
        spec = json.dumps([[s, iters_for(s)] for s in sizes])
        procs = [
            subprocess.Popen(
                [sys.executable, script, str(r), str(n), port, spec, out],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for r in range(n)
        ]
        try:
            errs = [p.communicate(timeout=timeout)[1] for p in procs]
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            return f"timed out after {timeout:.0f} s"
        if any(p.returncode for p in procs) or not os.path.exists(out):
            return next((e.strip().splitlines()[-1] for e in errs if e.strip()), "failed")
        with open(out) as f:
            return {int(k): v for k, v in json.load(f).items()}


def measure_mpi(n: int, sizes: list[int], timeout: float = 900) -> dict[int, float] | str:
    """mpi4py Allreduce on numpy float32 under ``mpiexec -n n``, or why it could not run."""
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed (pip install mpi4py mpich)"
    mpiexec = shutil.which("mpiexec") or shutil.which(
        "mpiexec", path=os.path.dirname(sys.executable)
    )
    if not mpiexec:
        return "mpiexec not found"
    with tempfile.TemporaryDirectory() as d:
        script, out = os.path.join(d, "mpi.py"), os.path.join(d, "out.json")
        with open(script, "w") as f:
            f.write(_MPI_WORKER)
        spec = json.dumps([[s, iters_for(s)] for s in sizes])
        return _run_script([mpiexec, "-n", str(n), sys.executable, script, spec, out], out, timeout)


def _fmt_size(size: int) -> str:
    return f"{size // MiB} MiB" if size >= MiB else f"{size // KiB} KiB"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m runtime.bench.comm", description=__doc__)
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--sizes", type=int, nargs="+", default=DEFAULT_SIZES, help="bytes")
    ap.add_argument("--no-peers", action="store_true", help="measure this runtime only")
    ap.add_argument("--json", metavar="PATH", help="write the results as JSON")
    args = ap.parse_args(argv)

    import runtime

    bw = memcpy_bandwidth()
    print(f"2-thread memcpy bandwidth: {bw / 1e9:.2f} GB/s (read + write)")
    need = max(args.sizes) * 2 + 64 * MiB
    runtime.init(device_count=max(args.ranks), memory=need)
    results = {"memcpy_GBps": bw / 1e9, "rows": []}
    header = "| ranks | size | runtime busbw | floor busbw | runtime / floor time | gloo busbw | mpi4py busbw | runtime / gloo | runtime / mpi4py |"
    print(header)
    print("|---" * (header.count("|") - 1) + "|")
    for n in args.ranks:
        mine = measure_runtime(n, args.sizes)
        gloo = {} if args.no_peers else measure_gloo(n, args.sizes)
        mpi = {} if args.no_peers else measure_mpi(n, args.sizes)
        for size in args.sizes:
            floor_t = 2 * n * size / bw
            row = {
                "ranks": n,
                "size": size,
                "runtime_s": mine[size],
                "floor_s": floor_t,
                "runtime_busbw": busbw(n, size, mine[size]),
                "floor_busbw": busbw(n, size, floor_t),
                "gloo_busbw": busbw(n, size, gloo[size])
                if isinstance(gloo, dict) and size in gloo
                else None,
                "mpi_busbw": busbw(n, size, mpi[size])
                if isinstance(mpi, dict) and size in mpi
                else None,
            }
            results["rows"].append(row)

            def cell(v):
                return "—" if v is None else f"{v:.2f}"

            def ratio(v, row=row):
                return "—" if not v else f"{row['runtime_busbw'] / v:.2f}x"

            print(
                f"| {n} | {_fmt_size(size)} | {row['runtime_busbw']:.2f} | {row['floor_busbw']:.2f} | "
                f"{mine[size] / floor_t:.2f} | {cell(row['gloo_busbw'])} | {cell(row['mpi_busbw'])} | "
                f"{ratio(row['gloo_busbw'])} | {ratio(row['mpi_busbw'])} |",
                flush=True,
            )
        for name, r in (("gloo", gloo), ("mpi4py", mpi)):
            if isinstance(r, str):
                print(f"  {name} with {n} ranks: missing ({r})")
                results[f"{name}_{n}_missing"] = r
    runtime.shutdown()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
