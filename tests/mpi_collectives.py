"""Run under ``mpiexec -n N``: every MPI collective of ``runtime._mpi`` checked against numpy.

``python mpi_collectives.py check DEVICES`` -- DEVICES is the devices each process drives, one
count for all (``2``) or one per process (``1,2,1``). Every rank makes its inputs from a seed
of (case, rank), so every process can compute the whole expected result with numpy.
``python mpi_collectives.py errors`` -- argument errors, a local rank that never joins (the
timeout), abort, and an aborted communicator refusing further calls.
``python mpi_collectives.py misuse CASE`` -- the collective misuse battery across processes
(issue 22): processes running the same program at different speeds with graph replays between
direct collectives, more than 1,024 collectives in one group, a process that dies.
``python mpi_collectives.py shapes DEVICES`` -- the second round's shapes (issue 25): bitwise
operators and premul_sum, gather, scatter, out-of-place broadcast, per-rank counts,
all_reduce_coalesced, torch's uneven all_to_all_single, split (colors spanning processes and
not), check_async_error.

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
import runtime.comm
from runtime._mpi import init_mpi

DTYPES = ("float32", "float64", "int32", "int64")
# What MPI cannot reduce (float16: the core gathers and reduces) or moves as bytes only.
MORE_DTYPES = ("float16", "complex64", "complex128", "bool", "uint8", "int16")
OPS = ("sum", "prod", "max", "min", "avg")
NP_OPS = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


def data(case: int, rank: int, n: int, dtype: str, op: str = "sum") -> np.ndarray:
    """Rank ``rank``'s input for ``case``: small values, so products and sums stay exact."""
    rng = np.random.default_rng([case, rank])
    if dtype == "bool":
        return rng.integers(0, 2, size=n).astype(bool)
    if dtype.startswith("complex"):
        return (rng.integers(-2, 3, size=n) + 1j * rng.integers(-2, 3, size=n)).astype(dtype)
    if dtype in ("float16", "uint8", "int16"):
        x = rng.integers(1, 3, size=n) if op == "prod" else rng.integers(0, 5, size=n)
        return x.astype(dtype)
    if op == "prod":
        x = rng.choice([1, 2, -1], size=n) if dtype.startswith("int") else rng.uniform(0.5, 1.5, n)
    else:
        x = rng.integers(-50, 50, size=n) if dtype.startswith("int") else rng.standard_normal(n)
    return x.astype(dtype)


