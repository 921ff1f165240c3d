"""Native kernels behind the C ABI of ``runtime/kernel.h``: C compiled here with ``cc``
(skipped without a compiler), ctypes function pointers and numba ``@cfunc`` (skipped without
numba); they run without the GIL, in blocks, report their codes, replay in graphs, and bad
kernel objects are refused."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import threading
import time

import numpy as np
import pytest

import runtime

WAIT = 30.0

C_SOURCE = r"""
#include <runtime/kernel.h>

/* out[i] = x[i] + y[i] over this block's share of n. */
RUNTIME_KERNEL(add_custom) {
    float *out = (float *)params[0];
    const float *x = (const float *)params[1];
    const float *y = (const float *)params[2];
    int64_t n = *(const int64_t *)params[3];
    uint64_t lo, hi;
    runtime_block_range((uint64_t)n, block_idx, block_num, &lo, &hi);
    for (uint64_t i = lo; i < hi; i++) out[i] = x[i] + y[i];
    return 0;
}

/* marks[block_idx] += 1 (int32), nums[block_idx] = block_num */
RUNTIME_KERNEL(census) {
    int32_t *marks = (int32_t *)params[0];
    int32_t *nums = (int32_t *)params[1];
    __atomic_fetch_add(&marks[block_idx], 1, __ATOMIC_SEQ_CST);
    nums[block_idx] = (int32_t)block_num;
    return 0;
}

/* Every block arrives, then waits (up to ~10 s) for block_num arrivals: 1 when alone. */
RUNTIME_KERNEL(rendezvous) {
    int32_t *arrived = (int32_t *)params[0];
    __atomic_fetch_add(arrived, 1, __ATOMIC_SEQ_CST);
    for (long spins = 0; __atomic_load_n(arrived, __ATOMIC_SEQ_CST) < (int32_t)block_num; spins++) {
        if (spins > 2000000000L) return 1;
    }
    return 0;
}

/* Spins until *flag becomes non-zero (set by the host while this runs): 1 after ~10 s. */
RUNTIME_KERNEL(wait_flag) {
    int32_t *flag = (int32_t *)params[0];
    for (long spins = 0; __atomic_load_n(flag, __ATOMIC_SEQ_CST) == 0; spins++) {
        if (spins > 4000000000L) return 1;
    }
    return 0;
}

/* Fails with 100 + block_idx in blocks >= 2. */
RUNTIME_KERNEL(fail_late) { return block_idx >= 2 ? 100 + (int32_t)block_idx : 0; }

