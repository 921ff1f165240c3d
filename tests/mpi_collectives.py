"""Run under ``mpiexec -n N``: every MPI collective of ``runtime._mpi`` checked against numpy.

``python mpi_collectives.py check DEVICES`` -- DEVICES is the devices each process drives, one
count for all (``2``) or one per process (``1,2,1``). Every rank makes its inputs from a seed
of (case, rank), so every process can compute the whole expected result with numpy.
``python mpi_collectives.py errors`` -- argument errors, a local rank that never joins (the
timeout), abort, and a broken communicator refusing further calls.

Each process prints ``ok <process> <checks>`` on success; any mismatch raises (exit code 1).
Driven by ``test_comm_mpi.py``.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from mpi4py import MPI

import runtime as rt
import runtime._mpi as rt_mpi
from runtime._mpi import init_mpi

DTYPES = ("float32", "float64", "int32", "int64")
OPS = ("sum", "prod", "max", "min", "avg")
NP_OPS = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


def data(case: int, rank: int, n: int, dtype: str, op: str = "sum") -> np.ndarray:
    """Rank ``rank``'s input for ``case``: small values, so products and sums stay exact."""
    rng = np.random.default_rng([case, rank])
    if op == "prod":
        x = rng.choice([1, 2, -1], size=n) if dtype.startswith("int") else rng.uniform(0.5, 1.5, n)
    else:
        x = rng.integers(-50, 50, size=n) if dtype.startswith("int") else rng.standard_normal(n)
    return x.astype(dtype)


def reduce_ref(op: str, xs: list[np.ndarray]) -> np.ndarray:
    if op == "avg":
        total = np.sum(np.stack(xs).astype(np.float64), axis=0)
        if xs[0].dtype.kind == "f":
            return (total / len(xs)).astype(xs[0].dtype)
        return np.trunc(total / len(xs)).astype(xs[0].dtype)
    return NP_OPS[op].reduce(np.stack(xs), axis=0)


class Checker:
    def __init__(self, comms):
        self.comms = comms
        self.size = comms[0].size
        self.count = 0

    def expect(self, got: np.ndarray, want: np.ndarray, what: str) -> None:
        if got.dtype.kind == "f":
            tol = 1e-5 if got.dtype == np.float32 else 1e-12
            ok = np.allclose(got, want, rtol=tol, atol=tol)
        else:
            ok = np.array_equal(got, want)
        if not ok or got.shape != want.shape:
            bad = np.flatnonzero(got != want)[:5] if got.shape == want.shape else "shape"
            raise AssertionError(f"{what}: got {got[:8]} want {want[:8]} (first bad {bad})")
        self.count += 1

    def sync(self):
        for c in self.comms:
            rt.current_stream(c.device).synchronize(timeout=120)