def reduce_ref(op: str, xs: list[np.ndarray]) -> np.ndarray:
    if xs[0].dtype == bool:
        f = np.logical_or if op in ("sum", "max") else np.logical_and
        return f.reduce(np.stack(xs), axis=0)
    if op == "avg" and xs[0].dtype.kind == "c":
        return (np.sum(np.stack(xs), axis=0) / len(xs)).astype(xs[0].dtype)
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
        if got.dtype.kind in "fc":
            tol = {np.float16: 1e-2, np.float32: 1e-5, np.complex64: 1e-5}.get(
                got.dtype.type, 1e-12
            )
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
        assert rt_mpi._SERIAL_LOCK is not None and comms[0]._t.arrival is None
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
    # reduce in place at every root (issue 22: a root that is not its process's first local
    # rank got 9 where 10 was right with 2 processes x 2 devices)
    for root in all_ranks:
        case += 1
        bufs = [dev(np.full(3, c.rank + 1, np.int64), c) for c in comms]
        for c, b in zip(comms, bufs):
            c.reduce(b, b if c.rank == root else None, root)
        ch.sync()
        for c, b in zip(comms, bufs):
            want = size * (size + 1) // 2 if c.rank == root else c.rank + 1
            ch.expect(b.copy_to_host(), np.full(3, want, np.int64), f"in-place reduce to {root}")
    # in place through slicing and pointer arithmetic (issue 22: refused as partial overlaps)
    for how in ("slice", "add"):
        case += 1
        n, dt = 6, "float32"
        want = np.concatenate([data(case, r, n, dt) for r in all_ranks])
        recvs, blocks = [], []
        for c in comms:
            r = rt.empty(n * size, dt, c.device)
            blk = r[c.rank * n : (c.rank + 1) * n] if how == "slice" else (r + c.rank * n * 4)
            blk = blk.view(dt, (n,)) if how == "add" else blk
            rt.memcpy_host_to_device(blk, data(case, c.rank, n, dt))
            recvs.append(r)
            blocks.append(blk)
        for c, blk, r in zip(comms, blocks, recvs):
            c.all_gather(blk, r)
        ch.sync()
        for r in recvs:
            ch.expect(r.copy_to_host(), want, f"in-place all_gather through {how}")
        for c, r, blk in zip(comms, recvs, blocks):
            c.reduce_scatter(r, blk)
        ch.sync()
        for c, blk in zip(comms, blocks):
            part = want[c.rank * n : (c.rank + 1) * n] * size
            ch.expect(blk.copy_to_host(), part, f"in-place reduce_scatter through {how}")
    # every other dtype (issue 22: refused, "MPI cannot reduce"): float16 reduced by the core,
    # complex by MPI, booleans as bytes; data movement of every dtype as bytes; send to self
    for dtype in MORE_DTYPES:
        for n in (1, 70000):
            ops = ["sum", "prod"] + ([] if dtype.startswith("complex") else ["max", "min"])
            ops += [] if dtype == "bool" else ["avg"]
            for op in ops:
                case += 1
                xs = [data(case, r, n, dtype, op) for r in all_ranks]
                want = reduce_ref(op, xs)
                bufs = [dev(xs[c.rank], c) for c in comms]
                for c, b in zip(comms, bufs):
                    c.all_reduce(b, b, op=op)
                ch.sync()
                for b in bufs:
                    ch.expect(b.copy_to_host(), want, f"all_reduce {op} {dtype} n={n}")
                case += 1
                big = [data(case, r, n * size, dtype, op) for r in all_ranks]
                full = reduce_ref(op, big)
                ins = [dev(big[c.rank], c) for c in comms]
                outs = [rt.empty(n, dtype, c.device) for c in comms]
                for c, i, o in zip(comms, ins, outs):
                    c.reduce_scatter(i, o, op=op)
                ch.sync()
                for c, o in zip(comms, outs):
                    want = full[c.rank * n : (c.rank + 1) * n]
                    ch.expect(o.copy_to_host(), want, f"reduce_scatter {op} {dtype} n={n}")
            case += 1
            root = size - 1
            xs = [data(case, r, n, dtype) for r in all_ranks]
            bufs = [dev(xs[c.rank], c) for c in comms]
            for c, b in zip(comms, bufs):
                c.broadcast(b, root)
            ch.sync()
            for b in bufs:
                ch.expect(b.copy_to_host(), xs[root], f"broadcast {dtype} n={n}")
            case += 1
            recvs = []
            for c in comms:
                r = rt.empty(n * size, dtype, c.device)
                c.all_gather(dev(data(case, c.rank, n, dtype), c), r)
                recvs.append(r)
            ch.sync()
            want = np.concatenate([data(case, r, n, dtype) for r in all_ranks])
            for r in recvs:
                ch.expect(r.copy_to_host(), want, f"all_gather {dtype} n={n}")
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
            # a ring across processes, and each rank to itself
            case += 1
            streams, got = [], []
            for c in comms:
                s_send, s_recv = rt.Stream(c.device), rt.Stream(c.device)
                streams += [s_send, s_recv]
                x = dev(data(case, c.rank, n, dtype), c)
                c.send(x, (c.rank + 1) % size, stream=s_send)
                c.send(x, c.rank, stream=s_send)
                ring, own = rt.empty(n, dtype, c.device), rt.empty(n, dtype, c.device)
                c.recv(ring, (c.rank - 1) % size, stream=s_recv)
                c.recv(own, c.rank, stream=s_recv)
                got.append((c, ring, own))
            for s in streams:
                s.synchronize(timeout=120)
            for c, ring, own in got:
                ch.expect(ring.copy_to_host(), data(case, (c.rank - 1) % size, n, dtype), "ring")
                ch.expect(own.copy_to_host(), data(case, c.rank, n, dtype), "send to self")
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


