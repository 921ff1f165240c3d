"""Zero-copy views of device memory (numpy, typed views, DLPack), convenience constructors,
and memory safety: lifetimes of views, freed handles, shutdown, queued work, threads."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import runtime

MiB = 1 << 20
DEVICES = 4


@pytest.fixture(scope="module", autouse=True)
def rt():
    runtime.shutdown()
    runtime.init(device_count=DEVICES, memory="1GiB")
    yield
    runtime.shutdown()


def pattern(n: int, seed: int = 1) -> np.ndarray:
    return ((np.arange(n, dtype=np.uint64) * 7 + seed) % 251 + 1).astype(np.uint8)


def read(buf) -> np.ndarray:
    out = np.empty(buf.nbytes, np.uint8)
    runtime.memcpy_device_to_host(out, buf)
    return out


def host_ptr(arr: np.ndarray) -> int:
    return arr.__array_interface__["data"][0]


def stats(device: int = 0) -> dict:
    return runtime.memory_stats(device)


# ------------------------------------------------------------------------- numpy views


def test_asarray_shares_memory_both_ways():
    buf = runtime.device_malloc(0, 64)
    try:
        arr = np.asarray(buf)
        assert arr.dtype == np.uint8 and arr.shape == (64,)
        assert arr.flags.writeable and arr.flags.c_contiguous
        assert host_ptr(arr) == buf.ptr
        # write through numpy, read with a copy
        arr[:] = pattern(64, seed=3)
        np.testing.assert_array_equal(read(buf), pattern(64, seed=3))
        # write with a copy, read through numpy
        runtime.memcpy_host_to_device(buf, pattern(64, seed=9))
        np.testing.assert_array_equal(arr, pattern(64, seed=9))
        runtime.memset(buf, 0x21, 8, offset=4)
        assert (arr[4:12] == 0x21).all()
        # a memoryview shares the memory too
        mv = memoryview(buf)
        assert mv.nbytes == 64 and not mv.readonly
        mv[0] = 200
        assert arr[0] == 200
        mv.release()
    finally:
        runtime.device_free(buf)


def test_asarray_of_a_typed_view_has_its_dtype_and_shape():
    buf = runtime.empty((3, 4), "float64")
    try:
        arr = np.asarray(buf)
        assert arr.dtype == np.float64 and arr.shape == (3, 4)
        arr[...] = np.arange(12).reshape(3, 4)
        out = np.zeros((3, 4), np.float64)
        runtime.memcpy_device_to_host(out, buf)
        np.testing.assert_array_equal(out, np.arange(12).reshape(3, 4))
        np.testing.assert_array_equal(np.asarray(buf, dtype=np.int64), np.arange(12).reshape(3, 4))
        copied = buf.__array__(copy=True)
        np.testing.assert_array_equal(copied, arr)
        assert not np.shares_memory(copied, arr)
        assert np.shares_memory(buf.__array__(copy=False), arr)
        with pytest.raises(ValueError, match="copy"):
            buf.__array__(dtype=np.int64, copy=False)
    finally:
        runtime.device_free(buf)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "uint8"])
def test_typed_view_of_part_of_a_buffer(dtype):
    item = np.dtype(dtype).itemsize
    buf = runtime.device_malloc(0, 256)
    try:
        v = buf.view(dtype, (2, 3), 8 * item)
        assert v.dtype == np.dtype(dtype)
        assert v.shape == (2, 3) and v.ndim == 2 and v.size == 6
        assert v.itemsize == item and v.nbytes == 6 * item
        assert v.offset == 8 * item
        assert v.id == buf.id
        assert v.ptr == buf.ptr + 8 * item
        assert len(v) == 2
        a = np.asarray(v)
        assert a.dtype == np.dtype(dtype) and a.shape == (2, 3)
        a[...] = np.arange(1, 7, dtype=dtype).reshape(2, 3)
        raw = read(buf)
        expect = np.zeros(256, np.uint8)
        expect[8 * item : 14 * item] = np.frombuffer(
            np.arange(1, 7, dtype=dtype).tobytes(), np.uint8
        )
        np.testing.assert_array_equal(raw, expect)
        np.testing.assert_array_equal(v.copy_to_host(), np.arange(1, 7, dtype=dtype).reshape(2, 3))
    finally:
        runtime.device_free(buf)


def test_view_shape_none_takes_what_fits():
    buf = runtime.device_malloc(0, 30)
    try:
        # dtype alone is numpy's rule: 30 bytes are not whole float32s
        with pytest.raises(ValueError, match="divisor"):
            buf.view("float32")
        assert buf.view("float32", offset=0).shape == (7,)
        assert buf.view("float32", None, 8).shape == (5,)
        assert buf.view("int64", offset=8).shape == (2,)
        assert buf.view("float64", offset=24).shape == (0,)
        assert buf.view("uint8", offset=30).shape == (0,)
        assert buf.view(np.int32, offset=0).dtype == np.int32
        assert buf.view(np.dtype("uint8")).shape == (30,)
    finally:
        runtime.device_free(buf)


def test_view_with_int_shape_and_zero_dim():
    buf = runtime.device_malloc(0, 64)
    try:
        assert buf.view("int32", 5).shape == (5,)
        s = buf.view("float64", (), 16)
        assert s.shape == () and s.nbytes == 8
        a = np.asarray(s)
        assert a.shape == ()
        a[()] = 2.5
        assert buf.view("float64", (1,), 16).copy_to_host()[0] == 2.5
        assert buf.view("uint8", (0, 5)).nbytes == 0
    finally:
        runtime.device_free(buf)


def test_view_of_a_view_is_relative_and_bounded_by_the_parent_view():
    buf = runtime.device_malloc(0, 128)
    try:
        outer = buf.view("uint8", (32,), 64)
        inner = outer.view("int32", (4,), 16)
        assert inner.offset == 80
        assert inner.ptr == buf.ptr + 80
        np.asarray(inner)[:] = [1, 2, 3, 4]
        np.testing.assert_array_equal(
            np.frombuffer(read(buf)[80:96].tobytes(), np.int32), [1, 2, 3, 4]
        )
        # the allocation has room, but the parent view does not
        with pytest.raises(ValueError, match="shape"):
            outer.view("int32", (5,), 16)
        with pytest.raises(ValueError, match="offset"):
            outer.view("uint8", (1,), 33)
    finally:
        runtime.device_free(buf)


@pytest.mark.parametrize(
    "dtype,shape,offset,match",
    [
        ("float32", (5,), 0, "shape"),
        ("float32", (4,), 4, "shape"),
        ("float64", (3,), 0, "shape"),
        ("uint8", (17,), 0, "shape"),
        ("uint8", (4, 5), 0, "shape"),
        ("uint8", (2**62, 2**62), 0, "shape"),
        ("int64", (2**61,), 0, "shape"),
        ("uint8", (1,), 17, "offset"),
        ("uint8", None, 17, "offset"),
        ("uint8", (0,), 2**64 - 1, "offset"),
        ("float32", (1,), 2, "offset"),
        ("float64", (1,), 4, "offset"),
        ("int32", (1,), 1, "offset"),
    ],
)
def test_view_bounds_and_alignment_are_checked(dtype, shape, offset, match):
    buf = runtime.device_malloc(0, 16)
    try:
        with pytest.raises(ValueError, match=match):
            buf.view(dtype, shape, offset)
    finally:
        runtime.device_free(buf)


def test_view_argument_errors_name_the_argument():
    buf = runtime.device_malloc(0, 16)
    try:
        with pytest.raises(ValueError, match="shape"):
            buf.view("uint8", (-1,))
        with pytest.raises(ValueError, match="shape"):
            buf.view("uint8", -3)
        with pytest.raises(TypeError, match="shape"):
            buf.view("uint8", "abc")
        with pytest.raises(TypeError, match="shape"):
            buf.view("uint8", True)
        with pytest.raises(ValueError, match="offset"):
            buf.view("uint8", (1,), -1)
        with pytest.raises(TypeError, match="offset"):
            buf.view("uint8", (1,), 1.0)
        with pytest.raises(TypeError, match="dtype"):
            buf.view("U2")
        with pytest.raises(TypeError, match="dtype"):
            buf.view("datetime64[s]")
    finally:
        runtime.device_free(buf)


def test_views_keep_sharing_after_more_views():
    buf = runtime.device_malloc(0, 32)
    try:
        a = np.asarray(buf.view("int32", (8,)))
        b = np.asarray(buf.view("int32", (4,), 16))
        a[:] = np.arange(8)
        np.testing.assert_array_equal(b, [4, 5, 6, 7])
        assert np.shares_memory(a, b)
    finally:
        runtime.device_free(buf)


def test_numpy_view_of_device_memory_as_a_copy_host_side():
    a = runtime.device_malloc(0, 256)
    b = runtime.device_malloc(1, 256)
    try:
        av, bv = np.asarray(a), np.asarray(b)
        av[:] = pattern(256, seed=1)
        runtime.memcpy_host_to_device(b, av)  # a view of another buffer as the source
        np.testing.assert_array_equal(bv, pattern(256, seed=1))
        bv[:] = 0
        runtime.memcpy_device_to_host(bv, a)
        np.testing.assert_array_equal(bv, pattern(256, seed=1))
        # the same buffer, disjoint ranges: allowed
        runtime.memcpy_host_to_device(a, av[:100], dst_offset=128)
        expect = pattern(256, seed=1)
        expect[128:228] = expect[:100]
        np.testing.assert_array_equal(av, expect)
    finally:
        runtime.device_free(a)
        runtime.device_free(b)


@pytest.mark.parametrize("shift", [1, 64, 4095])
def test_overlapping_host_view_of_the_same_buffer_is_refused(shift):
    n = 16 * MiB
    buf = runtime.device_malloc(0, n)
    try:
        v = np.asarray(buf)
        v[:] = pattern(n, seed=2)
        with pytest.raises(ValueError, match="overlap.*memcpy_d2d"):
            runtime.memcpy_host_to_device(buf, v, count=n - shift, dst_offset=shift)
        with pytest.raises(ValueError, match="overlap"):
            runtime.memcpy_device_to_host(v, buf, count=n - shift, dst_offset=shift)
        with pytest.raises(ValueError, match="overlap"):
            runtime.memcpy_device_to_host(v[shift:], buf.view("uint8", None, 0), count=n - shift)
        np.testing.assert_array_equal(v, pattern(n, seed=2))
        # the supported way
        runtime.memcpy_d2d(buf, buf, count=n - shift, dst_offset=shift)
        np.testing.assert_array_equal(v[shift:], pattern(n, seed=2)[: n - shift])
    finally:
        runtime.device_free(buf)


# ------------------------------------------------------------------------------ DLPack


def test_dlpack_device():
    buf = runtime.device_malloc(2, 16)
    try:
        assert buf.__dlpack_device__() == (1, 0)
        assert buf.view("float32").__dlpack_device__() == (1, 0)
    finally:
        runtime.device_free(buf)


def test_from_dlpack_shares_memory_both_ways():
    buf = runtime.device_malloc(0, 40)
    try:
        x = np.from_dlpack(buf)
        assert x.dtype == np.uint8 and x.shape == (40,)
        assert host_ptr(x) == buf.ptr
        x[:] = pattern(40, seed=2)
        np.testing.assert_array_equal(read(buf), pattern(40, seed=2))
        runtime.memcpy_host_to_device(buf, pattern(40, seed=5))
        np.testing.assert_array_equal(x, pattern(40, seed=5))
    finally:
        runtime.device_free(buf)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "uint8"])
def test_from_dlpack_of_a_typed_view_with_offset(dtype):
    item = np.dtype(dtype).itemsize
    buf = runtime.device_malloc(0, 64 * item)
    try:
        v = buf.view(dtype, (3, 5), 4 * item)
        x = np.from_dlpack(v)
        assert x.dtype == np.dtype(dtype) and x.shape == (3, 5)
        assert host_ptr(x) == buf.ptr + 4 * item
        x[...] = np.arange(15, dtype=dtype).reshape(3, 5)
        np.testing.assert_array_equal(v.copy_to_host(), np.arange(15, dtype=dtype).reshape(3, 5))
        np.testing.assert_array_equal(np.asarray(v), x)
    finally:
        runtime.device_free(buf)


def test_dlpack_refuses_other_devices_and_copies():
    buf = runtime.device_malloc(0, 16)
    try:
        with pytest.raises(BufferError, match="kDLCPU"):
            buf.__dlpack__(dl_device=(2, 0))
        with pytest.raises(BufferError, match="copy"):
            buf.__dlpack__(copy=True)
        cap = buf.__dlpack__(dl_device=(1, 0), copy=False)
        assert type(cap).__name__ == "PyCapsule"
        del cap  # an unconsumed capsule is released without leaking the allocation
    finally:
        runtime.device_free(buf)


@pytest.mark.parametrize("max_version", [None, (1, 0)])
def test_dlpack_capsule_collected_while_an_exception_propagates(max_version):
    # A consumer renames the capsule ("used_dltensor[_versioned]") and owns the tensor; the
    # capsule may then be collected while an exception is pending. Its destructor must leave
    # that exception alone: clearing it made CPython raise "SystemError: error return without
    # exception set" instead of the real error.
    import ctypes

    api = ctypes.pythonapi
    api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    name = b"dltensor_versioned" if max_version else b"dltensor"
    # Offset of `deleter` in DLManagedTensorVersioned / DLManagedTensor (64-bit).
    deleter_at = 16 if max_version else 56
    buf = runtime.device_malloc(0, 16)
    before = runtime.memory_stats(0)["active_allocations"]
    try:
        for consumed in (True, False):
            cap = buf.__dlpack__(max_version=max_version)
            managed = api.PyCapsule_GetPointer(cap, name)
            if consumed:  # what a consumer does: rename, and call the deleter when done
                assert api.PyCapsule_SetName(cap, b"used_" + name) == 0
            held = [cap]
            del cap
            # int() fails with TypeError; the popped capsule (its last reference) is released
            # with that TypeError pending.
            with pytest.raises(TypeError, match="PyCapsule"):
                int(held.pop())
            if consumed:
                deleter = ctypes.c_void_p.from_address(managed + deleter_at).value
                ctypes.CFUNCTYPE(None, ctypes.c_void_p)(deleter)(managed)
        assert read(buf).tolist() == [0] * 16
    finally:
        runtime.device_free(buf)
    # Both exports released their buffer clone: the allocation went back with device_free.
    assert runtime.memory_stats(0)["active_allocations"] == before - 1


def test_dlpack_capsule_versions():
    buf = runtime.device_malloc(0, 16)
    try:
        assert '"dltensor"' in repr(buf.__dlpack__())
        assert '"dltensor"' in repr(buf.__dlpack__(max_version=None))
        assert '"dltensor"' in repr(buf.__dlpack__(max_version=(0, 8)))
        assert '"dltensor_versioned"' in repr(buf.__dlpack__(max_version=(1, 0)))
        assert '"dltensor_versioned"' in repr(buf.__dlpack__(max_version=(1, 3)))
        with pytest.raises(TypeError, match="max_version"):
            buf.__dlpack__(max_version="1.0")
        # numpy asks for a versioned capsule and gets a writable array
        x = np.from_dlpack(buf)
        assert x.flags.writeable
        x[0] = 1
        assert read(buf)[0] == 1
    finally:
        runtime.device_free(buf)


@pytest.mark.parametrize("max_version", [None, (1, 0)])
def test_unconsumed_capsule_does_not_keep_memory(max_version):
    before = stats()["active_allocations"]
    buf = runtime.device_malloc(0, 4096)
    cap = buf.__dlpack__(max_version=max_version)
    runtime.device_free(buf)
    assert stats()["active_allocations"] == before + 1
    del cap
    assert stats()["active_allocations"] == before


# ------------------------------------------------------------------ convenience round trips

SHAPES = [(), (0,), (1,), (7,), (3, 5), (2, 3, 4), (1000,), (64, 65)]
DTYPES = ["float32", "float64", "int32", "int64", "uint8"]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
def test_to_device_round_trip(dtype, shape):
    rng = np.random.default_rng(abs(hash((dtype, shape))) % 2**32)
    host = np.asarray(rng.random(shape) * 200).astype(dtype)
    d = runtime.to_device(host)
    try:
        assert d.dtype == host.dtype and d.shape == host.shape and d.nbytes == host.nbytes
        back = d.copy_to_host()
        assert back.dtype == host.dtype and back.shape == host.shape
        np.testing.assert_array_equal(back, host)
        np.testing.assert_array_equal(d.to_host(), host)
        np.testing.assert_array_equal(np.asarray(d), host)
        np.testing.assert_array_equal(np.from_dlpack(d), host)
        assert not np.shares_memory(back, host)
    finally:
        runtime.device_free(d)


@pytest.mark.parametrize("shape", [(0,), (5,), (3, 4), 6], ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
def test_empty_and_zeros(dtype, shape):
    e = runtime.empty(shape, dtype)
    z = runtime.zeros(shape, dtype, device=1)
    try:
        expect_shape = (shape,) if isinstance(shape, int) else shape
        assert e.shape == expect_shape and z.shape == expect_shape
        assert e.dtype == np.dtype(dtype) and z.dtype == np.dtype(dtype)
        assert int(z.device) == 1 and int(e.device) == runtime.get_device()
        # device memory is always handed out zeroed
        assert not e.copy_to_host().any()
        assert not z.copy_to_host().any()
    finally:
        runtime.device_free(e)
        runtime.device_free(z)


@pytest.mark.parametrize("host", [np.float64(2.5), np.array(7, np.int32), np.uint8(3)], ids=repr)
def test_to_device_of_zero_dim_arrays_and_scalars_keeps_shape(host):
    d = runtime.to_device(host)
    try:
        assert d.shape == () and d.ndim == 0 and d.nbytes == np.asarray(host).itemsize
        back = d.copy_to_host()
        assert back.shape == () and back.dtype == np.asarray(host).dtype
        assert back[()] == host
    finally:
        runtime.device_free(d)


def test_empty_default_dtype_is_float32():
    e = runtime.empty(4)
    assert e.dtype == np.float32 and e.nbytes == 16
    runtime.device_free(e)


def test_to_device_of_non_contiguous_and_fortran_arrays():
    base = np.arange(40, dtype=np.int64).reshape(5, 8)
    for host in (base[:, ::3], base.T, np.asfortranarray(base)):
        d = runtime.to_device(host, device=2)
        try:
            assert int(d.device) == 2
            np.testing.assert_array_equal(d.copy_to_host(), host)
        finally:
            runtime.device_free(d)


@pytest.mark.parametrize("dtype", [">i4", ">f8", ">i8", ">f4", "<i4", "=f8"])
def test_to_device_converts_byte_order(dtype):
    # Device memory is native: data in the other byte order arrives with its values (as
    # cupy.asarray gives), not as its bytes reinterpreted.
    host = np.arange(5, dtype=dtype).reshape(5)
    host[1] = -3
    d = runtime.to_device(host)
    try:
        assert d.dtype == host.dtype.newbyteorder("=")
        assert d.dtype.isnative
        got = d.copy_to_host()
        assert got.tolist() == host.tolist() == [0, -3, 2, 3, 4]
        np.testing.assert_array_equal(np.asarray(d), host)
    finally:
        runtime.device_free(d)
    big = np.arange(6, dtype=">i8").reshape(2, 3)
    d = runtime.to_device(big[:, ::2])  # non-contiguous and big-endian
    try:
        assert d.copy_to_host().tolist() == [[0, 2], [3, 5]]
    finally:
        runtime.device_free(d)


@pytest.mark.parametrize("dtype", [">f4", ">i4", np.dtype(">f8"), np.dtype("int64").newbyteorder()])
def test_non_native_dtype_argument_is_refused(dtype):
    with pytest.raises(ValueError, match="^dtype: .*byte order"):
        runtime.empty(3, dtype)
    with pytest.raises(ValueError, match="^dtype: .*byte order"):
        runtime.zeros(3, dtype)
    buf = runtime.device_malloc(0, 64)
    try:
        with pytest.raises(ValueError, match="^dtype: .*byte order"):
            buf.view(dtype)
        with pytest.raises(ValueError, match="^dtype: .*byte order"):
            buf.view(dtype, (2,), offset=8)
        # explicit native order and byte types are fine
        assert buf.view("<i4" if np.little_endian else ">i4").dtype == np.int32
        assert buf.view("|u1").dtype == np.uint8
    finally:
        runtime.device_free(buf)


def test_to_device_with_stream():
    s = runtime.Stream(0)
    host = np.arange(1000, dtype=np.float32)
    d = runtime.to_device(host, stream=s)
    s.synchronize()
    np.testing.assert_array_equal(d.copy_to_host(), host)
    runtime.device_free(d)
    s.destroy()


def test_constructor_argument_errors():
    with pytest.raises(TypeError, match="dtype"):
        runtime.empty(4, "U4")
    with pytest.raises(TypeError, match="dtype"):
        runtime.to_device(np.zeros(3, "datetime64[s]"))
    with pytest.raises(TypeError, match="dtype"):
        runtime.to_device(np.zeros(3, [("a", "i4"), ("b", "f4")]))
    with pytest.raises(ValueError, match="shape"):
        runtime.empty((-1,))
    with pytest.raises(TypeError, match="shape"):
        runtime.empty("abc")
    with pytest.raises(ValueError, match="shape"):
        runtime.empty((2**62, 2**62))
    with pytest.raises(runtime.OutOfMemoryError):
        runtime.empty((2**40,), "uint8")
    with pytest.raises(runtime.InvalidDeviceError):
        runtime.zeros(4, device=DEVICES)


# --------------------------------------------------------------------------- lifetimes


@pytest.mark.parametrize("size", [4096, MiB])
@pytest.mark.parametrize("export", ["asarray", "dlpack", "memoryview", "typed-view"])
def test_view_outlives_device_free(size, export):
    before = stats()
    buf = runtime.device_malloc(0, size)
    runtime.memcpy_host_to_device(buf, pattern(size, seed=4))
    if export == "asarray":
        view = np.asarray(buf)
    elif export == "dlpack":
        view = np.from_dlpack(buf)
    elif export == "memoryview":
        view = np.asarray(memoryview(buf))
    else:
        view = np.asarray(buf.view("uint8"))
    lo = host_ptr(view)
    runtime.device_free(buf)
    assert buf.freed

    # the memory is still held: still counted, still readable and writable
    mid = stats()
    assert mid["active_allocations"] == before["active_allocations"] + 1
    assert mid["allocated"] >= before["allocated"] + size
    np.testing.assert_array_equal(view, pattern(size, seed=4))
    view[:10] = 1

    # it is not handed to new allocations of the same size while the view lives
    fresh = [runtime.device_malloc(0, size) for _ in range(4)]
    for f in fresh:
        assert not (lo <= f.ptr < lo + size) and not (f.ptr <= lo < f.ptr + size)
        runtime.memset(f, 0xEE)
    np.testing.assert_array_equal(view[10:], pattern(size, seed=4)[10:])
    for f in fresh:
        runtime.device_free(f)

    # it goes back to the pool when the view goes
    del view
    after = stats()
    assert after["active_allocations"] == before["active_allocations"]
    assert after["allocated"] == before["allocated"]


def test_typed_device_view_keeps_memory_after_parent_free():
    before = stats()["active_allocations"]
    buf = runtime.device_malloc(0, 64)
    runtime.memcpy_host_to_device(buf, pattern(64))
    v = buf.view("uint8", (16,), 16)
    runtime.device_free(buf)
    assert stats()["active_allocations"] == before + 1
    np.testing.assert_array_equal(v.copy_to_host(), pattern(64)[16:32])
    runtime.device_free(v)
    assert stats()["active_allocations"] == before


def test_double_free_raises_invalid_handle_naming_the_buffer():
    buf = runtime.device_malloc(1, 48)
    runtime.device_free(buf)
    with pytest.raises(runtime.InvalidHandleError, match=rf"DeviceBuffer#{buf.id}\b.*freed"):
        runtime.device_free(buf)
    assert isinstance(
        pytest.raises(runtime.InvalidHandleError, runtime.device_free, buf).value, runtime.Error
    )


def test_concurrent_double_free_frees_once():
    for _ in range(20):
        buf = runtime.device_malloc(0, 128)
        results = []
        barrier = threading.Barrier(4, timeout=30)

        def free(b=buf, out=results, bar=barrier):
            bar.wait()
            try:
                runtime.device_free(b)
                out.append("ok")
            except runtime.InvalidHandleError:
                out.append("invalid")

        threads = [threading.Thread(target=free) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results) == ["invalid", "invalid", "invalid", "ok"]


FREED_USES = {
    "h2d": lambda b: runtime.memcpy_host_to_device(b, bytes(8)),
    "d2h": lambda b: runtime.memcpy_device_to_host(bytearray(8), b),
    "d2d-dst": lambda b: runtime.memcpy_d2d(b, runtime.device_malloc(0, 8)),
    "d2d-src": lambda b: runtime.memcpy_d2d(runtime.device_malloc(0, 8), b),
    "memset": lambda b: runtime.memset(b, 1),
    "view": lambda b: b.view("uint8"),
    "asarray": lambda b: np.asarray(b),
    "array": lambda b: np.array(b),
    "memoryview": lambda b: memoryview(b),
    "from_dlpack": lambda b: np.from_dlpack(b),
    "dlpack": lambda b: b.__dlpack__(),
    "copy_to_host": lambda b: b.copy_to_host(),
    "to_host": lambda b: b.to_host(),
    "ptr": lambda b: b.ptr,
    "kernel-arg": lambda b: runtime.current_stream(0).launch_kernel(lambda v: None, (b,)),
}


@pytest.mark.parametrize("use", FREED_USES.values(), ids=FREED_USES.keys())
def test_use_of_a_freed_handle_raises_invalid_handle(use):
    buf = runtime.device_malloc(0, 8)
    runtime.device_free(buf)
    with pytest.raises(runtime.InvalidHandleError, match=rf"DeviceBuffer#{buf.id}\b"):
        use(buf)
    assert buf.freed
    assert "freed" in repr(buf)


def test_async_use_of_a_freed_handle_raises_invalid_handle():
    s = runtime.Stream(0)
    buf = runtime.device_malloc(0, 8)
    runtime.device_free(buf)
    with pytest.raises(runtime.InvalidHandleError):
        runtime.memcpy_host_to_device(buf, bytes(8), s)
    with pytest.raises(runtime.InvalidHandleError):
        runtime.memcpy_device_to_host(bytearray(8), buf, s)
    with pytest.raises(runtime.InvalidHandleError):
        runtime.memset(buf, 0, stream=s)
    s.synchronize()
    s.destroy()


@pytest.mark.parametrize("use", FREED_USES.values(), ids=FREED_USES.keys())
def test_handle_from_before_shutdown_raises_invalid_handle(use):
    buf = runtime.device_malloc(0, 8)
    runtime.shutdown()
    runtime.init(device_count=DEVICES, memory="1GiB")
    with pytest.raises(runtime.InvalidHandleError, match="shut down"):
        use(buf)
    with pytest.raises(runtime.InvalidHandleError, match="shut down"):
        runtime.device_free(buf)
    assert buf.freed


def test_view_survives_shutdown():
    buf = runtime.device_malloc(0, MiB)
    runtime.memcpy_host_to_device(buf, pattern(MiB, seed=8))
    arr = np.asarray(buf)
    cap_arr = np.from_dlpack(buf.view("int32"))
    runtime.shutdown()
    try:
        # the memory outlives the runtime while a view holds it
        np.testing.assert_array_equal(arr, pattern(MiB, seed=8))
        arr[:4] = 0
        assert cap_arr[0] == 0
        del arr, cap_arr
    finally:
        runtime.init(device_count=DEVICES, memory="1GiB")
    assert stats()["active_allocations"] == 0


# ----------------------------------------------------------------- frees with queued work


@pytest.mark.parametrize("kind", ["d2h", "h2d", "d2d", "memset", "kernel"])
def test_free_while_an_async_copy_is_queued(kind):
    n = 256 * 1024
    s = runtime.Stream(0)
    before = stats()["active_allocations"]
    buf = runtime.device_malloc(0, n)
    runtime.memcpy_host_to_device(buf, pattern(n, seed=12))
    other = runtime.device_malloc(1, n)
    host = np.zeros(n, np.uint8)
    try:
        s.launch_kernel(lambda: time.sleep(0.05))
        if kind == "d2h":
            runtime.memcpy_device_to_host(host, buf, s)
            runtime.device_free(buf)
            s.synchronize()
            np.testing.assert_array_equal(host, pattern(n, seed=12))
        elif kind == "h2d":
            runtime.memcpy_host_to_device(buf, pattern(n, seed=13), s)
            runtime.memcpy_d2d(other, buf, s)
            runtime.device_free(buf)
            s.synchronize()
            np.testing.assert_array_equal(read(other), pattern(n, seed=13))
        elif kind == "d2d":
            runtime.memcpy_d2d(other, buf, s)
            runtime.memcpy_device_to_host(host, other, s)
            runtime.device_free(buf)
            runtime.device_free(other)
            other = None
            s.synchronize()
            np.testing.assert_array_equal(host, pattern(n, seed=12))
        elif kind == "memset":
            runtime.memset(buf, 0x31, stream=s)
            runtime.memcpy_d2d(other, buf, s)
            runtime.device_free(buf)
            s.synchronize()
            assert (read(other) == 0x31).all()
        else:

            def kernel(view):
                view[:] = 0x44

            s.launch_kernel(kernel, (buf,))
            runtime.memcpy_d2d(other, buf, s)
            runtime.device_free(buf)
            s.synchronize()
            assert (read(other) == 0x44).all()
    finally:
        if other is not None:
            runtime.device_free(other)
        s.destroy()
    # the queued operations were the last users: the memory is back
    for _ in range(200):
        if stats()["active_allocations"] == before:
            break
        time.sleep(0.005)
    assert stats()["active_allocations"] == before


def test_free_of_the_host_side_while_queued():
    """A pageable host buffer given to a d2h queued behind slow work is written and let go of
    when the call returns (CUDA's rule for pageable destinations), so the caller may resize
    or drop it at once; a pinned destination, held by the copy until it ran, is covered by
    test_pinned.py::test_free_host_while_a_copy_is_in_flight_is_safe."""
    n = 64 * 1024
    s = runtime.Stream(0)
    buf = runtime.device_malloc(0, n)
    runtime.memcpy_host_to_device(buf, pattern(n, seed=21))
    host = bytearray(n)
    view = memoryview(host)
    gate = threading.Event()
    s.launch_host_func(gate.wait, 10)
    threading.Timer(0.05, gate.set).start()
    runtime.memcpy_device_to_host(view, buf, s)  # returns once the copy ran
    del view
    assert bytes(host) == pattern(n, seed=21).tobytes()
    host.extend(b"x")  # no longer exported: the copy let go of it
    runtime.device_free(buf)
    s.destroy()


# --------------------------------------------------------------------------- threads


def test_threads_allocate_write_verify_free_concurrently():
    errors: list[BaseException] = []
    sizes = [1, 100, 4096, 5000, 32768, 65536, MiB, 3 * MiB + 7]
    barrier = threading.Barrier(8, timeout=30)

    def worker(idx: int) -> None:
        try:
            barrier.wait()
            rng = np.random.default_rng(idx)
            for it in range(30):
                size = sizes[(idx + it) % len(sizes)]
                dev = (idx + it) % DEVICES
                buf = runtime.device_malloc(dev, size)
                assert not np.asarray(buf).any(), "allocation handed out dirty"
                data = rng.integers(1, 255, size, dtype=np.uint8)
                if it % 2:
                    runtime.memcpy_host_to_device(buf, data)
                else:
                    np.asarray(buf)[:] = data
                back = np.empty(size, np.uint8)
                runtime.memcpy_device_to_host(back, buf)
                np.testing.assert_array_equal(back, data)
                runtime.device_free(buf)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    before = [stats(d)["active_allocations"] for d in range(DEVICES)]
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert [stats(d)["active_allocations"] for d in range(DEVICES)] == before


def test_copies_through_a_numpy_view_take_turns_with_the_buffers_own_ops():
    """A copy into a numpy view of a ``DeviceBuffer`` is a copy into that buffer's device
    memory, but the view is host memory to the copy, which named no lock of the buffer: it
    ran while a kernel on another stream held the buffer, and a Python kernel reading the
    buffer saw half of one copy and half of the next. Copies through the view now take
    turns with the buffer's ops (RELIABILITY.md W21)."""
    n = 8 << 20
    buf = runtime.device_malloc(0, n)
    view = np.asarray(buf)
    sources = [runtime.to_device(np.full(n, v, np.uint8), device=0) for v in (0xA0, 0xA1)]
    copies, checks = runtime.Stream(0), runtime.Stream(0)
    seen = []

    def check(b):
        a = np.asarray(b)
        seen.append(bool((a == a[0]).all()))

    for r in range(32):
        runtime.memcpy_device_to_host(view, sources[r % 2], stream=copies)
        checks.launch_kernel(check, (buf,))
    copies.synchronize(timeout=60)
    checks.synchronize(timeout=60)
    assert len(seen) == 32
    assert all(seen), f"{seen.count(False)} of 32 reads saw two copies at once"
