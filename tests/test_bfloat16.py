"""bfloat16 through ml_dtypes (an optional dependency): buffers, copies, views, the numpy and
DLPack exports, the built-in kernels against ml_dtypes' own arithmetic (float32, rounded per
result), numpy scalars for native kernels, a collective, and the error without ml_dtypes.

Translated from upstream tests (rewritten here, not copied):

- ml_dtypes ``ml_dtypes/tests/custom_float_test.py``: ``testRoundTripToNumpy`` (values survive
  a trip through bfloat16 arrays bit for bit), ``testAdd`` / ``testMul`` (the result is the
  float32 operation rounded to bfloat16), ``testCastToDtype`` / ``testDtypeFromString``
  (``np.dtype("bfloat16")`` once ml_dtypes is imported).
- ml_dtypes ``ml_dtypes/tests/dlpack_test.py``: ``test_roundtrip_floats`` (``np.from_dlpack``
  of bfloat16 gives the same values and shares memory; numpy 2.5+ only).
- PyTorch ``test/test_dlpack.py``: ``test_dlpack_capsule_conversion`` and
  ``test_dlpack_shared_storage`` over ``all_types_and_complex_and(torch.half,
  torch.bfloat16)`` (the consumer gets the dtype and the values, and writes are shared);
  for ``runtime.to_device`` as the consumer: ``test_dlpack_protocol_conversion`` and
  ``test_from_dlpack_dtype`` (every dtype, bfloat16 included, keeps its dtype and values),
  ``test_from_dlpack_noncontinguous`` (rows, columns and transposes), the
  ``TensorDLPackWrapper`` that exposes only ``__dlpack__`` / ``__dlpack_device__`` (so the
  import cannot go through numpy), ``test_max_version`` (legacy and versioned capsules) and
  ``test_dlpack_export_requires_grad`` (the producer's error reaches the caller).
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import runtime
from runtime import kernels

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.float32


@pytest.fixture(scope="module", autouse=True)
def rt():
    runtime.shutdown()
    runtime.init(device_count=2, memory="256MiB")
    yield
    runtime.shutdown()


def bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint16)


def sample(shape, seed: int = 0, spread: int = 8) -> np.ndarray:
    """bfloat16 values from random bit patterns: both signs, exponents 2**-spread..2**spread,
    all mantissas (so sums and products need rounding to 8 significant bits)."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape, dtype=np.int64))
    raw = rng.integers(0, 1 << 16, n, dtype=np.uint16)
    exp = (127 - spread + (raw >> 7) % (2 * spread)).astype(np.uint16)
    return ((raw & 0x807F) | (exp << 7)).view(BF16).reshape(shape)


def model(op, *xs: np.ndarray) -> np.ndarray:
    """ml_dtypes' rule: compute in float32, round the result to bfloat16."""
    return op(*(x.astype(F32) for x in xs)).astype(BF16)


def assert_bits_equal(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == BF16, got.dtype
    assert got.shape == want.shape
    np.testing.assert_array_equal(bits(got), bits(want.astype(BF16)))


# ------------------------------------------------------------------- dtypes and buffers


def test_dtype_names_and_attributes():
    for spelling in ("bfloat16", ml_dtypes.bfloat16, BF16, np.dtype("bfloat16")):
        b = runtime.empty((3, 4), spelling)
        assert b.dtype == BF16 and b.itemsize == 2 and b.nbytes == 24 and b.shape == (3, 4)
        assert "bfloat16" in repr(b)
    z = runtime.zeros(5, "bfloat16")
    assert_bits_equal(z.copy_to_host(), np.zeros(5, BF16))


def test_round_trip_is_bit_exact():
    # Every bit pattern, NaNs, infinities, subnormals and -0 included.
    every = np.arange(1 << 16, dtype=np.uint16).view(BF16)
    d = runtime.to_device(every)
    assert d.dtype == BF16 and d.shape == every.shape
    assert_bits_equal(d.copy_to_host(), every)
    assert_bits_equal(np.asarray(d), every)
    out = np.empty_like(every)
    d.copy_to_host(out)
    assert_bits_equal(out, every)


@given(
    hnp.arrays(
        np.uint16,
        hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5),
        elements=st.integers(0, (1 << 16) - 1),
    )
)
def test_round_trip_of_any_shape(raw):
    host = raw.view(BF16) if raw.ndim else raw.reshape(1).view(BF16).reshape(())
    d = runtime.to_device(host)
    assert d.shape == host.shape
    assert_bits_equal(d.copy_to_host(), host)