/* *out = the scalar argument's bits, to check how scalars arrive. */
RUNTIME_KERNEL(scalars) {
    int64_t *out = (int64_t *)params[0];
    out[0] = *(const int64_t *)params[1];
    out[1] = (int64_t)(*(const double *)params[2] * 1000.0);
    out[2] = (int64_t)(*(const float *)params[3] * 1000.0f);
    out[3] = (int64_t)(*(const int16_t *)params[4]);
    out[4] = (int64_t)(((const double *)params[5])[1]);
    return 0;
}
"""


@pytest.fixture(scope="module", autouse=True)
def _runtime():
    runtime.init(device_count=2, memory="512MiB")
    yield
    runtime.shutdown()


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    """The kernels above as a shared library (skip without a C compiler)."""
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        pytest.skip("no C compiler (cc) to build the test kernels")
    d = tmp_path_factory.mktemp("kernels")
    src, so = d / "kernels.c", d / "libkernels.so"
    src.write_text(C_SOURCE)
    subprocess.run(
        [cc, "-O2", "-shared", "-fPIC", "-I", runtime.get_include(), str(src), "-o", str(so)],
        check=True,
        capture_output=True,
    )
    return str(so)


@pytest.fixture
def stream():
    s = runtime.Stream(0)
    yield s
    try:
        s.synchronize(timeout=WAIT)
    except runtime.KernelError:
        pass
    s.destroy()


def test_the_header_is_shipped_under_get_include():
    h = os.path.join(runtime.get_include(), "runtime", "kernel.h")
    with open(h) as f:
        text = f.read()
    assert (
        "int32_t (*runtime_kernel_fn)(uint32_t block_idx, uint32_t block_num, void **params)"
        in text
    )


def test_a_c_kernel_adds_in_blocks(lib, stream):
    k = runtime.Kernel.load(lib, "add_custom", nargs=4, read_only=(1, 2))
    assert k.name == "add_custom"
    n = 100_003
    x = np.arange(n, dtype=np.float32)
    y = np.full(n, 0.5, np.float32)
    dx, dy = runtime.to_device(x), runtime.to_device(y)
    for block_dim in (1, 2, 3, 8, 64):
        out = runtime.empty(n, "float32")
        k(out, dx, dy, n, stream=stream, block_dim=block_dim)
        stream.synchronize(timeout=WAIT)
        np.testing.assert_array_equal(np.asarray(out), x + y)
    # The declared argument count is checked at the call, and nothing is queued.
    with pytest.raises(ValueError, match="4 arguments"):
        k(out, dx, dy, stream=stream)


def test_every_block_runs_exactly_once_with_its_index(lib, stream):
    k = runtime.Kernel.load(lib, "census")
    for block_dim in (1, 2, 7, 100):
        marks = runtime.zeros(block_dim, "int32")
        nums = runtime.zeros(block_dim, "int32")
        stream.launch_kernel(k, (marks, nums), block_dim=block_dim)
        stream.synchronize(timeout=WAIT)
        assert np.asarray(marks).tolist() == [1] * block_dim
        assert np.asarray(nums).tolist() == [block_dim] * block_dim


def test_blocks_of_one_native_launch_overlap_in_time(lib, stream):
    """Each block waits for the other to arrive: only blocks running at once succeed."""
    k = runtime.Kernel.load(lib, "rendezvous")
    arrived = runtime.zeros(1, "int32")
    k(arrived, stream=stream, block_dim=2)
    stream.synchronize(timeout=WAIT)
    assert np.asarray(arrived)[0] == 2


def test_blocks_overlap_when_nobody_waits_on_the_stream(lib, stream):
    """As above, waited for through an event: no thread waiting on the stream runs a block,
    so the second block needs a worker woken for it."""
    k = runtime.Kernel.load(lib, "rendezvous")
    add = runtime.kernels.add
    x = runtime.to_device(np.ones(1 << 12, np.float32))
    out = runtime.empty(1 << 12, "float32")
    for i in range(20):
        # short two-block launches before it on the same stream, as a loop would have
        for _ in range(i % 3):
            add(out, x, x, stream=stream, block_dim=2)
        arrived = runtime.zeros(1, "int32")
        k(arrived, stream=stream, block_dim=2)
        done = runtime.Event()
        done.record(stream)
        done.synchronize(timeout=WAIT)
        assert np.asarray(arrived)[0] == 2
    stream.synchronize(timeout=WAIT)


def test_a_native_kernel_does_not_hold_the_gil(lib, stream):
    """The kernel spins until the main thread, running Python meanwhile, sets its flag."""
    k = runtime.Kernel.load(lib, "wait_flag")
    flag = runtime.zeros(1, "int32")
    view = np.asarray(flag)  # the documented unordered path: numpy's view of device memory
    k(flag, stream=stream)
    ticks = 0
    deadline = time.monotonic() + 0.05
    while time.monotonic() < deadline:  # Python work while the kernel runs
        ticks += 1
    assert not stream.query(), "the kernel still spins"
    view[0] = 1
    stream.synchronize(timeout=WAIT)
    assert ticks > 0


def test_a_native_kernel_runs_while_another_thread_holds_the_gil(lib):
    """Two streams of a GIL-free kernel progress while a Python thread spins."""
    k = runtime.Kernel.load(lib, "add_custom", nargs=4)
    n = 1 << 16
    a = runtime.to_device(np.ones(n, np.float32))
    outs = [runtime.empty(n, "float32") for _ in range(2)]
    streams = [runtime.Stream(0), runtime.Stream(0)]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            pass

    t = threading.Thread(target=spin)
    t.start()
    try:
        for _ in range(20):
            for s, o in zip(streams, outs):
                k(o, a, a, n, stream=s)
        for s in streams:
            s.synchronize(timeout=WAIT)
    finally:
        stop.set()
        t.join()
    for o in outs:
        np.testing.assert_array_equal(np.asarray(o), np.full(n, 2, np.float32))
    for s in streams:
        s.destroy()


def test_error_codes_surface_and_the_stream_goes_on(lib, stream):
    bad = runtime.Kernel.load(lib, "fail_late")
    bad(stream=stream, block_dim=5)
    with pytest.raises(runtime.KernelError) as info:
        stream.synchronize(timeout=WAIT)
    e = info.value
    assert (e.code, e.block, e.kernel) == (102, 2, "fail_late")
    assert "block 2 of 5" in str(e) and "returned 102" in str(e)
    # The stream runs what comes next.
    marks = runtime.zeros(3, "int32")
    nums = runtime.zeros(3, "int32")
    runtime.Kernel.load(lib, "census")(marks, nums, stream=stream, block_dim=3)
    stream.synchronize(timeout=WAIT)
    assert np.asarray(marks).tolist() == [1, 1, 1]
    # A single block that succeeds reports nothing.
    bad(stream=stream, block_dim=2)
    stream.synchronize(timeout=WAIT)


def test_scalars_arrive_as_the_abi_says(lib, stream):
    k = runtime.Kernel.load(lib, "scalars")
    out = runtime.zeros(5, "int64")
    k(out, -(2**40), 2.5, np.float32(1.25), np.int16(-7), 3 + 4j, stream=stream)
    stream.synchronize(timeout=WAIT)
    assert np.asarray(out).tolist() == [-(2**40), 2500, 1250, -7, 4]


def test_graphs_replay_multi_block_native_kernels(lib, stream):
    k = runtime.Kernel.load(lib, "census")
    marks = runtime.zeros(6, "int32")
    nums = runtime.zeros(6, "int32")
    stream.begin_capture()
    k(marks, nums, stream=stream, block_dim=6)
    g = stream.end_capture()
    assert np.asarray(marks).tolist() == [0] * 6, "captured work does not run"
    for _ in range(4):
        g.launch(stream)
    stream.synchronize(timeout=WAIT)
    assert np.asarray(marks).tolist() == [4] * 6
    assert np.asarray(nums).tolist() == [6] * 6


def test_a_ctypes_function_pointer_is_a_kernel(lib, stream):
    proto = ctypes.CFUNCTYPE(
        ctypes.c_int32, ctypes.c_uint32, ctypes.c_uint32, ctypes.POINTER(ctypes.c_void_p)
    )
    fn = proto(("add_custom", ctypes.CDLL(lib)))
    k = runtime.Kernel.from_cfunc(fn, name="ctypes_add")
    assert k.name == "ctypes_add"
    n = 1000
    x = runtime.to_device(np.arange(n, dtype=np.float32))
    out = runtime.empty(n, "float32")
    k(out, x, x, n, stream=stream, block_dim=4)
    stream.synchronize(timeout=WAIT)
    np.testing.assert_array_equal(np.asarray(out), 2 * np.arange(n, dtype=np.float32))
    # An integer address works too (the caller keeps the code alive).
    addr = ctypes.cast(fn, ctypes.c_void_p).value
    k2 = runtime.Kernel.from_cfunc(addr)
    k2(out, x, out, n, stream=stream, block_dim=2)
    stream.synchronize(timeout=WAIT)
    np.testing.assert_array_equal(np.asarray(out), 3 * np.arange(n, dtype=np.float32))


def test_a_numba_cfunc_is_a_kernel(stream):
    numba = pytest.importorskip("numba")
    from numba import carray, types

    sig = types.int32(types.uint32, types.uint32, types.CPointer(types.voidptr))

    @numba.cfunc(sig)
    def axpy(block_idx, block_num, params):
        n = carray(params[2], (1,), np.int64)[0]
        alpha = carray(params[3], (1,), np.float64)[0]
        y = carray(params[0], (n,), np.float32)
        x = carray(params[1], (n,), np.float32)
        lo = n * block_idx // block_num
        hi = n * (block_idx + 1) // block_num
        for i in range(lo, hi):
            y[i] += np.float32(alpha) * x[i]
        return 0

    k = runtime.Kernel.from_cfunc(axpy, nargs=4, read_only=[1])
    n = 10_001
    xs = np.linspace(-1, 1, n).astype(np.float32)
    x, y = runtime.to_device(xs), runtime.zeros(n, "float32")
    for block_dim in (1, 2, 8):
        k(y, x, n, 0.5, stream=stream, block_dim=block_dim)
    stream.synchronize(timeout=WAIT)
    want = np.zeros(n, np.float32)
    for _ in range(3):
        want += np.float32(0.5) * xs
    np.testing.assert_allclose(np.asarray(y), want, rtol=1e-6)


@pytest.mark.parametrize(
    "obj", [None, "add_custom", 1.5, True, object(), [1], np.float64(3)], ids=repr
)
def test_bad_kernel_objects_are_refused(obj):
    with pytest.raises(TypeError, match="from_cfunc"):
        runtime.Kernel.from_cfunc(obj)


def test_a_null_address_and_bad_declarations_are_refused():
    with pytest.raises(ValueError, match="address"):
        runtime.Kernel.from_cfunc(0)
    with pytest.raises(ValueError):
        runtime.Kernel.from_cfunc(-1)
    with pytest.raises(ValueError, match="read_only"):
        runtime.Kernel.from_cfunc(1, nargs=2, read_only=[2])
    with pytest.raises(TypeError, match="nargs"):
        runtime.Kernel.from_cfunc(1, nargs="2")


def test_missing_library_or_symbol_is_a_clear_error(lib, tmp_path):
    missing = tmp_path / "no_such_library.so"
    with pytest.raises(ValueError, match="no_such_library.so"):
        runtime.Kernel.load(missing, "add_custom")
    with pytest.raises(ValueError, match="not_there"):
        runtime.Kernel.load(lib, "not_there")
    with pytest.raises(TypeError, match="path"):
        runtime.Kernel.load(3, "add_custom")


def test_arguments_are_checked_before_the_call(lib, stream):
    """A buffer of another device or a freed buffer never reaches the code."""
    k = runtime.Kernel.load(lib, "add_custom", nargs=4)
    other = runtime.empty(8, "float32", device=1)
    mine = runtime.empty(8, "float32")
    before = stream.query()
    with pytest.raises(ValueError, match="device"):
        k(mine, other, mine, 8, stream=stream)
    freed = runtime.empty(8, "float32")
    runtime.device_free(freed)
    with pytest.raises(runtime.Error):
        k(mine, freed, mine, 8, stream=stream)
    assert stream.query() == before
