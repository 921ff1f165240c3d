"""Every fixed-size numpy dtype: allocation, copies, numpy and DLPack exports, numpy's
``ndarray.view(dtype)`` rule (with a Hypothesis model), and the native kernels against numpy
(float16 within its precision)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import runtime
from runtime import kernels

DTYPES = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
]
NUMERIC = [d for d in DTYPES if d != "bool"]


@pytest.fixture(scope="module", autouse=True)
def rt():
    runtime.shutdown()
    runtime.init(device_count=2, memory="256MiB")
    yield
    runtime.shutdown()


def sample(dtype: str, shape, seed: int = 0) -> np.ndarray:
    """Values that exercise the type: full-range integers (so sums and products wrap), floats
    with fractions in [-8, 8), complex with both parts, random booleans."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64))
    if dt.kind == "b":
        out = rng.integers(0, 2, n).astype(bool)
    elif dt.kind in "iu":
        out = rng.integers(0, 256, n * dt.itemsize, dtype=np.uint8).view(dt)
    elif dt.kind == "f":
        out = ((rng.integers(0, 1024, n) - 512) / 64).astype(dt)
    else:
        re, im = (rng.integers(0, 1024, n) - 512) / 64, (rng.integers(0, 1024, n) - 512) / 64
        out = (re + 1j * im).astype(dt)
    return out.reshape(shape)


def tolerance(dtype: str) -> dict:
    kind_size = np.dtype(dtype)
    if kind_size.kind in "biu":
        return {"rtol": 0, "atol": 0}
    bits = {2: 1e-3, 4: 1e-5, 8: 1e-12, 16: 1e-12}[kind_size.itemsize]
    if kind_size == np.complex64:
        bits = 1e-5
    return {"rtol": bits, "atol": bits}


def assert_matches(got: np.ndarray, want: np.ndarray, dtype: str, scale: float = 1.0) -> None:
    assert got.dtype == np.dtype(dtype)
    assert got.shape == want.shape
    tol = tolerance(dtype)
    if tol["rtol"] == 0:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(
            got.astype(np.complex128),
            want.astype(np.complex128),
            rtol=tol["rtol"] * scale,
            atol=tol["atol"] * scale,
        )


# --------------------------------------------------------------- buffers, copies, exports


@pytest.mark.parametrize("dtype", DTYPES)
def test_empty_zeros_and_round_trip(dtype):
    e = runtime.empty((3, 5), dtype)
    z = runtime.zeros((3, 5), dtype)
    for b in (e, z):
        assert b.dtype == np.dtype(dtype)
        assert b.itemsize == np.dtype(dtype).itemsize
        assert b.nbytes == 15 * np.dtype(dtype).itemsize
        assert b.shape == (3, 5)
    np.testing.assert_array_equal(z.copy_to_host(), np.zeros((3, 5), dtype))
    host = sample(dtype, (4, 3, 2), seed=1)
    d = runtime.to_device(host)
    assert d.dtype == host.dtype and d.shape == host.shape
    back = d.copy_to_host()
    assert back.dtype == host.dtype
    assert back.tobytes() == host.tobytes()
    arr = np.asarray(d)
    assert arr.dtype == host.dtype and arr.tobytes() == host.tobytes()


@pytest.mark.parametrize("dtype", DTYPES)
def test_to_device_of_strided_and_fortran_arrays(dtype):
    base = sample(dtype, (6, 8), seed=2)
    for host in (base[::2, 1::3], np.asfortranarray(base), base.T):
        np.testing.assert_array_equal(runtime.to_device(host).copy_to_host(), host)


@pytest.mark.parametrize("dtype", DTYPES)
def test_memcpy_h2d_d2h_d2d(dtype):
    host = sample(dtype, (16,), seed=3)
    a = runtime.empty(16, dtype)
    b = runtime.empty(16, dtype, device=1)
    runtime.memcpy_host_to_device(a, host)
    runtime.memcpy_d2d(b, a)
    out = np.empty(16, dtype)
    runtime.memcpy_device_to_host(out, b)
    assert out.tobytes() == host.tobytes()
    # A strided source is copied as its C-ordered values.
    wide = sample(dtype, (32,), seed=4)
    runtime.memcpy_host_to_device(a, wide[::2])
    assert a.copy_to_host().tobytes() == wide[::2].tobytes()
    # Part of a buffer, by byte offsets.
    item = np.dtype(dtype).itemsize
    runtime.memcpy_host_to_device(a, host[:4], dst_offset=4 * item)
    expect = wide[::2].copy()
    expect[4:8] = host[:4]
    assert a.copy_to_host().tobytes() == expect.tobytes()