def shapes(devices_arg: str) -> int:
    """Issue 25's shapes across processes, each checked against numpy in every process."""
    world = MPI.COMM_WORLD
    spec = [int(x) for x in devices_arg.split(",")]
    mine = spec[0] if len(spec) == 1 else spec[world.rank]
    rt.init(device_count=max(mine, 1), memory="256MiB")
    comms = init_mpi(list(range(mine)), timeout=120)
    ch = Checker(comms)
    size = comms[0].size
    all_ranks = range(size)
    case = 5000

    def dev(x, c):
        return rt.to_device(x, c.device)

    for n in (1, 4099, 70000):
        # bitwise operators over MPI (integers and bool as bytes)
        for dtype in ("int32", "int64", "uint8", "bool"):
            for op, f in (
                ("band", np.bitwise_and),
                ("bor", np.bitwise_or),
                ("bxor", np.bitwise_xor),
            ):
                case += 1
                xs = [
                    np.random.default_rng([case, r]).integers(0, 256, n).astype(dtype)
                    if dtype != "bool"
                    else data(case, r, n, "bool")
                    for r in all_ranks
                ]
                bufs = [dev(xs[c.rank], c) for c in comms]
                for c, b in zip(comms, bufs):
                    c.all_reduce(b, b, op=op)
                ch.sync()
                for b in bufs:
                    ch.expect(b.copy_to_host(), f.reduce(xs), f"all_reduce {op} {dtype} n={n}")
        # premul_sum with each rank's own factor (rank + 1), all_reduce and reduce_scatter
        for dtype in ("float32", "float64", "float16", "int64"):
            case += 1
            xs = [data(case, r, n * size, dtype) for r in all_ranks]
            want = sum(xs[r].astype("float64") * (r + 1) for r in all_ranks).astype(dtype)
            bufs = [dev(xs[c.rank], c) for c in comms]
            for c, b in zip(comms, bufs):
                c.all_reduce(b, b, op=("premul_sum", c.rank + 1))
            ch.sync()
            for b in bufs:
                ch.expect(b.copy_to_host(), want, f"premul_sum all_reduce {dtype} n={n}")
            ins = [dev(xs[c.rank], c) for c in comms]
            outs = [rt.empty(n, dtype, c.device) for c in comms]
            for c, i, o in zip(comms, ins, outs):
                c.reduce_scatter(i, o, op=runtime.comm.premul_sum(c.rank + 1))
            ch.sync()
            for c, o in zip(comms, outs):
                r = c.rank
                ch.expect(o.copy_to_host(), want[r * n : (r + 1) * n], f"premul_sum rs {dtype}")
        for dtype in ("float32", "int64", "complex64"):
            # gather and scatter at every root, in place at the root on odd roots
            for root in all_ranks:
                case += 1
                xs = [data(case, r, n, dtype) for r in all_ranks]
                got = None
                for c in comms:
                    if c.rank == root:
                        got = rt.empty(n * size, dtype, c.device)
                        item = np.dtype(dtype).itemsize
                        send = (
                            got.view(dtype, (n,), root * n * item)
                            if root % 2
                            else rt.empty(n, dtype, c.device)
                        )
                        rt.memcpy_host_to_device(send, xs[root])
                        c.gather(send, got, root)
                    else:
                        c.gather(dev(xs[c.rank], c), None, root)
                ch.sync()
                if got is not None:
                    ch.expect(got.copy_to_host(), np.concatenate(xs), f"gather to {root}")
                allx = data(case + 1, root, n * size, dtype)
                outs = []
                for c in comms:
                    out = rt.empty(n, dtype, c.device)
                    c.scatter(dev(allx, c) if c.rank == root else None, out, root)
                    outs.append(out)
                ch.sync()
                for c, o in zip(comms, outs):
                    r = c.rank
                    ch.expect(o.copy_to_host(), allx[r * n : (r + 1) * n], f"scatter {root}")
                # out-of-place broadcast
                src = data(case + 2, root, n, dtype)
                recvs = []
                for c in comms:
                    r = rt.empty(n, dtype, c.device)
                    c.broadcast(dev(src, c) if c.rank == root else None, root, recv=r)
                    recvs.append(r)
                ch.sync()
                for r in recvs:
                    ch.expect(r.copy_to_host(), src, f"broadcast(recv=) from {root}")
            # per-rank counts (a zero for rank 0)
            counts = [(r * (n % 7 + 1)) % 5 for r in all_ranks]
            displ = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int)
            total = sum(counts)
            case += 1
            xs = [data(case, r, 5, dtype)[: counts[r]] for r in all_ranks]
            recvs = []
            for c in comms:
                r = rt.empty(total, dtype, c.device)
                c.all_gatherv(dev(xs[c.rank], c), r, counts)
                recvs.append(r)
            ch.sync()
            for r in recvs:
                ch.expect(r.copy_to_host(), np.concatenate(xs), f"all_gatherv {dtype}")
            ops = ("sum", "prod") + (() if dtype.startswith("complex") else ("max",))
            for op in ops:
                case += 1
                big = [data(case, r, total, dtype, op) for r in all_ranks]
                full = reduce_ref(op, big)
                outs = []
                for c in comms:
                    o = rt.empty(counts[c.rank], dtype, c.device)
                    c.reduce_scatterv(dev(big[c.rank], c), o, counts, op=op)
                    outs.append(o)
                ch.sync()
                for c, o in zip(comms, outs):
                    q = c.rank
                    want = full[displ[q] : displ[q] + counts[q]]
                    ch.expect(o.copy_to_host(), want, f"reduce_scatterv {op} {dtype}")
            # all_to_allv: rank a sends (a + 2b) % 4 elements to rank b
            case += 1
            sc = [[(a + 2 * b) % 4 for b in all_ranks] for a in all_ranks]
            xs = [data(case, a, sum(sc[a]), dtype) for a in all_ranks]
            recvs = []
            for c in comms:
                a = c.rank
                rc = [sc[b][a] for b in all_ranks]
                r = rt.empty(sum(rc), dtype, c.device)
                c.all_to_allv(dev(xs[a], c), sc[a], r, rc)
                recvs.append(r)
            ch.sync()
            for c, r in zip(comms, recvs):
                b = c.rank
                parts = [xs[a][sum(sc[a][:b]) : sum(sc[a][: b + 1])] for a in all_ranks]
                ch.expect(r.copy_to_host(), np.concatenate(parts), f"all_to_allv {dtype}")
            # torch's all_to_all_single with unequal splits (distributed_test.py)
            outs = []
            for c in comms:
                r = c.rank
                in_splits = [i + 1 for i in all_ranks]
                inp = dev(np.ones((sum(in_splits), size), dtype) * r, c)
                out = rt.empty(((r + 1) * size, size), dtype, c.device)
                c.all_to_all_single(out, inp, [r + 1] * size, in_splits)
                outs.append(out)
            ch.sync()
            for c, o in zip(comms, outs):
                r = c.rank
                want = np.concatenate([np.ones((r + 1, size), dtype) * i for i in all_ranks])
                ch.expect(o.copy_to_host(), want, "all_to_all_single unequal")
            # all_reduce_coalesced: three buffers, one empty
            case += 1
            lens = (n, 0, 3)
            xs = [[data(case + k, r, lens[k], dtype) for r in all_ranks] for k in range(3)]
            got = []
            for c in comms:
                bufs = [dev(xs[k][c.rank], c) for k in range(3)]
                c.all_reduce_coalesced(bufs, op="sum")
                got.append(bufs)
            ch.sync()
            for bufs in got:
                for k, b in enumerate(bufs):
                    ch.expect(b.copy_to_host(), reduce_ref("sum", xs[k]), f"coalesced #{k}")
    # split: colors spanning processes (rank % 2) keyed by -rank, then one color per process
    # one thread splits every local rank: inside a group, made at the group's end
    with runtime.comm.group():
        subs = [c.split(c.rank % 2, key=-c.rank) for c in comms]
    for c, s in zip(comms, subs):
        members = [q for q in all_ranks if q % 2 == c.rank % 2][::-1]
        assert (s.rank, s.size) == (members.index(c.rank), len(members)), (c.rank, s.rank)
    bufs = [dev(np.array([c.rank], "int64"), c) for c in comms]
    for s, b in zip(subs, bufs):
        s.all_reduce(b, b)
    ch.sync()
    for c, b in zip(comms, bufs):
        want = sum(q for q in all_ranks if q % 2 == c.rank % 2)
        ch.expect(b.copy_to_host(), np.array([want]), "all_reduce on a split")
    with runtime.comm.group():
        per_process = [c.split(world.rank) for c in comms]
    assert all(s.size == mine and s.mpi_comm is None for s in per_process)
    with runtime.comm.group():
        none = [c.split(None) for c in comms]
    assert none == [None] * mine
    for c in comms:
        c.check_async_error()
    # an id made by another process is refused (ranks of other processes join by init_mpi)
    uid = world.bcast(runtime.comm.get_unique_id() if world.rank == 0 else None)
    if world.rank != 0:
        expect_raises(ValueError, runtime.comm.Communicator, world.size, uid, world.rank)
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
        (ValueError, c0.all_reduce, a, rt.empty(8, "float64", 0)),
        (ValueError, c0.all_reduce, a, a, "mean"),
        (ValueError, c0.all_reduce, b, b),
        (ValueError, c0.all_reduce, a, a, "sum", rt.Stream(1)),
        (ValueError, c0.broadcast, a, c0.size),
        (TypeError, c0.broadcast, a, 0.5),
        (ValueError, c0.all_gather, a, rt.empty(8, "float32", 0)),
        (ValueError, c0.reduce_scatter, a, a),
        (ValueError, c0.all_to_all, a, a),
        (ValueError, c0.send, a, c0.size),
        (ValueError, c0.reduce, a, None, c0.rank),
    ]
    for exc, fn, *args in checks:
        expect_raises(exc, fn, *args)
        count += 1
    e = expect_raises(ValueError, c0.broadcast, a, c0.size)
    # issue 22: "(0..4)" for 4 ranks
    last = c0.size - 1
    assert f"its {c0.size} ranks are 0 to {last}" in str(e), str(e)
    expect_raises(ValueError, init_mpi, [0, 0])
    expect_raises(ValueError, init_mpi, [], None, 1.0)
    expect_raises(ValueError, init_mpi, [0], None, 0)
    count += 4
    # everything still works after the refused calls
    x0 = rt.to_device(np.ones(8, np.float32), 0)
    x1 = rt.to_device(np.ones(8, np.float32), 1)
    c0.all_reduce(x0, x0)
    c1.all_reduce(x1, x1)
    rt.synchronize()
    assert np.array_equal(x0.copy_to_host(), np.full(8, c0.size, np.float32))
    count += 1
    # a local rank that never joins: the other one times out, naming it; the communicator is
    # aborted (the peer processes can no longer match its calls)
    c0.all_reduce(x0, x0)
    e = expect_raises(rt.WaitTimeoutError, rt.default_stream(0).synchronize, 30)
    assert f"waiting for ranks [{c1.rank}] of this process" in str(e), str(e)
    e = expect_raises(rt.InvalidOperationError, c1.all_reduce, x1, x1)
    assert "aborted" in str(e), str(e)
    count += 2
    for c in comms:
        c.destroy()
    expect_raises(rt.InvalidHandleError, c0.barrier)
    count += 1
    # abort releases a local rank waiting for its peer at once (no 60 s wait)
    comms = init_mpi([0, 1], timeout=60.0)
    assert comms[0].timeout == 60.0 and not comms[0].aborted
    comms[0].all_reduce(x0, x0)
    import time

    time.sleep(0.2)
    t = time.monotonic()
    comms[1].abort()
    e = expect_raises(rt.InvalidOperationError, rt.default_stream(0).synchronize, 30)
    assert "aborted" in str(e), str(e)
    assert time.monotonic() - t < 30
    expect_raises(rt.InvalidOperationError, comms[0].broadcast, x0, 0)
    assert comms[0].aborted and comms[1].aborted
    count += 2
    # a peer process that never joins: process 0 gives up after the timeout, naming the
    # processes and ranks that did not take part (issue 22: "waited for local rank(s) []")
    if world.size > 1:
        (solo,) = init_mpi([0], timeout=1.0)
        if world.rank == 0:
            solo.all_reduce(x0, x0)
            e = expect_raises(rt.WaitTimeoutError, rt.default_stream(0).synchronize, 30)
            others = list(range(1, world.size))
            assert f"one or more of processes {others} (ranks {others})" in str(e), str(e)
            expect_raises(rt.InvalidOperationError, solo.all_reduce, x0, x0)
            count += 2
        world.Barrier()
    report(world.rank, count)
    return 0