def test_strided_and_fortran_sources_are_copied_by_value():
    host = sample((6, 8), seed=1)
    for src in (host[:, ::2], np.asfortranarray(host), host.T):
        assert_bits_equal(runtime.to_device(src).copy_to_host(), np.ascontiguousarray(src))


def test_memcpy_h2d_d2h_d2d():
    host = sample((16,), seed=3)
    a = runtime.empty(16, "bfloat16")
    b = runtime.empty(16, "bfloat16", device=1)
    runtime.memcpy_host_to_device(a, host)
    runtime.memcpy_d2d(b, a)
    out = np.empty(16, BF16)
    runtime.memcpy_device_to_host(out, b)
    assert_bits_equal(out, host)
    # A strided bfloat16 source, and part of a buffer by byte offsets.
    wide = sample((32,), seed=4)
    runtime.memcpy_host_to_device(a, wide[::2])
    assert_bits_equal(a.copy_to_host(), wide[::2])
    runtime.memcpy_host_to_device(a, host[:4], dst_offset=8)
    want = wide[::2].copy()
    want[4:8] = host[:4]
    assert_bits_equal(a.copy_to_host(), want)
    # A read-only source (a copy destination must stay writable).
    ro = host.copy()
    ro.flags.writeable = False
    runtime.memcpy_host_to_device(a, ro)
    assert_bits_equal(a.copy_to_host(), host)
    with pytest.raises(ValueError, match="read-only"):
        runtime.memcpy_device_to_host(ro, a)


def test_views_follow_numpy():
    host = sample((3, 4), seed=5)
    d = runtime.to_device(host)
    # Same item size: the bits as uint16 / int16, and back.
    np.testing.assert_array_equal(d.view("uint16").copy_to_host(), bits(host))
    np.testing.assert_array_equal(d.view(np.int16).copy_to_host(), host.view(np.int16))
    assert_bits_equal(d.view("uint16").view("bfloat16").copy_to_host(), host)
    # Other sizes: numpy's last-axis rule.
    for to in ("float32", "uint8", "float64"):
        assert d.view(to).shape == host.view(to).shape
        np.testing.assert_array_equal(d.view(to).copy_to_host(), host.view(to))
    f = runtime.to_device(np.linspace(-1, 1, 6, dtype=F32).reshape(2, 3))
    assert f.view("bfloat16").shape == (2, 6)
    assert_bits_equal(f.view("bfloat16").copy_to_host(), f.copy_to_host().view(BF16))
    # Bytes at an offset.
    v = d.view("bfloat16", (5,), 6)
    assert_bits_equal(v.copy_to_host(), host.reshape(-1)[3:8])
    with pytest.raises(ValueError):
        runtime.to_device(np.zeros(3, BF16)).view("float32")  # 6 bytes into 4-byte items


def test_numpy_asarray_shares_memory_and_the_buffer_protocol_has_no_format():
    host = sample((4,), seed=6)
    d = runtime.to_device(host)
    a = np.asarray(d)
    assert a.dtype == BF16
    a[0] = ml_dtypes.bfloat16(3.0)
    assert d.copy_to_host()[0] == 3.0
    assert np.asarray(d, dtype=F32).dtype == F32
    # numpy's own bfloat16 arrays have no buffer-protocol format either.
    with pytest.raises(BufferError, match="bfloat16"):
        memoryview(d)
    with pytest.raises((BufferError, ValueError)):
        memoryview(host)


def test_other_extension_dtypes_are_still_refused():
    for name in ("float8_e4m3fn", "float8_e5m2", "int4"):
        dt = getattr(ml_dtypes, name, None)
        if dt is None:
            continue
        with pytest.raises(TypeError, match="dtype"):
            runtime.empty(2, dt)
        with pytest.raises(TypeError, match="dtype"):
            runtime.to_device(np.zeros(2, dt))
    with pytest.raises(TypeError, match="dtype"):
        runtime.empty(2, "V2")


# ---------------------------------------------------------------------------- kernels