@pytest.mark.parametrize("dtype", DTYPES)
def test_dlpack_round_trip_with_numpy(dtype):
    host = sample(dtype, (3, 4), seed=5)
    d = runtime.to_device(host)
    arr = np.from_dlpack(d)
    assert arr.dtype == host.dtype and arr.shape == host.shape
    assert arr.tobytes() == host.tobytes()
    # Shared memory: a write through numpy is seen by the device buffer.
    arr[0, 0] = arr[1, 1]
    expect = host.copy()
    expect[0, 0] = host[1, 1]
    assert d.copy_to_host().tobytes() == expect.tobytes()
    # And back onto the device from the imported array.
    again = runtime.to_device(arr)
    assert again.copy_to_host().tobytes() == expect.tobytes()


@pytest.mark.parametrize("dtype", DTYPES)
def test_dlpack_of_an_offset_view(dtype):
    host = sample(dtype, (8,), seed=6)
    d = runtime.to_device(host)
    item = np.dtype(dtype).itemsize
    v = d.view(dtype, (3,), 2 * item)
    assert np.from_dlpack(v).tobytes() == host[2:5].tobytes()


def test_unsupported_dtypes_are_type_errors():
    for bad in ("U3", "S2", "O", "datetime64[s]", "timedelta64[ns]", "V8", [("a", "i4")]):
        with pytest.raises(TypeError, match="dtype"):
            runtime.empty(2, bad)
    with pytest.raises(TypeError, match="dtype"):
        runtime.to_device(np.zeros(2, "M8[s]"))


@pytest.mark.parametrize("dtype", [d for d in DTYPES if np.dtype(d).itemsize > 1])
def test_non_native_byte_order_is_converted_or_refused(dtype):
    swapped = np.dtype(dtype).newbyteorder("S")
    host = sample(dtype, (5,), seed=7).astype(swapped)
    np.testing.assert_array_equal(runtime.to_device(host).copy_to_host(), host)
    with pytest.raises(ValueError, match="byte order"):
        runtime.empty(3, swapped)


# ------------------------------------------------------------------------------ views


@pytest.mark.parametrize("src", DTYPES)
@pytest.mark.parametrize("dst", DTYPES)
def test_view_matches_numpy(src, dst):
    host = sample(src, (3, 16), seed=8)  # 16 bytes or more per row: every view is valid
    got = runtime.to_device(host).view(dst)
    want = host.view(dst)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert got.copy_to_host().tobytes() == want.tobytes()


def test_view_errors_match_numpy():
    cases = [((4, 3), "int16", "int64"), ((), "float32", "float64"), ((5,), "uint8", "complex64")]
    for shape, src, dst in cases:
        host = np.zeros(shape, src)
        with pytest.raises(ValueError) as np_err:
            host.view(dst)
        with pytest.raises(ValueError) as ours:
            runtime.to_device(host).view(dst)
        # numpy's sentence, with our sizes after it
        assert str(np_err.value).lower().rstrip(".") in str(ours.value).lower()
        assert str(ours.value).startswith("dtype: ")


