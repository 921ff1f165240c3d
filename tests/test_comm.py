"""runtime.comm: every collective, every reduction operator, several dtypes and sizes (sizes not
divisible by the rank count included) against numpy, for 1, 2, 3 and 8 in-process ranks; and
the failure paths (ranks that disagree, a rank that never joins, abort) ending in errors.

Reference semantics follow NCCL's (counts, in-place rules); the checks mirror nccl-tests'
per-collective expected results (src/common.cu: each rank's data, reduced on the host).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

import runtime
from runtime import comm

WAIT = 60.0
RANKS = [1, 2, 3, 8]
DTYPES = ["float32", "float64", "int32", "int64", "uint8"]
OPS = ["sum", "prod", "max", "min", "avg"]
SIZES = [1, 7, 1001, 40_013]


@pytest.fixture(scope="module", autouse=True)
def _runtime():
    runtime.init(device_count=8, memory="512MiB")
    yield
    runtime.shutdown()


@functools.cache
def comms(n: int) -> list[comm.Communicator]:
    return comm.init_all(range(n), timeout=WAIT)


def sync(cs) -> None:
    for c in cs:
        runtime.current_stream(c.device).synchronize(timeout=WAIT)


def data(rank: int, size: int, dtype: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed * 100 + rank)
    if dtype.startswith("float"):
        # Small integers as floats: sums, products and averages are exact in float32.
        return rng.integers(-4, 5, size).astype(dtype)
    if dtype == "uint8":
        return rng.integers(0, 256, size).astype(dtype)
    return rng.integers(-1000, 1001, size).astype(dtype)


def reference(op: str, xs: list[np.ndarray]) -> np.ndarray:
    """Reduce in rank order in the arrays' dtype (integers wrap, as on the device)."""
    acc = xs[0].copy()
    with np.errstate(over="ignore"):
        for x in xs[1:]:
            if op in ("sum", "avg"):
                acc = acc + x
            elif op == "prod":
                acc = acc * x
            elif op == "max":
                acc = np.maximum(acc, x)
            else:
                acc = np.minimum(acc, x)
        if op == "avg":
            n = len(xs)
            if acc.dtype.kind in "fc":
                acc = acc / acc.dtype.type(n)
            else:  # integer division truncating toward zero, as C's
                acc = (np.sign(acc) * (np.abs(acc.astype(np.int64)) // n)).astype(acc.dtype)
    return acc


@pytest.mark.parametrize("n", RANKS)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_reduce(n, op, dtype):
    cs = comms(n)
    for size in SIZES:
        for in_place in (False, True):
            xs = [data(r, size, dtype, size) for r in range(n)]
            if op == "prod" and dtype.startswith("float"):
                xs = [np.clip(x, -2, 2) for x in xs]  # stays exact for 8 ranks
            sends = [runtime.to_device(x, device=c.device) for c, x in zip(cs, xs)]
            recvs = sends if in_place else [runtime.empty(size, dtype, c.device) for c in cs]
            for c, s, r in zip(cs, sends, recvs):
                c.all_reduce(s, r, op=op)
            sync(cs)
            want = reference(op, xs)
            for r in recvs:
                np.testing.assert_array_equal(r.copy_to_host(), want)


@pytest.mark.parametrize("n", RANKS)
@pytest.mark.parametrize("dtype", ["float32", "int64", "uint8"])
def test_broadcast_and_reduce(n, dtype):
    cs = comms(n)
    for size in SIZES:
        for root in {0, n - 1}:
            xs = [data(r, size, dtype, size + root) for r in range(n)]
            bufs = [runtime.to_device(x, device=c.device) for c, x in zip(cs, xs)]
            for c, b in zip(cs, bufs):
                c.broadcast(b, root)
            sync(cs)
            for b in bufs:
                np.testing.assert_array_equal(b.copy_to_host(), xs[root])
            for op in OPS:
                sends = [runtime.to_device(x, device=c.device) for c, x in zip(cs, xs)]
                out = runtime.empty(size, dtype, cs[root].device)
                for r, c in enumerate(cs):
                    c.reduce(sends[r], out if r == root else None, root, op=op)
                sync(cs)
                np.testing.assert_array_equal(out.copy_to_host(), reference(op, xs))


@pytest.mark.parametrize("n", RANKS)
@pytest.mark.parametrize("dtype", ["float64", "int32", "uint8"])
def test_all_gather_reduce_scatter_all_to_all(n, dtype):
    cs = comms(n)
    for size in SIZES:
        xs = [data(r, size, dtype, size) for r in range(n)]
        sends = [runtime.to_device(x, device=c.device) for c, x in zip(cs, xs)]
        recvs = [runtime.empty(n * size, dtype, c.device) for c in cs]
        for c, s, r in zip(cs, sends, recvs):
            c.all_gather(s, r)
        sync(cs)
        for r in recvs:
            np.testing.assert_array_equal(r.copy_to_host(), np.concatenate(xs))
        for op in OPS:
            big = [data(r, n * size, dtype, size + 1) for r in range(n)]
            ins = [runtime.to_device(x, device=c.device) for c, x in zip(cs, big)]
            outs = [runtime.empty(size, dtype, c.device) for c in cs]
            for c, i, o in zip(cs, ins, outs):
                c.reduce_scatter(i, o, op=op)
            sync(cs)
            full = reference(op, big)
            for r, o in enumerate(outs):
                np.testing.assert_array_equal(o.copy_to_host(), full[r * size : (r + 1) * size])
        big = [data(r, n * size, dtype, size + 2) for r in range(n)]
        ins = [runtime.to_device(x, device=c.device) for c, x in zip(cs, big)]
        outs = [runtime.empty(n * size, dtype, c.device) for c in cs]
        for c, i, o in zip(cs, ins, outs):
            c.all_to_all(i, o)
        sync(cs)
        for q, o in enumerate(outs):
            want = np.concatenate([big[r][q * size : (q + 1) * size] for r in range(n)])
            np.testing.assert_array_equal(o.copy_to_host(), want)


def test_in_place_all_gather_and_reduce_scatter():
    n, size = 3, 5
    cs = comms(n)
    hosts = [np.full(n * size, -1, dtype="int64") for _ in range(n)]
    for r in range(n):
        hosts[r][r * size : (r + 1) * size] = r + 1
    bufs = [runtime.to_device(h, device=c.device) for c, h in zip(cs, hosts)]
    blocks = [b.view("int64", size, offset=r * size * 8) for r, b in enumerate(bufs)]
    for c, blk, b in zip(cs, blocks, bufs):
        c.all_gather(blk, b)
    sync(cs)
    for b in bufs:
        np.testing.assert_array_equal(b.copy_to_host(), np.repeat(np.arange(1, n + 1), size))
    for c, b, blk in zip(cs, bufs, blocks):
        c.reduce_scatter(b, blk)
    sync(cs)
    for r, blk in enumerate(blocks):
        np.testing.assert_array_equal(blk.copy_to_host(), np.full(size, n * (r + 1)))


def test_send_recv_and_group():
    cs = comms(2)
    a = runtime.to_device(np.arange(10, dtype="float32"), device=0)
    b = runtime.to_device(np.arange(10, 20, dtype="float32"), device=1)
    ra = runtime.empty(10, "float32", 0)
    rb = runtime.empty(10, "float32", 1)
    with comm.group():
        cs[0].send(a, 1)
        cs[0].recv(ra, 1)
        cs[1].send(b, 0)
        cs[1].recv(rb, 0)
    sync(cs)
    np.testing.assert_array_equal(ra.copy_to_host(), np.arange(10, 20))
    np.testing.assert_array_equal(rb.copy_to_host(), np.arange(10))


def test_explicit_streams_and_attributes():
    cs = comms(3)
    assert [c.rank for c in cs] == [0, 1, 2]
    assert all(c.size == 3 for c in cs)
    assert [c.device for c in cs] == [runtime.Device(i) for i in range(3)]
    streams = [runtime.Stream(c.device) for c in cs]
    bufs = [runtime.to_device(np.ones(100, "float32"), device=c.device) for c in cs]
    for c, b, s in zip(cs, bufs, streams):
        c.all_reduce(b, b, stream=s)
        c.barrier(stream=s)
    for s in streams:
        s.synchronize(timeout=WAIT)
    for b in bufs:
        np.testing.assert_array_equal(b.copy_to_host(), np.full(100, 3.0))


def test_mismatch_fails_on_every_rank():
    cs = comms(2)
    a = runtime.empty(4, "float32", 0)
    b = runtime.empty(5, "float32", 1)
    cs[0].all_reduce(a, a)
    cs[1].all_reduce(b, b)
    for c in cs:
        with pytest.raises(ValueError, match="different collectives"):
            runtime.current_stream(c.device).synchronize(timeout=WAIT)
    # Different operators, then different roots.
    b = runtime.empty(4, "float32", 1)
    cs[0].all_reduce(a, a, op="max")
    cs[1].all_reduce(b, b, op="min")
    cs[0].broadcast(a, 0)
    cs[1].broadcast(b, 1)
    for c in cs:
        with pytest.raises(ValueError, match="different collectives"):
            runtime.current_stream(c.device).synchronize(timeout=WAIT)


def test_missing_rank_times_out():
    cs = comm.init_all([0, 1], timeout=0.2)
    a = runtime.empty(4, "float32", 0)
    cs[0].all_reduce(a, a)
    with pytest.raises(runtime.WaitTimeoutError, match="waiting for ranks \\[1\\]"):
        runtime.current_stream(0).synchronize(timeout=WAIT)
    # The late rank fails too, at once.
    b = runtime.empty(4, "float32", 1)
    cs[1].all_reduce(b, b)
    with pytest.raises(runtime.WaitTimeoutError):
        runtime.current_stream(1).synchronize(timeout=WAIT)


def test_abort_releases_pending_collectives():
    cs = comm.init_all([0, 1, 2], timeout=600)
    a = runtime.empty(4, "float32", 0)
    s = runtime.Stream(0)
    cs[0].all_reduce(a, a, stream=s)
    assert not s.query()
    cs[2].abort()
    with pytest.raises(runtime.InvalidOperationError, match="aborted"):
        s.synchronize(timeout=WAIT)
    assert cs[1].aborted
    with pytest.raises(runtime.InvalidOperationError):
        cs[1].barrier()


def test_bad_arguments_raise_at_once():
    cs = comms(2)
    a = runtime.empty(4, "float32", 0)
    with pytest.raises(ValueError, match="op"):
        cs[0].all_reduce(a, a, op="mean")
    with pytest.raises(ValueError, match="dtype"):
        cs[0].all_reduce(a, runtime.empty(4, "int32", 0))
    with pytest.raises(ValueError, match="device"):
        cs[0].all_reduce(runtime.empty(4, "float32", 1), runtime.empty(4, "float32", 1))
    with pytest.raises(ValueError, match="root"):
        cs[0].broadcast(a, 2)
    with pytest.raises(ValueError, match="elements"):
        cs[0].all_gather(a, runtime.empty(4, "float32", 0))
    with pytest.raises(ValueError, match="twice"):
        comm.init_all([0, 0])
    with pytest.raises(TypeError):
        cs[0].broadcast(a, "0")
    c = comm.init_all([0])[0]
    c.destroy()
    with pytest.raises(runtime.InvalidHandleError):
        c.barrier()


def test_collective_in_a_captured_graph():
    cs = comms(2)
    bufs = [runtime.to_device(np.ones(8, "int64"), device=c.device) for c in cs]
    streams = [runtime.Stream(c.device) for c in cs]
    graphs = []
    for c, b, s in zip(cs, bufs, streams):
        s.begin_capture()
        c.all_reduce(b, b, stream=s)
        graphs.append(s.end_capture())
    for _ in range(3):
        for g, s in zip(graphs, streams):
            g.launch(s)
    for s in streams:
        s.synchronize(timeout=WAIT)
    for b in bufs:
        np.testing.assert_array_equal(b.copy_to_host(), np.full(8, 8))


def test_bench_busbw_and_runtime_measurement():
    from runtime.bench import comm as bench

    # nccl-tests: all_reduce busbw = algbw * 2(n-1)/n.
    assert bench.busbw(2, 10**9, 1.0) == pytest.approx(1.0)
    assert bench.busbw(4, 10**9, 1.0) == pytest.approx(1.5)
    assert bench.busbw(8, 10**9, 0.5) == pytest.approx(3.5)
    times = bench.measure_runtime(2, [4096])
    assert set(times) == {4096} and times[4096] > 0


# --- the other dtypes: small integers, float16 (rounded per step), complex, bool ------------

MORE_DTYPES = ["int8", "int16", "uint16", "uint32", "uint64", "float16", "complex64", "complex128"]


def small(rank: int, size: int, dtype: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed * 100 + rank)
    x = rng.integers(-2, 3, size)
    if dtype.startswith("complex"):
        return (x + 1j * rng.integers(-2, 3, size)).astype(dtype)
    if dtype.startswith("uint"):
        return np.abs(x).astype(dtype)
    return x.astype(dtype)


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("dtype", MORE_DTYPES)
def test_all_reduce_every_other_dtype(n, dtype):
    cs = comms(n)
    ops = ["sum", "prod", "avg"] + ([] if dtype.startswith("complex") else ["max", "min"])
    for op in ops:
        for size in (7, 1001):
            xs = [small(r, size, dtype, size) for r in range(n)]
            sends = [runtime.to_device(x, device=c.device) for c, x in zip(cs, xs)]
            recvs = [runtime.empty(size, dtype, c.device) for c in cs]
            for c, s, r in zip(cs, sends, recvs):
                c.all_reduce(s, r, op=op)
            sync(cs)
            want = reference(op, xs)
            for r in recvs:
                got = r.copy_to_host()
                if op == "avg" and dtype.startswith("complex"):
                    # numpy divides by complex(n) (Smith's algorithm); the device divides
                    # each part by n: equal to the last bit or so.
                    np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"{op} {size}")
                else:
                    np.testing.assert_array_equal(got, want, err_msg=f"{op} {size}")


@pytest.mark.parametrize("n", [2, 3])
def test_all_reduce_bool_is_or_and(n):
    """numpy's add/multiply on bool are logical or/and; max/min agree with them."""
    cs = comms(n)
    rng = np.random.default_rng(5)
    xs = [rng.integers(0, 2, 1001).astype(bool) for _ in range(n)]
    want_or = functools.reduce(np.logical_or, xs)
    want_and = functools.reduce(np.logical_and, xs)
    for op, want in (("sum", want_or), ("max", want_or), ("prod", want_and), ("min", want_and)):
        sends = [runtime.to_device(x, device=c.device) for c, x in zip(cs, xs)]
        recvs = [runtime.empty(1001, "bool", c.device) for c in cs]
        for c, s, r in zip(cs, sends, recvs):
            c.all_reduce(s, r, op=op)
        sync(cs)
        for r in recvs:
            np.testing.assert_array_equal(r.copy_to_host(), want, err_msg=op)


@pytest.mark.parametrize(
    "dtype, op", [("complex64", "max"), ("complex128", "min"), ("bool", "avg")]
)
def test_operators_without_meaning_for_the_dtype_are_refused(dtype, op):
    cs = comms(2)
    buf = runtime.empty(4, dtype, cs[0].device)
    with pytest.raises(ValueError, match=rf"op.*{op} is not defined for dtype {dtype}"):
        cs[0].all_reduce(buf, buf, op=op)
    with pytest.raises(ValueError, match="op"):
        cs[0].reduce_scatter(buf, buf[:2] if dtype != "bool" else buf[:2], op=op)


# --- issue 22: collectives under misuse -----------------------------------------------------


@pytest.mark.parametrize("how", ["slice", "add", "view"])
def test_in_place_blocks_made_by_slicing_pointer_arithmetic_or_view(how):
    """In-place all_gather/reduce_scatter on block ``rank`` of the buffer: ``buf[a:b]`` and
    ``buf + n`` were refused ("send and recv partly overlap") while ``view()`` was accepted;
    every way of making the block names the same bytes of one allocation."""
    n, size = 3, 4
    cs = comms(n)
    bufs = [runtime.to_device(np.full(n * size, -1, "int32"), device=c.device) for c in cs]

    def block(r, b):
        if how == "slice":
            return b[r * size : (r + 1) * size]
        if how == "add":
            return (b + r * size * 4).view("int32", (size,))
        return b.view("int32", size, offset=r * size * 4)

    blocks = [block(r, b) for r, b in enumerate(bufs)]
    for r, blk in enumerate(blocks):
        runtime.memcpy_host_to_device(blk, np.full(size, r + 1, "int32"))
    for c, blk, b in zip(cs, blocks, bufs):
        c.all_gather(blk, b)
    sync(cs)
    for b in bufs:
        np.testing.assert_array_equal(b.copy_to_host(), np.repeat(np.arange(1, n + 1), size))
    for c, b, blk in zip(cs, bufs, blocks):
        c.reduce_scatter(b, blk)
    sync(cs)
    for r, blk in enumerate(blocks):
        np.testing.assert_array_equal(blk.copy_to_host(), np.full(size, n * (r + 1)))
    # One element off is a partial overlap whichever way it was made.
    with pytest.raises(ValueError, match="partly overlap"):
        cs[0].all_gather(bufs[0][1 : size + 1], bufs[0])


def test_graph_replay_between_direct_collectives_at_different_speeds():
    """Direct, replay, direct on two ranks whose streams run at different speeds: captured
    collectives took their number when they ran and direct ones when issued, so the slow rank
    numbered its replay 1 where the fast one had 2, a deadlock until the timeout. Rank 1's
    stream is held back by a user event until rank 0 has issued everything."""
    cs = comm.init_all([0, 1], timeout=10.0)
    bufs = [runtime.to_device(np.ones(2, "int64"), device=c.device) for c in cs]
    streams = [runtime.Stream(c.device) for c in cs]
    graphs = []
    for c, b, s in zip(cs, bufs, streams):
        s.begin_capture()
        c.all_reduce(b, b, stream=s)
        graphs.append(s.end_capture())
    gate = runtime.Event.user()
    streams[1].wait_event(gate)
    cs[0].all_reduce(bufs[0], bufs[0], stream=streams[0])
    graphs[0].launch(streams[0])
    cs[0].all_reduce(bufs[0], bufs[0], stream=streams[0])
    cs[1].all_reduce(bufs[1], bufs[1], stream=streams[1])
    graphs[1].launch(streams[1])
    gate.set()
    cs[1].all_reduce(bufs[1], bufs[1], stream=streams[1])
    for s in streams:
        s.synchronize(timeout=WAIT)
    for b in bufs:
        np.testing.assert_array_equal(b.copy_to_host(), np.full(2, 8))


def test_more_than_1024_collectives_per_rank_in_one_group():
    """One thread queues 1,100 collectives for rank 0, then 1,100 for rank 1, in a group: the
    1,025th call blocked on rank 0's stream back-pressure (rank 1's calls never came) until
    the timeout. In a group calls never block; its end waits for room."""
    cs = comm.init_all([0, 1], timeout=30.0)
    bufs = [runtime.to_device(np.arange(3, dtype="int64"), device=c.device) for c in cs]
    with comm.group():
        for c, b in zip(cs, bufs):
            for _ in range(1100):
                c.all_reduce(b, b, op="max")
    sync(cs)
    for b in bufs:
        np.testing.assert_array_equal(b.copy_to_host(), np.arange(3))


def test_out_of_range_root_names_the_valid_ranks():
    """An out-of-range root said "(0..4)" for 4 ranks."""
    cs = comms(3)
    a = runtime.empty(4, "float32", 0)
    with pytest.raises(
        ValueError, match=r"root: 3 is not a rank of this communicator: its 3 ranks are 0 to 2"
    ):
        cs[0].broadcast(a, 3)
    with pytest.raises(ValueError, match=r"peer: 5 is not a rank.*0 to 2"):
        cs[0].send(a, 5)


# --- issue 25: the second round (translated upstream tests) ----------------------------------


def _ints(cs, values, dtype="int32"):
    return [runtime.to_device(np.array(v, dtype), device=c.device) for c, v in zip(cs, values)]


@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_bitwise_reductions_as_gloo(n):
    """torch test_c10d_gloo.py ``simple_reduce_tests``: BAND with one bit set per round, BOR
    and BXOR emulating a larger world (every rank contributes several values pre-combined)."""
    cs = comms(n)
    cases = []
    for i in range(4):
        cases.append(("band", [[r | (1 << i)] for r in range(n)], [1 << i]))
    for i in range(1, 5):
        cases.append(
            (
                "bor",
                [[functools.reduce(int.__or__, [r * i + j for j in range(i)])] for r in range(n)],
                [functools.reduce(int.__or__, range(n * i))],
            )
        )
        cases.append(
            (
                "bxor",
                [[functools.reduce(int.__xor__, [r * i + j for j in range(i)])] for r in range(n)],
                [functools.reduce(int.__xor__, range(n * i))],
            )
        )
    for op, inputs, want in cases:
        bufs = _ints(cs, inputs)
        for c, b in zip(cs, bufs):
            c.all_reduce(b, b, op=op)
        sync(cs)
        for b in bufs:
            np.testing.assert_array_equal(b.copy_to_host(), np.array(want, "int32"), err_msg=op)


@pytest.mark.parametrize("dtype", ["bool", "uint8", "int64", "uint64"])
def test_bitwise_reductions_every_integer_dtype_and_bool(dtype):
    cs = comms(3)
    rng = np.random.default_rng(3)
    if dtype == "bool":
        xs = [rng.integers(0, 2, 257).astype(bool) for _ in cs]
    else:
        xs = [rng.integers(0, 200, 257).astype(dtype) for _ in cs]
    for op, f in (("band", np.bitwise_and), ("bor", np.bitwise_or), ("bxor", np.bitwise_xor)):
        sends = [runtime.to_device(x, device=c.device) for c, x in zip(cs, xs)]
        recvs = [runtime.empty(257, dtype, c.device) for c in cs]
        for c, s, r in zip(cs, sends, recvs):
            c.all_reduce(s, r, op=op)
        sync(cs)
        for r in recvs:
            np.testing.assert_array_equal(r.copy_to_host(), f.reduce(xs), err_msg=op)
    with pytest.raises(ValueError, match="band is not defined for dtype float32"):
        b = runtime.empty(4, "float32", cs[0].device)
        cs[0].all_reduce(b, b, op="band")


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int32"])
def test_premul_sum_as_torch_nccl(dtype):
    """torch test_c10d_nccl.py ``test_allreduce_ops`` (Premul Sum): ``[rank + 1]`` reduced
    with ``_make_nccl_premul_sum(3.0)`` is ``3 n (n + 1) / 2``; here also per-rank factors
    (NCCL lets each rank create its own) and reduce_scatter (the ``premul_sum`` reduce-scatter
    test of the same file)."""
    n = 3
    cs = comms(n)
    bufs = [runtime.to_device(np.array([c.rank + 1], dtype), device=c.device) for c in cs]
    for c, b in zip(cs, bufs):
        c.all_reduce(b, b, op=comm.premul_sum(3.0))
    sync(cs)
    for b in bufs:
        np.testing.assert_array_equal(b.copy_to_host(), np.array([3 * n * (n + 1) / 2], dtype))
    # each rank its own factor (rank + 2): sum (r + 2)(r + 1)
    bufs = [runtime.to_device(np.array([c.rank + 1] * 5, dtype), device=c.device) for c in cs]
    for c, b in zip(cs, bufs):
        c.all_reduce(b, b, op=("premul_sum", c.rank + 2))
    sync(cs)
    want = sum((r + 2) * (r + 1) for r in range(n))
    for b in bufs:
        np.testing.assert_array_equal(b.copy_to_host(), np.full(5, want, dtype))
    # reduce_scatter: block r of sum over ranks of 0.5 * x (float) / 2 * x (int)
    f = 2 if dtype == "int32" else 0.5
    xs = [np.arange(n * 4, dtype=dtype) + r for r in range(n)]
    ins = [runtime.to_device(x, device=c.device) for c, x in zip(cs, xs)]
    outs = [runtime.empty(4, dtype, c.device) for c in cs]
    for c, i, o in zip(cs, ins, outs):
        c.reduce_scatter(i, o, op=comm.premul_sum(f))
    sync(cs)
    full = sum(x.astype("float64") * f for x in xs)
    for r, o in enumerate(outs):
        np.testing.assert_array_equal(o.copy_to_host(), full[r * 4 : (r + 1) * 4].astype(dtype))


def test_premul_sum_refusals():
    cs = comms(2)
    i = runtime.empty(4, "int32", 0)
    with pytest.raises(ValueError, match="factor"):
        cs[0].all_reduce(i, i, op=comm.premul_sum(0.5))
    b = runtime.empty(4, "bool", 0)
    with pytest.raises(ValueError, match="premul_sum is not defined for dtype bool"):
        cs[0].all_reduce(b, b, op=comm.premul_sum(2.0))
    with pytest.raises(ValueError, match="needs a factor"):
        cs[0].all_reduce(i, i, op="premul_sum")
    with pytest.raises(TypeError):
        comm.premul_sum("2")
    with pytest.raises(ValueError, match="finite"):
        cs[0].all_reduce(i, i, op=("premul_sum", float("nan")))


@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_scatter_and_gather_basics_as_gloo(n):
    """torch test_c10d_gloo.py ``_test_scatter_basics`` / ``_test_gather_basics``: every rank
    is the root once; scatter sends ``[i]`` to rank ``i``, gather collects ``[rank]`` from
    each. ``_test_*_stress`` run many rounds: here 50 per root, queued before one sync."""
    cs = comms(n)
    for root in range(n):
        # scatter: the root holds one element per rank
        send = runtime.to_device(np.arange(n, dtype="int64"), device=cs[root].device)
        outs = [runtime.to_device(np.array([-1], "int64"), device=c.device) for c in cs]
        for c, o in zip(cs, outs):
            c.scatter(send if c.rank == root else None, o, root)
        sync(cs)
        for i, o in enumerate(outs):
            np.testing.assert_array_equal(o.copy_to_host(), [i])
        # gather: the root collects every rank's element
        ins = [runtime.to_device(np.array([c.rank], "int64"), device=c.device) for c in cs]
        recv = runtime.to_device(np.full(n, -1, "int64"), device=cs[root].device)
        for c, i in zip(cs, ins):
            c.gather(i, recv if c.rank == root else None, root)
        sync(cs)
        np.testing.assert_array_equal(recv.copy_to_host(), np.arange(n))
    rounds = 50
    outs = [[runtime.empty(1, "int64", c.device) for _ in range(rounds * n)] for c in cs]
    gathered = [runtime.empty(n, "int64", cs[i % n].device) for i in range(rounds * n)]
    sources = [
        runtime.to_device(np.arange(n, dtype="int64") + it, device=cs[root].device)
        for it in range(rounds)
        for root in range(n)
    ]
    ins = [runtime.to_device(np.array([c.rank], "int64"), device=c.device) for c in cs]
    for c in cs:
        for k in range(rounds * n):
            root = k % n
            c.scatter(sources[k] if c.rank == root else None, outs[c.rank][k], root)
            c.gather(ins[c.rank], gathered[k] if c.rank == root else None, root)
    sync(cs)
    for k in range(rounds * n):
        it = k // n
        for c in cs:
            np.testing.assert_array_equal(outs[c.rank][k].copy_to_host(), [it + c.rank])
        np.testing.assert_array_equal(gathered[k].copy_to_host(), np.arange(n))


def test_gather_and_scatter_in_place_at_the_root_and_their_checks():
    """MPI_IN_PLACE at the root: its send is its own block of recv (gather), its recv its own
    block of send (scatter). torch ``test_gather_checks``: bad roots and sizes are refused."""
    n = 3
    cs = comms(n)
    root = 1
    recv = runtime.to_device(np.full(n * 2, -1, "float32"), device=cs[root].device)
    for c in cs:
        if c.rank == root:
            own = recv[root * 2 : (root + 1) * 2]
            runtime.memcpy_host_to_device(own, np.full(2, root, "float32"))
            c.gather(own, recv, root)
        else:
            c.gather(runtime.to_device(np.full(2, c.rank, "float32"), device=c.device), None, root)
    sync(cs)
    np.testing.assert_array_equal(recv.copy_to_host(), np.repeat(np.arange(n), 2))
    a = runtime.empty(2, "float32", 0)
    with pytest.raises(ValueError, match="root"):
        cs[0].gather(a, None, n)
    with pytest.raises(ValueError, match="recv"):
        cs[0].gather(a, None, 0)
    with pytest.raises(ValueError, match="elements"):
        cs[0].gather(a, runtime.empty(5, "float32", 0), 0)
    with pytest.raises(ValueError, match="dtype"):
        cs[0].gather(a, runtime.empty(6, "float64", 0), 0)
    with pytest.raises(ValueError, match="send"):
        cs[0].scatter(None, a, 0)


def test_all_reduce_coalesced_as_gloo():
    """torch test_c10d_gloo.py ``simple_coalesced_reduce_tests``: a list of tensors reduced
    in one call (in place, as ``allreduce_coalesced``), and out of place."""
    for n in (1, 2, 3, 8):
        cs = comms(n)
        fact = math.factorial
        cases = [
            (
                "sum",
                lambda r: [r + 1.0, (r + 1.0) ** 2],
                [n * (n + 1) / 2, n * (n + 1) * (2 * n + 1) / 6],
            ),
            ("prod", lambda r: [r + 1.0, r + 2.0], [fact(n), fact(n + 1)]),
            ("min", lambda r: [r + 0.0, r + 1.0], [0.0, 1.0]),
            ("max", lambda r: [r + 1.0, r + 2.0], [float(n), n + 1.0]),
        ]
        for op, inputs, want in cases:
            bufs = [
                [
                    runtime.to_device(np.array([v], "float32"), device=c.device)
                    for v in inputs(c.rank)
                ]
                for c in cs
            ]
            for c, bs in zip(cs, bufs):
                c.all_reduce_coalesced(bs, op=op)
            sync(cs)
            for bs in bufs:
                got = [b.copy_to_host()[0] for b in bs]
                np.testing.assert_array_equal(got, np.array(want, "float32"), err_msg=op)
    cs = comms(2)
    a = [
        runtime.to_device(np.arange(k + 1, dtype="float64"), device=c.device)
        for c in cs
        for k in range(3)
    ]
    sends = [a[:3], a[3:]]
    recvs = [[runtime.empty(k + 1, "float64", c.device) for k in range(3)] for c in cs]
    for c, s, r in zip(cs, sends, recvs):
        c.all_reduce_coalesced(s, r, op="sum")
    sync(cs)
    for rs in recvs:
        for k, r in enumerate(rs):
            np.testing.assert_array_equal(r.copy_to_host(), 2 * np.arange(k + 1))
    with pytest.raises(ValueError, match="share memory"):
        cs[0].all_reduce_coalesced([sends[0][0], sends[0][0]])
    with pytest.raises(ValueError, match="dtype"):
        cs[0].all_reduce_coalesced([sends[0][0], runtime.empty(2, "float32", 0)])


@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_all_to_all_single_unequal_split_as_torch(n):
    """torch distributed_test.py ``_test_all_to_all_single_unequal_split_helper``: rank r
    sends ``i + 1`` rows to rank ``i`` (rows of ``size`` elements) and receives ``r + 1`` rows
    from every rank; then the equal split (``_equal_split_helper``)."""
    cs = comms(n)
    ins, outs = [], []
    for c in cs:
        r = c.rank
        in_splits = [i + 1 for i in range(n)]
        out_splits = [r + 1] * n
        inp = runtime.to_device(np.ones((sum(in_splits), n), "float32") * r, device=c.device)
        out = runtime.to_device(np.ones(((r + 1) * n, n), "float32"), device=c.device)
        c.all_to_all_single(out, inp, out_splits, in_splits)
        ins.append(inp)
        outs.append(out)
    sync(cs)
    for c, out in zip(cs, outs):
        r = c.rank
        want = np.concatenate([np.ones((r + 1, n), "float32") * i for i in range(n)])
        np.testing.assert_array_equal(out.copy_to_host(), want)
    outs = [runtime.to_device(np.full((n, n), -1, "float32"), device=c.device) for c in cs]
    for c, o in zip(cs, outs):
        c.all_to_all_single(
            o, runtime.to_device(np.ones((n, n), "float32") * c.rank, device=c.device)
        )
    sync(cs)
    for o in outs:
        want = np.concatenate([np.ones((1, n), "float32") * i for i in range(n)])
        np.testing.assert_array_equal(o.copy_to_host(), want)


def test_all_to_all_single_refuses_split_sizes_whose_element_count_overflows():
    """A split of ``2**62 + 2`` rows of 4 elements was read as 8 elements (the product
    wrapped), and the exchange ran on rows the caller never named."""
    (c,) = comms(1)
    out = runtime.to_device(np.zeros((2, 4), "float32"), device=c.device)
    inp = runtime.to_device(np.ones((2, 4), "float32"), device=c.device)
    for args in (([2**62 + 2], None), (None, [2**62 + 2])):
        with pytest.raises(ValueError, match=r"split_sizes\[0\]: 4611686018427387906 rows of 4"):
            c.all_to_all_single(out, inp, *args)
    sync([c])
    np.testing.assert_array_equal(out.copy_to_host(), np.zeros((2, 4), "float32"))


@pytest.mark.parametrize("n", [2, 3, 8])
def test_all_gatherv_reduce_scatterv_all_to_allv(n):
    """MPI's ``Allgatherv`` / ``Reduce_scatter`` / ``Alltoallv`` semantics (torch's uneven
    ``all_gather`` and ``reduce_scatter``): counts per rank, a zero included; in place and
    not; counts that disagree fail on every rank."""
    cs = comms(n)
    counts = [(3 * q) % 4 for q in range(n)]
    displ = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int)
    total = sum(counts)
    xs = [np.arange(counts[q], dtype="int64") + 100 * q for q in range(n)]
    for in_place in (False, True):
        recvs = [runtime.to_device(np.full(total, -1, "int64"), device=c.device) for c in cs]
        for c, r in zip(cs, recvs):
            q = c.rank
            if in_place:
                send = r[displ[q] : displ[q] + counts[q]]
                runtime.memcpy_host_to_device(send, xs[q])
            else:
                send = runtime.to_device(xs[q], device=c.device)
            c.all_gatherv(send, r, counts)
        sync(cs)
        for r in recvs:
            np.testing.assert_array_equal(r.copy_to_host(), np.concatenate(xs))
        for op in ("sum", "max", "bxor"):
            big = [np.arange(total, dtype="int64") * (q + 1) for q in range(n)]
            ins = [runtime.to_device(b, device=c.device) for c, b in zip(cs, big)]
            outs = [
                ins[c.rank][displ[c.rank] : displ[c.rank] + counts[c.rank]]
                if in_place
                else runtime.empty(counts[c.rank], "int64", c.device)
                for c in cs
            ]
            for c, i, o in zip(cs, ins, outs):
                c.reduce_scatterv(i, o, counts, op=op)
            sync(cs)
            f = {"sum": np.add, "max": np.maximum, "bxor": np.bitwise_xor}[op]
            full = f.reduce(big)
            for c, o in zip(cs, outs):
                q = c.rank
                np.testing.assert_array_equal(
                    o.copy_to_host(), full[displ[q] : displ[q] + counts[q]]
                )
    # all_to_allv: rank a sends (a + b) % 3 elements to rank b
    sends, recvs = [], []
    for c in cs:
        a = c.rank
        sc = [(a + b) % 3 for b in range(n)]
        rc = [(b + a) % 3 for b in range(n)]
        s = runtime.to_device(np.arange(sum(sc), dtype="int64") + 1000 * a, device=c.device)
        r = runtime.empty(sum(rc), "int64", c.device)
        c.all_to_allv(s, sc, r, rc)
        sends.append(s)
        recvs.append(r)
    sync(cs)
    for c, r in zip(cs, recvs):
        b = c.rank
        parts = []
        for a in range(n):
            start = sum((a + j) % 3 for j in range(b))
            parts.append(np.arange(start, start + (a + b) % 3) + 1000 * a)
        np.testing.assert_array_equal(r.copy_to_host(), np.concatenate(parts))
    # ranks passing different counts fail on every rank
    for c in cs:
        cnt = [1] * n if c.rank else [2] + [1] * (n - 1)
        send = runtime.empty(cnt[c.rank], "int64", c.device)
        c.all_gatherv(send, runtime.empty(sum(cnt), "int64", c.device), cnt)
    for c in cs:
        with pytest.raises(ValueError, match="different collectives"):
            runtime.current_stream(c.device).synchronize(timeout=WAIT)


