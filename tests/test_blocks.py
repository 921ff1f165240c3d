"""Multi-block launches: ``block_dim`` on ``Stream.launch_kernel`` and ``Kernel.__call__``,
``runtime.get_block_idx()`` / ``get_block_num()``, the built-ins split into blocks, and bad
``block_dim`` values refused before anything is queued."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import runtime
from runtime import kernels

WAIT = 30.0


@pytest.fixture(scope="module", autouse=True)
def _runtime():
    runtime.init(device_count=2, memory="1GiB")
    yield
    runtime.shutdown()


@pytest.fixture
def stream():
    s = runtime.Stream(0)
    yield s
    try:
        s.synchronize(timeout=WAIT)
    except runtime.KernelError:
        pass
    s.destroy()


@pytest.mark.parametrize("block_dim", [1, 2, 5, 32])
def test_every_block_of_a_python_kernel_runs_once_with_its_index(stream, block_dim):
    seen = []
    lock = threading.Lock()

    def k(marks):
        i, n = runtime.get_block_idx(), runtime.get_block_num()
        with lock:
            seen.append((i, n))
        marks[i] += 1  # numpy view of the buffer

    marks = runtime.zeros(block_dim, "int32")
    stream.launch_kernel(k, (marks,), block_dim=block_dim)
    stream.synchronize(timeout=WAIT)
    assert sorted(seen) == [(i, block_dim) for i in range(block_dim)]
    assert np.asarray(marks).tolist() == [1] * block_dim


def test_a_python_kernel_without_block_dim_is_one_block(stream):
    seen = []
    stream.launch_kernel(lambda: seen.append((runtime.get_block_idx(), runtime.get_block_num())))
    stream.synchronize(timeout=WAIT)
    assert seen == [(0, 1)]


def test_block_index_is_undefined_outside_a_kernel(stream):
    with pytest.raises(runtime.InvalidOperationError, match="inside a running kernel"):
        runtime.get_block_idx()
    with pytest.raises(runtime.InvalidOperationError):
        runtime.get_block_num()
    # A host function is not a kernel either.
    caught = []

    def host():
        try:
            runtime.get_block_idx()
        except runtime.InvalidOperationError as e:
            caught.append(e)

    stream.launch_host_func(host)
    stream.synchronize(timeout=WAIT)
    assert len(caught) == 1


def test_a_failing_block_fails_the_launch_naming_it(stream):
    def k():
        if runtime.get_block_idx() in (2, 3):
            raise ZeroDivisionError(f"block {runtime.get_block_idx()}")

    stream.launch_kernel(k, block_dim=4)
    with pytest.raises(runtime.KernelError) as info:
        stream.synchronize(timeout=WAIT)
    e = info.value
    assert e.block == 2 and e.code is None
    assert "block 2 of 4" in str(e)
    assert isinstance(e.__cause__, ZeroDivisionError)
    stream.launch_kernel(lambda: None, block_dim=3)
    stream.synchronize(timeout=WAIT)


def test_graphs_keep_block_dim(stream):
    marks = runtime.zeros(4, "int32")

    def k(m):
        m[runtime.get_block_idx()] += 1

    stream.begin_capture()
    stream.launch_kernel(k, (marks,), block_dim=4)
    g = stream.end_capture()
    for _ in range(3):
        g.launch(stream)
    stream.synchronize(timeout=WAIT)
    assert np.asarray(marks).tolist() == [3, 3, 3, 3]


@pytest.mark.parametrize("bad", [0, -1, runtime.MAX_BLOCK_DIM + 1, 2**64])
def test_bad_block_dim_values_are_refused_and_queue_nothing(stream, bad):
    ran = []
    with pytest.raises(ValueError, match="block_dim"):
        stream.launch_kernel(lambda: ran.append(1), block_dim=bad)
    x = runtime.zeros(4, "float32")
    with pytest.raises(ValueError, match="block_dim"):
        kernels.fill(x, 1.0, stream=stream, block_dim=bad)
    stream.synchronize(timeout=WAIT)
    assert ran == [] and np.asarray(x).tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize(
    "bad", [1.0, "2", True, [2], 2 + 0j, np.float32(2), np.bool_(True), np.complex64(2)]
)
def test_block_dim_of_a_wrong_type_is_a_type_error(stream, bad):
    with pytest.raises(TypeError, match="block_dim"):
        stream.launch_kernel(lambda: None, block_dim=bad)
    with pytest.raises(TypeError, match="block_dim"):
        kernels.noop(stream=stream, block_dim=bad)


def test_numpy_integers_are_accepted_as_block_dim(stream):
    marks = runtime.zeros(3, "int32")

    def k(m):
        m[runtime.get_block_idx()] = runtime.get_block_num()

    stream.launch_kernel(k, (marks,), block_dim=np.int64(3))
    stream.synchronize(timeout=WAIT)
    assert np.asarray(marks).tolist() == [3, 3, 3]


@pytest.mark.parametrize("n", [0, 1, 63, 4097, 1 << 18])
@pytest.mark.parametrize("block_dim", [None, 1, 2, 3, 16])
def test_built_ins_give_numpys_results_in_any_number_of_blocks(stream, n, block_dim):
    rng = np.random.default_rng(n)
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    da, db, out = runtime.to_device(a), runtime.to_device(b), runtime.empty(n, "float32")
    kernels.add(out, da, db, stream=stream, block_dim=block_dim)
    stream.synchronize(timeout=WAIT)
    np.testing.assert_array_equal(np.asarray(out), a + b)
    kernels.mul(out, out, db, stream=stream, block_dim=block_dim)  # in place
    kernels.scale(da, da, 2.0, stream=stream, block_dim=block_dim)
    kernels.fill(db, 3, stream=stream, block_dim=block_dim)
    stream.synchronize(timeout=WAIT)
    np.testing.assert_array_equal(np.asarray(out), (a + b) * b)
    np.testing.assert_array_equal(np.asarray(da), 2 * a)
    np.testing.assert_array_equal(np.asarray(db), np.full(n, 3, np.float32))
    if n:
        s = runtime.empty(1, "float64")
        x = runtime.to_device(a.astype(np.float64))
        kernels.sum(s, x, stream=stream, block_dim=block_dim)
        stream.synchronize(timeout=WAIT)
        np.testing.assert_allclose(np.asarray(s)[0], a.astype(np.float64).sum(), rtol=1e-9)


@pytest.mark.parametrize("shape", [(1, 3, 2), (7, 5, 3), (256, 64, 128)])
@pytest.mark.parametrize("block_dim", [None, 1, 3, 8])
def test_matmul_in_blocks_matches_numpy(stream, shape, block_dim):
    m, k, n = shape
    rng = np.random.default_rng(m)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c = runtime.empty((m, n), "float32")
    kernels.matmul(
        c, runtime.to_device(a), runtime.to_device(b), stream=stream, block_dim=block_dim
    )
    stream.synchronize(timeout=WAIT)
    np.testing.assert_allclose(np.asarray(c), a @ b, rtol=1e-4, atol=1e-4)
    ai = rng.integers(-9, 9, (m, k)).astype(np.int32)
    bi = rng.integers(-9, 9, (k, n)).astype(np.int32)
    ci = runtime.empty((m, n), "int32")
    kernels.matmul(
        ci, runtime.to_device(ai), runtime.to_device(bi), stream=stream, block_dim=block_dim
    )
    stream.synchronize(timeout=WAIT)
    np.testing.assert_array_equal(np.asarray(ci), ai @ bi)


def test_an_ascend_c_style_add_custom_in_numba(stream):
    """The operator author's tour in miniature: tiled by block index, block_dim=8."""
    numba = pytest.importorskip("numba")
    from numba import carray, types

    @numba.cfunc(types.int32(types.uint32, types.uint32, types.CPointer(types.voidptr)))
    def add_custom(block_idx, block_num, params):
        total = carray(params[3], (1,), np.int64)[0]
        block_len = total // block_num
        start = block_idx * block_len
        end = total if block_idx == block_num - 1 else start + block_len
        x = carray(params[0], (total,), np.float32)
        y = carray(params[1], (total,), np.float32)
        z = carray(params[2], (total,), np.float32)
        for i in range(start, end):
            z[i] = x[i] + y[i]
        return 0

    k = runtime.Kernel.from_cfunc(add_custom, nargs=4, read_only=(0, 1))
    n = 8 * 2048 + 5
    x = np.arange(n, dtype=np.float32)
    y = np.ones(n, np.float32)
    z = runtime.empty(n, "float32")
    k(runtime.to_device(x), runtime.to_device(y), z, n, stream=stream, block_dim=8)
    stream.synchronize(timeout=WAIT)
    np.testing.assert_array_equal(np.asarray(z), x + y)