def test_add_and_mul_round_like_ml_dtypes():
    a, b = sample((7, 9), seed=10), sample((7, 9), seed=11)
    out = runtime.empty((7, 9), "bfloat16")
    da, db = runtime.to_device(a), runtime.to_device(b)
    kernels.add(out, da, db)
    assert_bits_equal(out.copy_to_host(), model(np.add, a, b))
    assert_bits_equal(out.copy_to_host(), a + b)  # ml_dtypes' own ufunc agrees
    # The model rounds: some sums are not exact in bfloat16.
    assert (model(np.add, a, b).astype(F32) != a.astype(F32) + b.astype(F32)).any()
    kernels.mul(out, da, db)
    assert_bits_equal(out.copy_to_host(), model(np.multiply, a, b))
    kernels.add(da, da, da)  # in place
    assert_bits_equal(da.copy_to_host(), model(np.add, a, a))


def test_scale_and_axpy():
    x, y = sample((50,), seed=12), sample((50,), seed=13)
    alpha = 0.1  # not a bfloat16 value: rounded to one first, as np.asarray(0.1, bfloat16)
    a32 = np.asarray(alpha, BF16).astype(F32)
    out = runtime.empty(50, "bfloat16")
    kernels.scale(out, runtime.to_device(x), alpha)
    assert_bits_equal(out.copy_to_host(), (a32 * x.astype(F32)).astype(BF16))
    assert_bits_equal(out.copy_to_host(), np.asarray(alpha, BF16) * x)
    dy = runtime.to_device(y)
    kernels.axpy(dy, runtime.to_device(x), alpha)
    # One rounding to bfloat16 at the end (numpy's two-step a*x + y rounds twice).
    assert_bits_equal(dy.copy_to_host(), (a32 * x.astype(F32) + y.astype(F32)).astype(BF16))
    # A bfloat16 numpy scalar is the same alpha.
    kernels.scale(out, runtime.to_device(x), ml_dtypes.bfloat16(alpha))
    assert_bits_equal(out.copy_to_host(), np.asarray(alpha, BF16) * x)


def test_fill_and_copy():
    out = runtime.empty(33, "bfloat16")
    for value in (0, 1, -2.5, 0.1, ml_dtypes.bfloat16(0.3), np.float32(1e-3), 1e39, -1e39):
        kernels.fill(out, value)
        with np.errstate(over="ignore"):
            want = np.full(33, value, BF16)
        assert_bits_equal(out.copy_to_host(), want)
    assert np.isinf(out.copy_to_host()).all()
    src = runtime.to_device(sample((33,), seed=9))
    kernels.copy(out, src)
    runtime.synchronize()
    assert_bits_equal(out.copy_to_host(), src.copy_to_host())
    with pytest.raises(ValueError, match="complex"):
        kernels.fill(out, 1j)


def test_sum_accumulates_in_float64_and_rounds_once():
    x = sample((200,), seed=14)
    out = runtime.empty(1, "bfloat16")
    kernels.sum(out, runtime.to_device(x))
    # These values' float64 sum is exact, so the one rounding is the only error.
    want = np.asarray([x.astype(np.float64).sum()]).astype(BF16)
    assert_bits_equal(out.copy_to_host(), want)


def test_matmul_accumulates_in_float32():
    # Small integers over 4: every product and partial sum is exact in float32, whatever the
    # order, so the result is the float32 product rounded once.
    rng = np.random.default_rng(15)
    a = (rng.integers(-8, 8, (5, 7)) / 4).astype(BF16)
    b = (rng.integers(-8, 8, (7, 3)) / 4).astype(BF16)
    out = runtime.empty((5, 3), "bfloat16")
    kernels.matmul(out, runtime.to_device(a), runtime.to_device(b))
    assert_bits_equal(out.copy_to_host(), model(np.matmul, a, b))
    # Random values: within one bfloat16 rounding of the float32 product.
    a, b = sample((16, 32), seed=16, spread=3), sample((32, 8), seed=17, spread=3)
    out = runtime.empty((16, 8), "bfloat16")
    kernels.matmul(out, runtime.to_device(a), runtime.to_device(b))
    exact = a.astype(np.float64) @ b.astype(np.float64)
    mag = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    err = np.abs(out.copy_to_host().astype(np.float64) - exact)
    assert (err <= 2.0**-8 * mag + 1e-30).all()