def test_out_of_place_broadcast():
    """``ncclBroadcast(sendbuff, recvbuff, count, root)`` (CuPy's
    ``NcclCommunicator.broadcast(sendbuf, recvbuf, ...)``): the root's send reaches every
    recv, its own included; the send is unchanged; other ranks pass no send."""
    for n in (1, 2, 3, 8):
        cs = comms(n)
        for root in {0, n - 1}:
            src = runtime.to_device(
                np.arange(1001, dtype="float64") * (root + 1), device=cs[root].device
            )
            recvs = [runtime.empty(1001, "float64", c.device) for c in cs]
            for c, r in zip(cs, recvs):
                c.broadcast(src if c.rank == root else None, root, recv=r)
            sync(cs)
            for r in recvs:
                np.testing.assert_array_equal(r.copy_to_host(), np.arange(1001) * (root + 1))
            np.testing.assert_array_equal(src.copy_to_host(), np.arange(1001) * (root + 1))
    cs = comms(2)
    with pytest.raises(ValueError, match="root"):
        cs[0].broadcast(None, 0, recv=runtime.empty(4, "float32", 0))
    with pytest.raises(TypeError, match="recv"):
        cs[0].broadcast(None, 0)


def test_split_as_torch_and_nccl():
    """torch test_c10d_nccl.py ``test_comm_split_subgroup`` (``new_group([0])`` splits rank
    0 off, the others pass no color) and NCCL's ``ncclCommSplit`` color/key semantics; one
    thread makes every rank's inside a group."""
    cs = comms(8)
    with comm.group():
        subs = [c.split(0 if c.rank == 0 else None) for c in cs]
    assert subs[1:] == [None] * 7
    (sub,) = [s for s in subs if s is not None]
    assert (sub.rank, sub.size, sub.device) == (0, 1, runtime.Device(0))
    t = runtime.to_device(np.array([5.0], "float32"), device=0)
    sub.broadcast(t, 0)
    sync([sub])
    np.testing.assert_array_equal(t.copy_to_host(), [5.0])
    # two colors, key reversing the order
    with comm.group():
        subs = [c.split(c.rank % 2, key=-c.rank) for c in cs]
    for c, s in zip(cs, subs):
        members = [q for q in range(8) if q % 2 == c.rank % 2][::-1]
        assert (s.rank, s.size, s.device.index) == (members.index(c.rank), 4, c.rank)
    bufs = [runtime.to_device(np.array([c.rank], "int64"), device=c.device) for c in cs]
    for s, b in zip(subs, bufs):
        s.all_reduce(b, b)
    sync(subs)
    for c, b in zip(cs, bufs):
        assert b.copy_to_host()[0] == sum(q for q in range(8) if q % 2 == c.rank % 2)
    # a split of a split; ranks on threads of their own (no group)
    import threading

    results = [None] * 4
    evens = [s for c, s in zip(cs, subs) if c.rank % 2 == 0]

    def split_on_thread(i):
        results[i] = evens[i].split(evens[i].rank // 2)

    threads = [threading.Thread(target=split_on_thread, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sorted((r.size, r.rank) for r in results) == [(2, 0), (2, 0), (2, 1), (2, 1)]
    with pytest.raises(ValueError, match="color"):
        cs[0].split(-1)
    with pytest.raises(TypeError, match="key"):
        cs[0].split(0, key="a")


def test_communicator_from_a_unique_id_as_cupy():
    """CuPy tests/cupy_tests/cuda_tests/test_nccl.py: ``test_single_proc_ring`` (one rank
    from ``get_unique_id()``), ``test_abort``, ``test_check_async_error``; then ranks on
    threads of their own, and one thread joining every rank inside a group."""
    import threading

    uid = comm.get_unique_id()
    assert isinstance(uid, bytes) and len(uid) == 128 and uid != comm.get_unique_id()
    c = comm.Communicator(1, uid, 0)
    assert (c.rank, c.size) == (0, 1)
    c.check_async_error()
    c.abort()
    with pytest.raises(runtime.InvalidOperationError, match="aborted"):
        c.check_async_error()
    c.destroy()
    uid = comm.get_unique_id()
    made = [None] * 4

    def join(rank):
        made[rank] = comm.Communicator(4, uid, rank, device=3 - rank)

    threads = [threading.Thread(target=join, args=(r,)) for r in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert [(m.rank, m.size, m.device.index) for m in made] == [(r, 4, 3 - r) for r in range(4)]
    bufs = [runtime.to_device(np.ones(3, "float32"), device=m.device) for m in made]
    for m, b in zip(made, bufs):
        m.all_reduce(b, b)
    sync(made)
    assert all((b.copy_to_host() == 4).all() for b in bufs)
    uid = comm.get_unique_id()
    with comm.group():
        made = [comm.Communicator(3, uid, r, device=r) for r in range(3)]
    assert [m.rank for m in made] == [0, 1, 2]
    # CuPy's form of the id (a tuple of ints) is accepted too
    uid = comm.get_unique_id()
    ints = tuple(b - 256 if b > 127 else b for b in uid)
    assert comm.Communicator(1, ints, 0).size == 1
    assert comm.Communicator(1, tuple(uid), 0).size == 1  # unsigned bytes too
    for bad in (300, -129):
        with pytest.raises(ValueError, match=f"comm_id: {bad} is not a byte"):
            comm.Communicator(1, (bad, *ints[1:]), 0)
    with pytest.raises(ValueError, match="comm_id"):
        comm.Communicator(1, b"x" * 128, 0)
    with pytest.raises(ValueError, match="rank"):
        comm.Communicator(2, comm.get_unique_id(), 2)
    uid = comm.get_unique_id()
    with pytest.raises(runtime.WaitTimeoutError, match=r"ranks \[1\] did not join"):
        comm.Communicator(2, uid, 0, timeout=0.2)


class _KeepingPeer:
    """A transport for process 0 of two, each with two devices, standing in for process 1.

    Its all-to-all keeps the receive region's ``DeviceBuffer`` and, from another thread,
    overwrites it with the runtime's own safe ``memset`` while the step is still going: a
    Python transport may keep what it is given. ``Pending.test`` lets that write land (up
    to ``LAND`` seconds) before it answers."""

    LAND = 2.0

    def __init__(self, count):
        import threading

        self.count = count
        self.thread = None
        self.landed = threading.Event()

    def reduces(self, dtype, op):
        return True

    def start(self, kind, *args):
        import threading

        if kind == "all_gather":  # connect: process 1 has two devices too
            buf, _counts = args
            np.asarray(buf)[8:16] = np.frombuffer(np.uint64(2).tobytes(), np.uint8)
            return None
        assert kind == "all_to_all", kind
        send, send_counts, recv, recv_counts = args
        s, r = np.asarray(send), np.asarray(recv)
        r[: recv_counts[0]] = s[: send_counts[0]]  # process 0 to itself
        # From process 1's ranks 2 and 3, a block for each local rank m: 100 * rank + m.
        blocks = [np.full(self.count, 100 * src + m, np.float32) for src in (2, 3) for m in (0, 1)]
        r[recv_counts[0] :] = np.concatenate(blocks).view(np.uint8)

        def overwrite():
            st = runtime.Stream(recv.device)
            runtime.memset(recv, 0xFF, stream=st)
            st.synchronize(timeout=WAIT)
            self.landed.set()

        self.thread = threading.Thread(target=overwrite)
        self.thread.start()
        landed = self.landed

        class Pending:
            def test(self):
                landed.wait(_KeepingPeer.LAND)
                return True

        return Pending()


def test_a_transport_keeping_staging_memory_cannot_change_a_collective_result():
    """The core reads its staging memory (here an all-to-all's receive buffer, when a process
    drives two ranks) without the allocation's lock. A Python transport is handed that
    memory as a ``DeviceBuffer``, and a safe ``memset`` of it from another thread ran at once,
    so the core copied out 0xFF bytes instead of process 1's blocks. The leader now holds
    staging memory while it uses it: the memset waits until the collective is done."""
    from runtime import _runtime as native

    count = 3
    peer = _KeepingPeer(count)
    c0, c1 = native.comm_connect([0, 1], 0, 2, peer, timeout=WAIT)
    sends = [
        runtime.to_device(np.arange(4 * count, dtype=np.float32) + 10 * r, device=r) for r in (0, 1)
    ]
    recvs = [runtime.to_device(np.zeros(4 * count, np.float32), device=r) for r in (0, 1)]
    streams = [runtime.Stream(r) for r in (0, 1)]
    with comm.group():
        for c, snd, rcv, st in zip((c0, c1), sends, recvs, streams):
            c.all_to_all(snd, rcv, st)
    for st in streams:
        st.synchronize(timeout=WAIT)
    peer.thread.join(WAIT)
    assert peer.landed.is_set()
    for m, rcv in enumerate(recvs):
        got = rcv.copy_to_host().reshape(4, count)
        for src in (0, 1):  # this process's ranks: block m of rank src's send
            want = np.arange(m * count, (m + 1) * count, dtype=np.float32) + 10 * src
            np.testing.assert_array_equal(got[src], want)
        for src in (2, 3):
            np.testing.assert_array_equal(got[src], np.full(count, 100 * src + m, np.float32))