def check(devices_arg: str) -> int:
    world = MPI.COMM_WORLD
    spec = [int(x) for x in devices_arg.split(",")]
    mine = spec[0] if len(spec) == 1 else spec[world.rank]
    rt.init(device_count=max(mine, 1), memory="256MiB")
    comms = init_mpi(list(range(mine)), timeout=120)
    if os.environ.get("MPI4PY_RC_THREAD_LEVEL") == "serialized":
        # MPI_THREAD_SERIALIZED: every MPI call under one lock, non-blocking calls polled
        assert MPI.Query_thread() == MPI.THREAD_SERIALIZED
        assert rt_mpi._SERIAL_LOCK is not None and comms[0]._g.arrival is None
    else:
        assert MPI.Query_thread() == MPI.THREAD_MULTIPLE and rt_mpi._SERIAL_LOCK is None
    ch = Checker(comms)
    size = comms[0].size
    assert [c.rank for c in comms] == list(range(comms[0].rank, comms[0].rank + mine))
    assert all(c.size == size for c in comms)
    all_ranks = range(size)
    case = 0

    def dev(x, c):
        return rt.to_device(x, c.device)

    for dtype in DTYPES:
        # 70,000 elements: above 256 KiB, where collectives take the arrival-barrier path
        for n in (1, 7, 1000, 4099, 70000):
            # all_reduce, every op, out of place and in place
            for op in OPS:
                case += 1
                want = reduce_ref(op, [data(case, r, n, dtype, op) for r in all_ranks])
                sends = [dev(data(case, c.rank, n, dtype, op), c) for c in comms]
                recvs = [rt.empty(n, dtype, c.device) for c in comms]
                for c, s, r in zip(comms, sends, recvs):
                    c.all_reduce(s, r, op=op)
                ch.sync()
                for c, s, r in zip(comms, sends, recvs):
                    ch.expect(r.copy_to_host(), want, f"all_reduce {op} {dtype} n={n}")
                    ch.expect(s.copy_to_host(), data(case, c.rank, n, dtype, op), "send kept")
                for c, s in zip(comms, sends):
                    c.all_reduce(s, s, op=op)
                ch.sync()
                for s in sends:
                    ch.expect(s.copy_to_host(), want, f"in-place all_reduce {op} {dtype} n={n}")
            # reduce to each root (recv None elsewhere), every op
            for op in OPS:
                for root in all_ranks:
                    case += 1
                    want = reduce_ref(op, [data(case, r, n, dtype, op) for r in all_ranks])
                    outs = {}
                    for c in comms:
                        x = dev(data(case, c.rank, n, dtype, op), c)
                        outs[c.rank] = rt.empty(n, dtype, c.device) if c.rank == root else None
                        c.reduce(x, outs[c.rank], root, op=op)
                    ch.sync()
                    if root in outs:
                        ch.expect(outs[root].copy_to_host(), want, f"reduce {op} to {root}")
            # broadcast from each root
            for root in all_ranks:
                case += 1
                want = data(case, root, n, dtype)
                bufs = []
                for c in comms:
                    b = dev(want if c.rank == root else np.zeros(n, dtype), c)
                    c.broadcast(b, root)
                    bufs.append(b)
                ch.sync()
                for b in bufs:
                    ch.expect(b.copy_to_host(), want, f"broadcast from {root} {dtype} n={n}")
            # all_gather (count n per rank; also in place: send is the rank's own chunk)
            case += 1
            want = np.concatenate([data(case, r, n, dtype) for r in all_ranks])
            recvs = []
            for c in comms:
                r = rt.empty(n * size, dtype, c.device)
                c.all_gather(dev(data(case, c.rank, n, dtype), c), r)
                recvs.append(r)
            ch.sync()
            for r in recvs:
                ch.expect(r.copy_to_host(), want, f"all_gather {dtype} n={n}")
            recvs = []
            for c in comms:
                r = rt.empty(n * size, dtype, c.device)
                item = np.dtype(dtype).itemsize
                chunk = r.view(dtype, (n,), c.rank * n * item)
                rt.memcpy_host_to_device(chunk, data(case, c.rank, n, dtype))
                c.all_gather(chunk, r)
                recvs.append(r)
            ch.sync()
            for r in recvs:
                ch.expect(r.copy_to_host(), want, f"in-place all_gather {dtype} n={n}")
            # reduce_scatter (recv count n), every op
            for op in OPS:
                case += 1
                full = reduce_ref(op, [data(case, r, n * size, dtype, op) for r in all_ranks])
                recvs = []
                for c in comms:
                    r = rt.empty(n, dtype, c.device)
                    c.reduce_scatter(dev(data(case, c.rank, n * size, dtype, op), c), r, op=op)
                    recvs.append(r)
                ch.sync()
                for c, r in zip(comms, recvs):
                    want = full[c.rank * n : (c.rank + 1) * n]
                    ch.expect(r.copy_to_host(), want, f"reduce_scatter {op} {dtype} n={n}")
            # all_to_all (chunks of n)
            case += 1
            ins = {r: data(case, r, n * size, dtype) for r in all_ranks}
            recvs = []
            for c in comms:
                r = rt.empty(n * size, dtype, c.device)
                c.all_to_all(dev(ins[c.rank], c), r)
                recvs.append(r)
            ch.sync()
            for c, r in zip(comms, recvs):
                want = np.concatenate([ins[j][c.rank * n : (c.rank + 1) * n] for j in all_ranks])
                ch.expect(r.copy_to_host(), want, f"all_to_all {dtype} n={n}")
            # send / recv around the ring: sends on one stream, receives on another
            case += 1
            recvs, streams = [], []
            for c in comms:
                s_send, s_recv = rt.Stream(c.device), rt.Stream(c.device)
                streams += [s_send, s_recv]
                c.send(dev(data(case, c.rank, n, dtype), c), (c.rank + 1) % size, stream=s_send)
                r = rt.empty(n, dtype, c.device)
                c.recv(r, (c.rank - 1) % size, stream=s_recv)
                recvs.append(r)
            for s in streams:
                s.synchronize(timeout=120)
            for c, r in zip(comms, recvs):
                want = data(case, (c.rank - 1) % size, n, dtype)
                ch.expect(r.copy_to_host(), want, f"send/recv ring {dtype} n={n}")
    # collectives stay in stream order with kernels around them, and barrier works
    case += 1
    bufs = []
    for c in comms:
        x = dev(np.full(5, c.rank + 1, np.float32), c)
        s = rt.current_stream(c.device)
        rt.kernels.scale(x, x, 2.0, stream=s)  # x = 2 (rank + 1)
        c.all_reduce(x, x)
        rt.kernels.scale(x, x, 0.5, stream=s)
        c.barrier()
        bufs.append(x)
    ch.sync()
    total = size * (size + 1) / 2
    for x in bufs:
        ch.expect(x.copy_to_host(), np.full(5, total, np.float32), "stream order")
    for c in comms:
        c.destroy()
    report(world.rank, ch.count)
    return 0