def misuse(case: str) -> int:
    """One case of the collective misuse battery across processes (issue 22)."""
    import time

    world = MPI.COMM_WORLD
    rt.init(device_count=2, memory="64MiB")
    count = 0
    if case == "speeds":
        # The same program on every process -- direct, graph replay, direct -- with the
        # processes at different speeds. Collectives took their numbers when issued and
        # captured ones when they ran, so a slow process numbered differently and both
        # deadlocked until the timeout; now a replay takes its numbers at launch.
        comms = init_mpi([0, 1], timeout=20.0)
        size = comms[0].size
        for slow in range(world.size):
            for pause_at in ("graph", "direct"):
                bufs = [rt.to_device(np.ones(4, np.int64), c.device) for c in comms]
                streams = [rt.Stream(c.device) for c in comms]
                graphs = []
                for c, b, s in zip(comms, bufs, streams):
                    s.begin_capture()
                    c.all_reduce(b, b, stream=s)
                    graphs.append(s.end_capture())
                me_slow = world.rank == slow
                for c, b, s in zip(comms, bufs, streams):
                    c.all_reduce(b, b, stream=s)
                if me_slow and pause_at == "graph":
                    time.sleep(0.3)
                for g, s in zip(graphs, streams):
                    g.launch(s)
                if me_slow and pause_at == "direct":
                    time.sleep(0.3)
                for c, b, s in zip(comms, bufs, streams):
                    c.all_reduce(b, b, stream=s)
                for s in streams:
                    s.synchronize(timeout=60)
                for b in bufs:
                    got = b.copy_to_host()
                    assert np.array_equal(got, np.full(4, size**3, np.int64)), got
                count += 1
    elif case == "long_group":
        # More than 1,024 collectives per rank in one group, issued rank by rank from one
        # thread: the 1,025th call blocked on the stream's back-pressure until the timeout.
        comms = init_mpi([0, 1], timeout=30.0)
        bufs = [rt.to_device(np.ones(2, np.int64), c.device) for c in comms]
        calls = 1100
        with rt.comm.group():
            for c, b in zip(comms, bufs):
                for _ in range(calls):
                    c.all_reduce(b, b, op="max")
        for c in comms:
            rt.current_stream(c.device).synchronize(timeout=60)
        for b in bufs:
            assert np.array_equal(b.copy_to_host(), np.ones(2, np.int64))
        count += 1
    elif case == "dead":
        # A process that stops taking part (as if it died): the others' collective fails with
        # WaitTimeoutError naming it, the communicator is aborted and refuses later calls, and
        # a new communicator of the live processes works.
        comms = init_mpi([0], timeout=1.0)
        x = rt.to_device(np.ones(3, np.float32), 0)
        dead = world.size - 1
        if world.rank != dead:
            comms[0].all_reduce(x, x)
            e = expect_raises(rt.WaitTimeoutError, rt.default_stream(0).synchronize, 60)
            named = str(e).split("one or more of processes [")[1].split("]")[0]
            assert str(dead) in named.split(", "), str(e)
            assert comms[0].aborted
            expect_raises(rt.InvalidOperationError, comms[0].barrier)
            count += 2
        live = world.Split(0 if world.rank != dead else MPI.UNDEFINED, world.rank)
        if world.rank != dead:
            # A fresh buffer: MPI may still write into the abandoned call's one.
            y = rt.to_device(np.ones(3, np.float32), 0)
            (c,) = init_mpi([0], mpi_comm=live, timeout=30.0)
            c.all_reduce(y, y)
            rt.default_stream(0).synchronize(timeout=60)
            assert np.array_equal(y.copy_to_host(), np.full(3, live.size, np.float32))
            count += 1
        world.Barrier()
    else:
        raise SystemExit(f"unknown misuse case {case!r}")
    report(world.rank, count)
    return 0


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "check":
        sys.exit(check(sys.argv[2]))
    if mode == "shapes":
        sys.exit(shapes(sys.argv[2]))
    sys.exit(misuse(sys.argv[2]) if mode == "misuse" else errors())
