"""Pointer arithmetic and slicing of ``DeviceBuffer`` (CuPy's ``MemoryPointer``): ``buf + n``,
``n + buf``, ``buf - n`` and ``buf[a:b]`` are views of the same allocation, bounds-checked by
the core, keeping the allocation alive; ``view.ptr`` is the base address plus the offset.
Translated from CuPy's tests/cupy_tests/cuda_tests/test_memory.py (TestMemoryPointer:
test_int, test_add, test_sub, test_memset); slicing follows numpy's 1-D slicing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import runtime


@pytest.fixture(scope="module", autouse=True)
def rt():
    runtime.shutdown()
    runtime.init(device_count=1, memory="64MiB")
    yield
    runtime.shutdown()


def test_int():
    # CuPy TestMemoryPointer.test_int
    buf = runtime.device_malloc(0, 1)
    assert int(buf.ptr) == buf.ptr > 0


def test_add():
    # CuPy TestMemoryPointer.test_add
    buf = runtime.device_malloc(0, 8)
    p = buf.ptr
    b2 = buf + 4
    assert isinstance(b2, runtime.DeviceBuffer)
    assert b2.ptr == p + 4 and b2.nbytes == 4 and b2.offset == 4
    b3 = 4 + buf
    assert isinstance(b3, runtime.DeviceBuffer) and b3.ptr == p + 4
    buf += 4
    assert isinstance(buf, runtime.DeviceBuffer) and buf.ptr == p + 4


def test_sub():
    # CuPy TestMemoryPointer.test_sub
    base = runtime.device_malloc(0, 8)
    p = base.ptr
    buf = base + 4
    b2 = buf - 4
    assert isinstance(b2, runtime.DeviceBuffer) and b2.ptr == p and b2.nbytes == 8
    buf -= 4
    assert buf.ptr == p


def test_memset_walking_pointer():
    # CuPy TestMemoryPointer.test_memset: memset through the base, read byte by byte while
    # the pointer walks.
    buf = runtime.device_malloc(0, 4)
    runtime.memset(buf, 1, 4)
    p = buf
    for _ in range(4):
        out = np.zeros(1, np.uint8)
        runtime.memcpy_device_to_host(out, p, count=1)
        assert out[0] == 1
        p += 1
    assert p.nbytes == 0


def test_arithmetic_is_bounds_checked():
    buf = runtime.device_malloc(0, 16)
    assert (buf + 16).nbytes == 0
    with pytest.raises(ValueError, match="stays inside the allocation"):
        buf + 17
    with pytest.raises(ValueError, match="stays inside the allocation"):
        buf - 1
    with pytest.raises(ValueError, match="stays inside the allocation"):
        (buf[4:8] + 2) - 7
    # An integer too large for any allocation is the same ValueError, never a TypeError.
    for huge in (2**63, 2**64 - 1, -(2**63) - 1, 2**200, np.uint64(2**64 - 1)):
        with pytest.raises(ValueError, match="stays inside the allocation"):
            buf + huge
        with pytest.raises(ValueError, match="stays inside the allocation"):
            buf - huge
        if isinstance(huge, int):  # numpy scalars add elementwise over the buffer protocol
            with pytest.raises(ValueError, match="stays inside the allocation"):
                huge + buf
    with pytest.raises(ValueError, match="stays inside the allocation"):
        buf - (-(2**63))
    with pytest.raises(TypeError):
        buf + 1.5
    with pytest.raises(TypeError):
        buf + True
    with pytest.raises(TypeError):
        buf - buf


def test_views_write_through_and_keep_the_allocation_alive():
    buf = runtime.device_malloc(0, 64)
    active = runtime.memory_stats(0)["active_allocations"]
    tail = buf + 32
    sl = buf[8:16]
    runtime.memcpy_host_to_device(sl, np.full(8, 5, np.uint8))
    runtime.memcpy_host_to_device(tail, np.arange(32, dtype=np.uint8))
    runtime.device_free(buf)
    assert runtime.memory_stats(0)["active_allocations"] == active
    back = tail - 32
    host = back.copy_to_host()
    assert (host[8:16] == 5).all() and (host[32:] == np.arange(32)).all()
    assert host[:8].sum() == 0 and host[16:32].sum() == 0
    with pytest.raises(ValueError):
        runtime.memcpy_host_to_device(sl, np.zeros(9, np.uint8))
    del tail, sl, back
    assert runtime.memory_stats(0)["active_allocations"] == active - 1


def test_typed_slicing_is_numpy_1d_slicing():
    a = np.arange(12, dtype=np.float32)
    buf = runtime.to_device(a)
    for key in [slice(2, 5), slice(-3, None), slice(None, 100), slice(7, 3), slice(None)]:
        v = buf[key]
        assert v.dtype == np.float32
        np.testing.assert_array_equal(v.copy_to_host(), a[key])
        start = key.indices(12)[0]
        assert v.ptr == buf.ptr + 4 * start or v.nbytes == 0
    # 2-D: slices along the first axis, like numpy on a C-contiguous array.
    m = runtime.to_device(np.arange(12, dtype=np.int32).reshape(4, 3))
    rows = m[1:3]
    assert rows.shape == (2, 3)
    np.testing.assert_array_equal(rows.copy_to_host(), np.arange(12).reshape(4, 3)[1:3])
    # Pointer arithmetic is in bytes and gives raw bytes (as CuPy's MemoryPointer).
    r = buf + 4
    assert r.dtype == np.uint8 and r.nbytes == 44


def test_slice_errors():
    buf = runtime.device_malloc(0, 8)
    # Positive steps give strided views (tests/test_strides.py); others have no view.
    with pytest.raises(ValueError, match="step"):
        buf[::-1]
    with pytest.raises(TypeError, match="must be slices"):
        buf[0]
    scalar = runtime.empty((), dtype=np.float64)
    with pytest.raises(TypeError, match="0-d"):
        scalar[0:1]


@given(
    size=st.integers(0, 256),
    start=st.integers(-300, 300),
    stop=st.integers(-300, 300),
    shift=st.integers(-300, 300),
)
def test_views_against_numpy(size, start, stop, shift):
    """Slices match numpy's; a shift is allowed iff it stays inside the allocation."""
    host = (np.arange(size) % 251).astype(np.uint8)
    buf = runtime.to_device(host)
    v = buf[start:stop]
    np.testing.assert_array_equal(v.copy_to_host(), host[start:stop])
    lo = slice(start, stop).indices(size)[0]
    end = lo + v.nbytes
    if 0 <= lo + shift <= end:
        w = v + shift
        assert w.ptr == buf.ptr + lo + shift and w.nbytes == end - lo - shift
        np.testing.assert_array_equal(w.copy_to_host(), host[lo + shift : end])
    else:
        with pytest.raises(ValueError):
            v + shift