def report(process: int, checks: int) -> None:
    # One write: mpiexec merges the processes' output, and print() writes the newline apart.
    sys.stdout.write(f"ok {process} {checks}\n")
    sys.stdout.flush()


def expect_raises(exc, fn, *args, **kw):
    try:
        fn(*args, **kw)
    except exc as e:
        return e
    raise AssertionError(f"{fn} did not raise {exc.__name__}")


def errors() -> int:
    world = MPI.COMM_WORLD
    rt.init(device_count=2, memory="64MiB")
    count = 0
    comms = init_mpi([0, 1], timeout=1.0)
    c0, c1 = comms
    a = rt.empty(8, "float32", 0)
    b = rt.empty(8, "float32", 1)
    # bad arguments: clear errors, nothing queued
    checks = [
        (TypeError, c0.all_reduce, np.zeros(8, np.float32), a),
        (ValueError, c0.all_reduce, a, rt.empty(7, "float32", 0)),
        (TypeError, c0.all_reduce, a, rt.empty(8, "float64", 0)),
        (ValueError, c0.all_reduce, a, a, "mean"),
        (ValueError, c0.all_reduce, b, b),
        (ValueError, c0.all_reduce, a, a, "sum", rt.Stream(1)),
        (ValueError, c0.broadcast, a, c0.size),
        (TypeError, c0.broadcast, a, 0.5),
        (ValueError, c0.all_gather, a, rt.empty(8, "float32", 0)),
        (ValueError, c0.reduce_scatter, a, a),
        (ValueError, c0.all_to_all, a, a),
        (ValueError, c0.send, a, c0.rank),
        (TypeError, c0.reduce, a, None, c0.rank),
    ]
    for exc, fn, *args in checks:
        expect_raises(exc, fn, *args)
        count += 1
    expect_raises(ValueError, init_mpi, [0, 0])
    expect_raises(ValueError, init_mpi, [], None, 1.0)
    expect_raises(ValueError, init_mpi, [0], None, 0)
    count += 3
    # everything still works after the refused calls
    x0 = rt.to_device(np.ones(8, np.float32), 0)
    x1 = rt.to_device(np.ones(8, np.float32), 1)
    c0.all_reduce(x0, x0)
    c1.all_reduce(x1, x1)
    rt.synchronize()
    assert np.array_equal(x0.copy_to_host(), np.full(8, c0.size, np.float32))
    count += 1
    # a local rank that never joins: the other one times out, the communicator breaks
    c0.all_reduce(x0, x0)
    e = expect_raises(rt.KernelError, rt.default_stream(0).synchronize, 30)
    assert isinstance(e.__cause__, rt.WaitTimeoutError), repr(e.__cause__)
    assert "local rank(s) [1]" in str(e.__cause__), str(e.__cause__)
    e = expect_raises(rt.InvalidOperationError, c1.all_reduce, x1, x1)
    assert "broken" in str(e), str(e)
    count += 2
    for c in comms:
        c.destroy()
    expect_raises(rt.InvalidOperationError, c0.barrier)
    count += 1
    # abort releases a local rank waiting for its peer at once (no 60 s wait)
    comms = init_mpi([0, 1], timeout=60.0)
    assert comms[0].timeout == 60.0 and not comms[0].aborted
    comms[0].all_reduce(x0, x0)
    import time

    time.sleep(0.2)
    t = time.monotonic()
    comms[1].abort()
    e = expect_raises(rt.KernelError, rt.default_stream(0).synchronize, 30)
    assert isinstance(e.__cause__, rt.InvalidOperationError), repr(e.__cause__)
    assert "aborted" in str(e.__cause__), str(e.__cause__)
    assert time.monotonic() - t < 30
    expect_raises(rt.InvalidOperationError, comms[0].broadcast, x0, 0)
    assert comms[0].aborted and comms[1].aborted
    count += 2
    # a peer process that never joins: process 0 gives up after the timeout (MPI level)
    if world.size > 1:
        (solo,) = init_mpi([0], timeout=1.0)
        if world.rank == 0:
            solo.all_reduce(x0, x0)
            e = expect_raises(rt.KernelError, rt.default_stream(0).synchronize, 30)
            assert isinstance(e.__cause__, rt.WaitTimeoutError), repr(e.__cause__)
            assert "a peer process never joined" in str(e.__cause__), str(e.__cause__)
            expect_raises(rt.InvalidOperationError, solo.all_reduce, x0, x0)
            count += 2
        world.Barrier()
    report(world.rank, count)
    return 0


if __name__ == "__main__":
    mode = sys.argv[1]
    sys.exit(check(sys.argv[2]) if mode == "check" else errors())
