"""runtime.comm: every collective, every reduction operator, several dtypes and sizes (sizes not
divisible by the rank count included) against numpy, for 1, 2, 3 and 8 in-process ranks; and
the failure paths (ranks that disagree, a rank that never joins, abort) ending in errors.

Reference semantics follow NCCL's (counts, in-place rules); the checks mirror nccl-tests'
per-collective expected results (src/common.cu: each rank's data, reduced on the host).
"""

from __future__ import annotations

import functools

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
