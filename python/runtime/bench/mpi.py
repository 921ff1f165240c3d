"""``python -m runtime bench --mpi``: all_reduce over MPI beside raw mpi4py, as nccl-tests reports.

The parent spawns ``mpiexec -n NP python -m runtime.bench.mpi --worker``; every worker drives
one virtual device. Per size (float32, 4 KiB .. 256 MiB) it times, alternating in rounds so the
host's load hits both alike:

* ``runtime``: ``MPICommunicator.all_reduce(buf, buf)`` (in place) on device memory, ``iters``
  calls queued on the stream, then one ``stream.synchronize()``;
* ``mpi4py``: ``comm.Allreduce(MPI.IN_PLACE, array, MPI.SUM)`` on a numpy array, ``iters``
  blocking calls.

A round's time per operation is its wall time / iters, the slowest process's (MPI_MAX); the
row is the median over the rounds. Bandwidths as nccl-tests computes them: ``algbw = bytes /
time`` and ``busbw = algbw * 2 (n - 1) / n`` for n ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import sysconfig
import time

SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20]
QUICK_SIZES = [4 << 10, 1 << 20, 64 << 20]


def _iters(nbytes: int) -> int:
    """Operations per round: at least 4 (so one synchronisation is amortised), at most 200."""
    return max(4, min(200, (256 << 20) // nbytes))


def _worker(sizes: list[int], rounds: int) -> int:
    import numpy as np
    from mpi4py import MPI

    import runtime as rt
    from runtime._mpi import init_mpi

    world = MPI.COMM_WORLD
    rt.init(device_count=1)
    (comm,) = init_mpi([0], timeout=600)
    stream = rt.Stream(0)
    n = world.size
    rows = []
    for nbytes in sizes:
        count = nbytes // 4
        host = np.ones(count, np.float32)
        buf = rt.to_device(host, 0)
        iters = _iters(nbytes)

        def run_runtime(buf=buf, iters=iters):
            for _ in range(iters):
                comm.all_reduce(buf, buf, stream=stream)
            stream.synchronize()

        def run_mpi4py(host=host, iters=iters):
            for _ in range(iters):
                world.Allreduce(MPI.IN_PLACE, host, MPI.SUM)

        times: dict[str, list[float]] = {"runtime": [], "mpi4py": []}
        for warm in (True, False):
            for _ in range(1 if warm else rounds):
                for name, fn in (("runtime", run_runtime), ("mpi4py", run_mpi4py)):
                    world.Barrier()
                    t = time.perf_counter()
                    fn()
                    dt = (time.perf_counter() - t) / iters
                    dt = world.allreduce(dt, op=MPI.MAX)
                    if not warm:
                        times[name].append(dt)
        row = {"bytes": nbytes, "ranks": n, "iters": iters, "rounds": rounds}
        for name, ts in times.items():
            med = statistics.median(ts)
            algbw = nbytes / med / 1e9
            row[name] = {
                "us": med * 1e6,
                "samples_us": [t * 1e6 for t in ts],
                "algbw_GBps": algbw,
                "busbw_GBps": algbw * 2 * (n - 1) / n,
            }
        row["ratio"] = row["runtime"]["us"] / row["mpi4py"]["us"]
        rows.append(row)
        del buf
    comm.destroy()
    if world.rank == 0:
        sys.stdout.write("RESULT " + json.dumps(rows) + "\n")
        sys.stdout.flush()
    return 0


def _mpiexec() -> str | None:
    dirs = [pathlib.Path(sys.executable).parent, pathlib.Path(sysconfig.get_path("scripts"))]
    for d in dirs:
        if (d / "mpiexec").exists():
            return str(d / "mpiexec")
    return shutil.which("mpiexec")


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def render(rows: list[dict]) -> str:
    lines = [
        "| size | runtime us | mpi4py us | runtime / mpi4py | runtime busbw GB/s | "
        "mpi4py busbw GB/s |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        a, b = r["runtime"], r["mpi4py"]
        lines.append(
            f"| {_size(r['bytes'])} | {a['us']:,.1f} | {b['us']:,.1f} | {r['ratio']:.2f} | "
            f"{a['busbw_GBps']:.2f} | {b['busbw_GBps']:.2f} |"
        )
    return "\n".join(lines)


def run(np_: int = 2, quick: bool = False, json_path: str | None = None) -> int:
    """Spawn the workers, print the table (and write ``json_path``); the CLI's ``--mpi``."""
    from .._cli import UsageError

    try:
        import mpi4py  # noqa: F401
    except ImportError as e:
        raise UsageError(
            "--mpi needs mpi4py and mpiexec: pip install mpi4py mpich (the 'mpi' extra)"
        ) from e
    exe = _mpiexec()
    if exe is None:
        raise UsageError("--mpi needs mpiexec on PATH: pip install mpi4py mpich (the 'mpi' extra)")
    sizes = QUICK_SIZES if quick else SIZES
    rounds = 3 if quick else 7
    cmd = [exe, "-n", str(np_), sys.executable, "-m", "runtime.bench.mpi", "--worker"]
    cmd += ["--sizes", ",".join(map(str, sizes)), "--rounds", str(rounds)]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.stderr.write(out.stdout + out.stderr)
        return out.returncode or 1
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
    rows = json.loads(line[len("RESULT ") :])
    print(f"all_reduce float32 in place, {np_} processes x 1 device, median of {rounds} rounds")
    print(render(rows))
    if json_path:
        with open(json_path, "w", encoding="utf-8") as f:
            json.dump({"np": np_, "command": " ".join(sys.argv), "rows": rows}, f, indent=1)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m runtime.bench.mpi")
    ap.add_argument("--worker", action="store_true", help="(internal) run as an MPI worker")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--np", type=int, default=2, dest="np_")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", metavar="PATH")
    a = ap.parse_args(argv)
    if a.worker:
        return _worker([int(s) for s in a.sizes.split(",")], a.rounds)
    return run(a.np_, a.quick, a.json)


if __name__ == "__main__":
    sys.exit(main())