@given(
    src=st.sampled_from(DTYPES),
    dst=st.sampled_from(DTYPES),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6),
    data=st.data(),
)
def test_view_against_numpy_model(src, dst, shape, data):
    """``DeviceBuffer.view(dtype)`` against numpy's ``ndarray.view(dtype)`` on the same bytes:
    the same shape and bytes, or a ValueError exactly where numpy raises one."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(src).itemsize
    raw = data.draw(st.binary(min_size=nbytes, max_size=nbytes))
    host = np.frombuffer(raw, dtype=src).reshape(shape).copy()
    d = runtime.to_device(host)
    try:
        want = host.view(dst)
    except ValueError:
        with pytest.raises(ValueError, match="^dtype: "):
            d.view(dst)
        return
    got = d.view(dst)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert got.offset == d.offset and got.nbytes == d.nbytes
    assert got.copy_to_host().tobytes() == want.tobytes()


# ---------------------------------------------------------------------------- kernels


@pytest.mark.parametrize("dtype", DTYPES)
def test_fill_and_copy(dtype):
    n = 33
    out = runtime.empty(n, dtype)
    for value in (1, 0):
        kernels.fill(out, value)
        np.testing.assert_array_equal(out.copy_to_host(), np.full(n, value, dtype))
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        top = min(int(info.max), 2**63 - 1)
        kernels.fill(out, top)
        np.testing.assert_array_equal(out.copy_to_host(), np.full(n, top, dtype))
        kernels.fill(out, int(info.min))
        np.testing.assert_array_equal(out.copy_to_host(), np.full(n, info.min, dtype))
        with pytest.raises(ValueError, match="does not fit|64-bit range"):
            kernels.fill(out, int(info.min) - 1)
    elif np.dtype(dtype).kind in "fc":
        kernels.fill(out, 0.1)
        np.testing.assert_array_equal(out.copy_to_host(), np.full(n, 0.1, dtype))
    src = runtime.to_device(sample(dtype, (n,), seed=9))
    kernels.copy(out, src)
    runtime.synchronize()
    assert out.copy_to_host().tobytes() == src.copy_to_host().tobytes()


def test_bool_kernel_rules():
    out = runtime.to_device(np.array([True, False, True, True]))
    with pytest.raises(ValueError, match="value.*does not fit in bool"):
        kernels.fill(out, 2)
    with pytest.raises(ValueError, match="bool"):
        kernels.scale(out, out, 1)
    with pytest.raises(ValueError, match="bool"):
        kernels.axpy(out, out, 1)
    with pytest.raises(ValueError, match="bool"):
        kernels.sum(runtime.empty(1, "bool"), out)
    np.testing.assert_array_equal(out.copy_to_host(), [True, False, True, True])
    kernels.fill(out, True)
    np.testing.assert_array_equal(out.copy_to_host(), [True] * 4)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["add", "mul"])
def test_elementwise_vs_numpy(dtype, op):
    a, b = sample(dtype, (7, 9), seed=10), sample(dtype, (7, 9), seed=11)
    out = runtime.empty((7, 9), dtype)
    getattr(kernels, op)(out, runtime.to_device(a), runtime.to_device(b))
    want = np.add(a, b) if op == "add" else np.multiply(a, b)
    assert_matches(out.copy_to_host(), want, dtype)


@pytest.mark.parametrize("dtype", NUMERIC)
def test_scale_and_axpy_vs_numpy(dtype):
    x, y = sample(dtype, (50,), seed=12), sample(dtype, (50,), seed=13)
    alpha = 3 if np.dtype(dtype).kind in "iu" else 0.75
    a = np.asarray(alpha, dtype)
    out = runtime.empty(50, dtype)
    kernels.scale(out, runtime.to_device(x), alpha)
    assert_matches(out.copy_to_host(), a * x, dtype)
    dy = runtime.to_device(y)
    kernels.axpy(dy, runtime.to_device(x), alpha)
    # float16: numpy rounds a*x before adding y; the kernel rounds once
    assert_matches(dy.copy_to_host(), a * x + y, dtype, scale=4)


@pytest.mark.parametrize("dtype", NUMERIC)
def test_sum_vs_numpy(dtype):
    x = sample(dtype, (200,), seed=14)
    out = runtime.empty(1, dtype)
    kernels.sum(out, runtime.to_device(x))
    want = np.add.reduce(x.astype(np.complex128) if np.dtype(dtype).kind == "c" else x, dtype=None)
    if np.dtype(dtype).kind in "iu":
        want = np.add.reduce(x, dtype=dtype)  # wraps in the dtype, as the kernel does
    want = np.asarray([want]).astype(dtype)
    assert_matches(out.copy_to_host(), want, dtype, scale=20)


@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_vs_numpy(dtype):
    a, b = sample(dtype, (5, 7), seed=15), sample(dtype, (7, 3), seed=16)
    out = runtime.empty((5, 3), dtype)
    kernels.matmul(out, runtime.to_device(a), runtime.to_device(b))
    assert_matches(out.copy_to_host(), np.matmul(a, b), dtype, scale=10)


@pytest.mark.parametrize("dtype", ["int8", "uint16", "float16", "complex64"])
def test_kernels_in_place(dtype):
    x = sample(dtype, (20,), seed=17)
    d = runtime.to_device(x)
    kernels.add(d, d, d)
    assert_matches(d.copy_to_host(), x + x, dtype)


def test_float16_rounds_like_numpy():
    a = np.array([0.1, 1000.0, 65504.0, -3.3], np.float16)
    b = np.array([0.2, 0.5, 65504.0, 1e-3], np.float16)
    out = runtime.empty(4, "float16")
    kernels.add(out, runtime.to_device(a), runtime.to_device(b))
    with np.errstate(over="ignore"):
        want = a + b
    np.testing.assert_array_equal(out.copy_to_host(), want)  # inf included
    kernels.fill(out, 1e6)
    assert np.isinf(out.copy_to_host()).all()


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_complex_scalars(dtype):
    x = sample(dtype, (12,), seed=18)
    out = runtime.empty(12, dtype)
    for alpha in (1.5 - 2j, np.complex64(0.5 + 1j), np.complex128(-1j)):
        kernels.scale(out, runtime.to_device(x), alpha)
        assert_matches(out.copy_to_host(), np.asarray(alpha, dtype) * x, dtype)
    kernels.fill(out, 2 + 3j)
    np.testing.assert_array_equal(out.copy_to_host(), np.full(12, 2 + 3j, dtype))


def test_complex_scalar_for_a_real_buffer_is_refused():
    out = runtime.to_device(np.ones(4, np.float32))
    for bad in (1j, np.complex64(1 + 1j)):
        with pytest.raises(ValueError, match="value.*complex.*float32"):
            kernels.fill(out, bad)
    # numpy real scalars stay real
    kernels.fill(out, np.float32(0.5))
    np.testing.assert_array_equal(out.copy_to_host(), np.full(4, 0.5, np.float32))
    kernels.fill(out, np.float16(2.0))
    np.testing.assert_array_equal(out.copy_to_host(), np.full(4, 2.0, np.float32))