def test_mixed_dtypes_are_refused():
    a = runtime.zeros(4, "bfloat16")
    with pytest.raises(ValueError, match="bfloat16"):
        kernels.add(a, a, runtime.zeros(4, "float16"))


# ----------------------------------------------------------------------------- DLPack


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device_type", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


def _capsule_tensor(capsule, name: bytes) -> _DLTensor:
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    ptr = get(capsule, name)
    if name == b"dltensor_versioned":
        # DLManagedTensorVersioned: version (2 x u32), manager_ctx, deleter, flags (u64), then
        # the DLTensor.
        ptr += 8 + 2 * ctypes.sizeof(ctypes.c_void_p) + 8
    return _DLTensor.from_address(ptr)


@pytest.mark.parametrize(
    "max_version, name", [(None, b"dltensor"), ((1, 0), b"dltensor_versioned")]
)
def test_dlpack_dtype_is_kdlbfloat(max_version, name):
    host = sample((2, 3), seed=20)
    d = runtime.to_device(host)
    cap = d.__dlpack__(max_version=max_version)
    t = _capsule_tensor(cap, name)
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (4, 16, 1)  # kDLBfloat
    assert t.ndim == 2 and [t.shape[0], t.shape[1]] == [2, 3]
    assert [t.strides[0], t.strides[1]] == [3, 1]
    assert t.data + t.byte_offset == d.ptr
    del cap  # never consumed: its destructor frees the tensor


def test_dlpack_with_torch_shares_memory():
    torch = pytest.importorskip("torch")
    host = sample((3, 4), seed=21)
    d = runtime.to_device(host)
    t = torch.from_dlpack(d)
    assert t.dtype == torch.bfloat16 and tuple(t.shape) == (3, 4)
    np.testing.assert_array_equal(t.view(torch.int16).numpy().view(np.uint16), bits(host))
    # Writes are shared, both ways.
    t[0, 0] = 5.0
    assert d.copy_to_host()[0, 0] == 5.0
    kernels.fill(d, 0.5)
    runtime.synchronize()
    assert bool((t == 0.5).all())
    # An offset view, and torch's arithmetic agreeing with the kernels' rounding.
    v = d.view("bfloat16", (5,), 4)
    assert torch.from_dlpack(v).data_ptr() == d.ptr + 4
    a, b = sample((64,), seed=22), sample((64,), seed=23)
    out = runtime.empty(64, "bfloat16")
    da, db = runtime.to_device(a), runtime.to_device(b)
    kernels.add(out, da, db)
    want = torch.from_dlpack(da) + torch.from_dlpack(db)
    np.testing.assert_array_equal(
        bits(out.copy_to_host()), want.view(torch.int16).numpy().view(np.uint16)
    )


def test_dlpack_with_numpy():
    if np.lib.NumpyVersion(np.__version__) < "2.5.0":
        pytest.skip("numpy.from_dlpack takes bfloat16 from numpy 2.5 (register_dlpack_dtype)")
    host = sample((2, 5), seed=24)
    d = runtime.to_device(host)
    a = np.from_dlpack(d)
    assert a.dtype == BF16
    assert_bits_equal(a, host)
    a[0, 0] = ml_dtypes.bfloat16(2.0)
    assert d.copy_to_host()[0, 0] == 2.0


# ------------------------------------------------------------ DLPack import (to_device)


class DLPackOnly:
    """Exposes only the DLPack methods of ``obj`` (torch's ``TensorDLPackWrapper``): no
    buffer protocol, no ``__array__``, so ``to_device`` must import through DLPack."""

    def __init__(self, obj, legacy=False):
        self.obj, self.legacy, self.calls = obj, legacy, []

    def __dlpack__(self, *args, **kwargs):
        self.calls.append(kwargs)
        if self.legacy:  # a pre-1.0 producer: no keywords at all
            assert not args and not kwargs
        return self.obj.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self.obj.__dlpack_device__()


def test_to_device_imports_a_bfloat16_dlpack_producer_without_torch():
    # The producer is a runtime buffer behind DLPackOnly: kDLBfloat 16 comes back as
    # ml_dtypes.bfloat16 with every bit pattern intact, through the versioned capsule.
    every = np.arange(1 << 16, dtype=np.uint16).view(BF16)
    src = runtime.to_device(every)
    w = DLPackOnly(src)
    d = runtime.to_device(w)
    assert d.dtype == BF16 and d.shape == every.shape and d.ptr != src.ptr  # a copy
    assert_bits_equal(d.copy_to_host(), every)
    assert w.calls and w.calls[0].get("max_version", (0, 0))[0] >= 1
    # a device buffer is itself a DLPack producer, an offset view and a 0-d one too
    assert_bits_equal(runtime.to_device(src.view("bfloat16", (7,), 10)).copy_to_host(), every[5:12])
    scalar = runtime.to_device(src.view("bfloat16", (), 2))
    assert scalar.shape == () and bits(scalar.copy_to_host()) == bits(every[1])
    empty = runtime.to_device(DLPackOnly(runtime.empty((0, 3), "bfloat16")))
    assert empty.shape == (0, 3) and empty.dtype == BF16


def test_to_device_imports_a_legacy_dlpack_producer():
    host = sample((3, 5), seed=40)
    w = DLPackOnly(runtime.to_device(host), legacy=True)

    class Legacy:  # __dlpack__ without keywords and no __dlpack_device__
        def __dlpack__(self):
            return w.__dlpack__()

    assert_bits_equal(runtime.to_device(Legacy()).copy_to_host(), host)

    class PreVersioned:  # says where its memory is, but takes no max_version (DLPack 0.x)
        def __dlpack__(self, stream=None):
            return w.__dlpack__()

        def __dlpack_device__(self):
            return (1, 0)

    assert_bits_equal(runtime.to_device(PreVersioned()).copy_to_host(), host)


def test_to_device_dlpack_import_on_a_stream_keeps_the_source_alive():
    host = sample((4096,), seed=41)
    s = runtime.Stream(0)
    release_ev = __import__("threading").Event()
    s.launch_host_func(lambda: release_ev.wait(10.0))
    d = runtime.to_device(DLPackOnly(runtime.to_device(host)), stream=s)
    __import__("gc").collect()  # the producer and its capsule are gone from Python's side
    release_ev.set()
    s.synchronize(timeout=10.0)
    assert_bits_equal(d.copy_to_host(), host)


TORCH_DTYPES = [
    "bfloat16",
    "float16",
    "float32",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "bool",
    "complex64",
    "complex128",
]


@pytest.mark.parametrize("name", TORCH_DTYPES)
def test_to_device_of_a_torch_tensor_keeps_dtype_and_values(name):
    torch = pytest.importorskip("torch")
    dtype = getattr(torch, name)
    g = torch.Generator().manual_seed(42)
    if dtype == torch.bool:
        t = torch.randint(0, 2, (5, 3), generator=g).bool()
    elif dtype.is_floating_point or dtype.is_complex:
        t = (torch.randn((5, 3), generator=g, dtype=torch.float64) * 100).to(dtype)
    else:
        t = torch.randint(-100 if dtype != torch.uint8 else 0, 100, (5, 3), generator=g).to(dtype)
    for src in (t, DLPackOnly(t)):
        d = runtime.to_device(src)
        assert d.shape == (5, 3)
        if name == "bfloat16":
            assert d.dtype == BF16
            got = d.copy_to_host().view(np.int16)
            np.testing.assert_array_equal(got, t.view(torch.int16).numpy())
        else:
            assert d.dtype == np.dtype(name)
            np.testing.assert_array_equal(d.copy_to_host(), t.numpy())


def test_to_device_of_noncontiguous_torch_bfloat16_views():
    torch = pytest.importorskip("torch")
    x = torch.arange(25, dtype=torch.float32).reshape(5, 5).to(torch.bfloat16)
    for y in (x[0], x[:, 0], x[1, :], x[1], x.t(), x[::2, 1::3]):
        d = runtime.to_device(y)
        assert d.dtype == BF16 and d.shape == tuple(y.shape)
        want = y.contiguous().view(torch.int16).numpy()
        np.testing.assert_array_equal(d.copy_to_host().view(np.int16), want)
        # and the same values through ml_dtypes
        np.testing.assert_array_equal(d.copy_to_host().astype(F32), y.float().numpy())


def test_to_device_reports_the_producers_error():
    torch = pytest.importorskip("torch")
    with pytest.raises(BufferError, match="require gradient"):
        runtime.to_device(torch.zeros(3, requires_grad=True))
    with pytest.raises(BufferError, match="conjugate bit"):
        runtime.to_device(torch.conj(torch.tensor([1 + 1j, 2 - 2j])))
    with pytest.raises(TypeError, match=r"array: DLPack dtype \(code"):
        runtime.to_device(torch.zeros(3, dtype=torch.float8_e4m3fn))


# --------------------------------------------------------------- native kernels, collectives


def test_a_bfloat16_scalar_reaches_a_native_kernel_as_two_bytes():
    numba = pytest.importorskip("numba")
    from numba import carray, types

    sig = types.int32(types.uint32, types.uint32, types.CPointer(types.voidptr))

    @numba.cfunc(sig)
    def fill_bits(block_idx, block_num, params):
        n = carray(params[2], (1,), np.int64)[0]
        out = carray(params[0], (n,), np.uint16)
        value = carray(params[1], (1,), np.uint16)[0]  # the scalar's own 2 bytes
        for i in range(n * block_idx // block_num, n * (block_idx + 1) // block_num):
            out[i] = value
        return 0

    k = runtime.Kernel.from_cfunc(fill_bits, nargs=3)
    out = runtime.zeros(100, "bfloat16")
    k(out, ml_dtypes.bfloat16(-1.5), 100, block_dim=4)
    runtime.synchronize()
    assert_bits_equal(out.copy_to_host(), np.full(100, -1.5, BF16))
    assert bits(out.copy_to_host())[0] == 0xBFC0


@pytest.mark.parametrize("op", ["sum", "max", "avg"])
def test_all_reduce(op):
    from runtime import comm

    cs = comm.init_all(range(2), timeout=60.0)
    xs = [sample((1001,), seed=30 + r) for r in range(2)]
    sends = [runtime.to_device(x, device=c.device) for c, x in zip(cs, xs)]
    recvs = [runtime.empty(1001, "bfloat16", c.device) for c in cs]
    for c, s, r in zip(cs, sends, recvs):
        c.all_reduce(s, r, op=op)
    for c in cs:
        runtime.current_stream(c.device).synchronize(timeout=60.0)
    f = [x.astype(F32) for x in xs]
    want = {
        "sum": (f[0] + f[1]).astype(BF16),
        "max": np.maximum(xs[0], xs[1]),
        # the sum rounded to bfloat16, then divided by 2 (exact) and rounded again
        "avg": ((f[0] + f[1]).astype(BF16).astype(F32) / 2).astype(BF16),
    }[op]
    for r in recvs:
        assert_bits_equal(r.copy_to_host(), want)
    for c in cs:
        c.destroy()


# -------------------------------------------------------------------- without ml_dtypes


def test_without_ml_dtypes_the_name_says_to_install_it():
    code = textwrap.dedent(
        """
        import sys
        sys.modules["ml_dtypes"] = None  # import ml_dtypes now raises ImportError
        import numpy as np
        import runtime
        runtime.init(device_count=1, memory="16MiB")
        try:
            runtime.empty(4, "bfloat16")
        except TypeError as e:
            assert "ml_dtypes" in str(e) and "pip install" in str(e), e
            assert isinstance(e.__cause__, ImportError), repr(e.__cause__)
        else:
            raise AssertionError("no error")
        try:
            runtime.to_device(np.zeros(2, np.float32)).view("bfloat16")
        except TypeError as e:
            assert "ml_dtypes" in str(e), e
        else:
            raise AssertionError("no error")
        # A bfloat16 DLPack producer (a torch tensor) gets the same advice.
        try:
            import torch
        except ImportError:
            pass
        else:
            try:
                runtime.to_device(torch.zeros(2, dtype=torch.bfloat16))
            except TypeError as e:
                assert "array" in str(e) and "pip install ml_dtypes" in str(e), e
            else:
                raise AssertionError("no error")
        # Everything else is unaffected.
        b = runtime.to_device(np.arange(4, dtype=np.float16))
        assert b.copy_to_host().tolist() == [0, 1, 2, 3]
        runtime.shutdown()
        print("ok")
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"
