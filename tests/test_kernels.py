"""The native kernels in runtime.kernels, checked against numpy."""

from __future__ import annotations

import numpy as np
import pytest

import runtime
from runtime import kernels

WAIT = 10.0
DTYPES = ["float32", "float64", "int32", "int64"]
NAMES = ["add", "axpy", "copy", "fill", "matmul", "mul", "noop", "scale", "sum"]


@pytest.fixture(scope="module", autouse=True)
def _runtime():
    runtime.init(device_count=4, memory="1GiB")
    yield
    runtime.shutdown()


@pytest.fixture
def stream():
    s = runtime.Stream(0)
    yield s
    s.synchronize(timeout=WAIT)
    s.destroy()


def data(dtype, shape, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(-100, 100, shape).astype(dtype)


def check(got, want):
    if got.dtype.kind == "f":
        tol = 1e-5 if got.dtype == np.float32 else 1e-12
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    else:
        np.testing.assert_array_equal(got, want)


def run(stream, kernel, *args):
    stream.launch_kernel(kernel, args)
    stream.synchronize(timeout=WAIT)


# --- registry ---------------------------------------------------------------------------------


def test_names_lists_builtins():
    names = kernels.names()
    assert set(NAMES) <= set(names)
    assert names == sorted(names)
    for n in NAMES:
        k = getattr(kernels, n)
        assert isinstance(k, runtime.Kernel)
        assert k.name == n
        assert repr(k) == f"runtime.kernels.{n}"
        assert kernels.get(n).name == n


def test_get_unknown_lists_names():
    with pytest.raises(ValueError, match="nope") as ei:
        kernels.get("nope")
    for n in NAMES:
        assert n in str(ei.value)
    with pytest.raises(ValueError, match="nope"):
        runtime.Kernel("nope")


# --- each kernel, each dtype ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_fill(stream, dtype):
    x = runtime.empty((5, 7), dtype)
    run(stream, kernels.fill, x, 3)
    check(x.copy_to_host(), np.full((5, 7), 3, dtype))
    run(stream, kernels.fill, x, -2.0)  # an integral float is fine for int dtypes
    check(x.copy_to_host(), np.full((5, 7), -2, dtype))
    run(stream, kernels.fill, x, np.float32(4))  # numpy scalars are numbers
    check(x.copy_to_host(), np.full((5, 7), 4, dtype))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fill_fractional_float(stream, dtype):
    x = runtime.empty(9, dtype)
    run(stream, kernels.fill, x, 0.25)
    check(x.copy_to_host(), np.full(9, 0.25, dtype))


def test_fill_numpy_integers_are_exact(stream):
    # numpy integer scalars are integers, not floats: 2**53 + 1 has no float64, and
    # float(int64 max) rounds up to 2**63, which does not fit in int64.
    x = runtime.empty(3, "int64")
    big = 2**53 + 1
    top = int(np.iinfo(np.int64).max)
    for value, want in [
        (np.int64(big), big),
        (np.int64(top), top),
        (np.iinfo(np.int64).max, top),  # a Python int, as before
        (np.int64(np.iinfo(np.int64).min), int(np.iinfo(np.int64).min)),
        (np.uint64(big), big),
        (np.uint32(4_000_000_000), 4_000_000_000),
        (np.int8(-7), -7),
    ]:
        run(stream, kernels.fill, x, value)
        got = x.copy_to_host()
        assert got.tolist() == [want] * 3, (type(value).__name__, value)
    # out of 64-bit range: the same error as for a Python int
    for value in (np.uint64(2**64 - 1), 2**64 - 1):
        with pytest.raises(ValueError, match=r"args\[1\]: integer out of 64-bit range"):
            stream.launch_kernel(kernels.fill, (x, value))
    # numpy integers into an int32 tensor: range-checked as integers
    y = runtime.empty(2, "int32")
    run(stream, kernels.fill, y, np.int64(-(2**31)))
    assert y.copy_to_host().tolist() == [-(2**31)] * 2
    with pytest.raises(ValueError, match="does not fit in int32"):
        stream.launch_kernel(kernels.fill, (y, np.int64(2**31)))


def test_fill_bools_and_floats_unchanged(stream):
    x = runtime.empty(2, "int64")
    run(stream, kernels.fill, x, True)
    assert x.copy_to_host().tolist() == [1, 1]
    run(stream, kernels.fill, x, np.bool_(True))  # numpy.bool_ is a number, not an integer
    assert x.copy_to_host().tolist() == [1, 1]
    run(stream, kernels.fill, x, np.float64(3.0))
    assert x.copy_to_host().tolist() == [3, 3]
    for value in (2.5, np.float64(2.5), np.float32(2.5)):
        with pytest.raises(ValueError, match="not an integer"):
            stream.launch_kernel(kernels.fill, (x, value))
    f = runtime.empty(2, "float64")
    run(stream, kernels.fill, f, np.float64(0.1))
    assert f.copy_to_host().tolist() == [0.1, 0.1]
    run(stream, kernels.fill, f, np.int64(2**53 + 1))  # into floats: the nearest float
    assert f.copy_to_host().tolist() == [float(2**53)] * 2


@pytest.mark.parametrize("dtype", DTYPES)
def test_copy(stream, dtype):
    a = data(dtype, (4, 33))
    src = runtime.to_device(a)
    dst = runtime.empty((4, 33), dtype)
    run(stream, kernels.copy, dst, src)
    check(dst.copy_to_host(), a)


@pytest.mark.parametrize("dtype", DTYPES)
def test_scale(stream, dtype):
    a = data(dtype, 1000)
    x = runtime.to_device(a)
    out = runtime.empty(1000, dtype)
    alpha = 3 if np.dtype(dtype).kind == "i" else 2.5
    run(stream, kernels.scale, out, x, alpha)
    check(out.copy_to_host(), (alpha * a).astype(dtype))
    check(x.copy_to_host(), a)  # input untouched


@pytest.mark.parametrize("dtype", DTYPES)
def test_axpy(stream, dtype):
    a, b = data(dtype, 517, 1), data(dtype, 517, 2)
    x, y = runtime.to_device(a), runtime.to_device(b)
    alpha = -2 if np.dtype(dtype).kind == "i" else 0.5
    run(stream, kernels.axpy, y, x, alpha)
    check(y.copy_to_host(), (alpha * a + b).astype(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["add", "mul"])
def test_add_mul(stream, dtype, name):
    a, b = data(dtype, (6, 50), 1), data(dtype, (6, 50), 2)
    out = runtime.empty((6, 50), dtype)
    run(stream, getattr(kernels, name), out, runtime.to_device(a), runtime.to_device(b))
    check(out.copy_to_host(), getattr(np, {"add": "add", "mul": "multiply"}[name])(a, b))


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_mul_different_shapes_same_size(stream, dtype):
    a, b = data(dtype, (4, 6), 1), data(dtype, 24, 2)
    out = runtime.empty((2, 12), dtype)
    run(stream, kernels.add, out, runtime.to_device(a), runtime.to_device(b))
    check(out.copy_to_host(), (a.ravel() + b).reshape(2, 12))


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_integer_arithmetic_wraps_like_numpy(stream, dtype):
    info = np.iinfo(dtype)
    a = np.array([info.max, info.min, info.max, 7], dtype)
    b = np.array([1, -1, 2, 3], dtype)
    out = runtime.empty(4, dtype)
    run(stream, kernels.add, out, runtime.to_device(a), runtime.to_device(b))
    check(out.copy_to_host(), a + b)
    run(stream, kernels.mul, out, runtime.to_device(a), runtime.to_device(b))
    check(out.copy_to_host(), a * b)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 7, 8, 1001])
def test_sum(stream, dtype, n):
    a = data(dtype, n)
    out = runtime.empty(1, dtype)
    run(stream, kernels.sum, out, runtime.to_device(a))
    got = out.copy_to_host()
    if np.dtype(dtype).kind == "f":
        np.testing.assert_allclose(got[0], a.astype(np.float64).sum(), rtol=1e-5, atol=1e-5)
    else:
        assert got[0] == a.sum(dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sum_of_empty_is_zero(stream, dtype):
    out = runtime.to_device(np.ones(1, dtype))
    run(stream, kernels.sum, out, runtime.empty(0, dtype))
    assert out.copy_to_host()[0] == 0


def test_sum_float32_accumulates_accurately(stream):
    a = np.full(1_000_001, 0.1, np.float32)
    out = runtime.empty(1, "float32")
    run(stream, kernels.sum, out, runtime.to_device(a))
    np.testing.assert_allclose(out.copy_to_host()[0], a.astype(np.float64).sum(), rtol=1e-6)


def test_noop(stream):
    for _ in range(10):
        stream.launch_kernel(kernels.noop)
    stream.launch_kernel(kernels.noop, ())
    stream.launch_kernel("noop")
    stream.synchronize(timeout=WAIT)
    assert stream.query()


# --- matmul -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "m,k,n", [(1, 1, 1), (7, 5, 3), (64, 64, 64), (128, 256, 64), (3, 1, 4), (1, 9, 1)]
)
def test_matmul(stream, dtype, m, k, n):
    a, b = data(dtype, (m, k), 1), data(dtype, (k, n), 2)
    c = runtime.empty((m, n), dtype)
    run(stream, kernels.matmul, c, runtime.to_device(a), runtime.to_device(b))
    got = c.copy_to_host()
    if np.dtype(dtype).kind == "f":
        want = a.astype(np.float64) @ b.astype(np.float64)
        tol = 1e-4 if dtype == "float32" else 1e-10
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.sqrt(k))
    else:
        np.testing.assert_array_equal(got, a @ b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_overwrites_output(stream, dtype):
    a, b = data(dtype, (4, 3), 1), data(dtype, (3, 2), 2)
    c = runtime.to_device(np.full((4, 2), 99, dtype))
    run(stream, kernels.matmul, c, runtime.to_device(a), runtime.to_device(b))
    check(c.copy_to_host(), a @ b)


def test_matmul_same_input_twice(stream):
    a = data("float64", (16, 16))
    da = runtime.to_device(a)
    c = runtime.empty((16, 16), "float64")
    run(stream, kernels.matmul, c, da, da)
    check(c.copy_to_host(), a @ a)


def test_matmul_chain_in_stream_order(stream):
    a = data("float64", (8, 8)) / 4
    x = runtime.to_device(np.eye(8))
    y = runtime.empty((8, 8), "float64")
    da = runtime.to_device(a)
    want = np.eye(8)
    for _ in range(5):
        stream.launch_kernel(kernels.matmul, (y, x, da))
        stream.launch_kernel(kernels.copy, (x, y))
        want = want @ a
    stream.synchronize(timeout=WAIT)
    check(x.copy_to_host(), want)


# --- in place ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_in_place_forms(stream, dtype):
    a, b = data(dtype, 64, 1), data(dtype, 64, 2)
    x, y = runtime.to_device(a), runtime.to_device(b)
    run(stream, kernels.add, x, x, y)  # x = x + y
    want = a + b
    check(x.copy_to_host(), want)
    run(stream, kernels.add, y, x, y)  # y = x + y (out is b)
    want_y = want + b
    check(y.copy_to_host(), want_y)
    run(stream, kernels.mul, x, x, x)  # x = x * x
    want = want * want
    check(x.copy_to_host(), want)
    run(stream, kernels.scale, x, x, 2)  # x = 2 x
    want = (2 * want).astype(dtype)
    check(x.copy_to_host(), want)
    run(stream, kernels.axpy, y, y, 3)  # y = 3 y + y
    check(y.copy_to_host(), (4 * want_y).astype(dtype))
    run(stream, kernels.copy, x, x)  # a no-op copy onto itself
    check(x.copy_to_host(), want)


def test_in_place_on_views_of_one_buffer(stream):
    raw = runtime.device_malloc(0, 64)
    lo = raw.view("float32", shape=(8,), offset=0)
    hi = raw.view("float32", shape=(8,), offset=32)
    run(stream, kernels.fill, lo, 1.5)
    run(stream, kernels.fill, hi, 2.0)
    run(stream, kernels.add, lo, lo, hi)  # disjoint views of one allocation are fine
    got = np.empty(16, np.float32)
    runtime.memcpy_device_to_host(got, raw)
    np.testing.assert_array_equal(got, [3.5] * 8 + [2.0] * 8)


# --- launch forms -----------------------------------------------------------------------------


def test_launch_by_name(stream):
    a, b = data("float32", 10, 1), data("float32", 10, 2)
    out = runtime.empty(10, "float32")
    stream.launch_kernel("add", (out, runtime.to_device(a), runtime.to_device(b)))
    stream.synchronize(timeout=WAIT)
    check(out.copy_to_host(), a + b)


def test_launch_via_kernel_object(stream):
    x = runtime.empty(6, "float64")
    stream.launch_kernel(runtime.kernels.fill, (x, 2.0))
    stream.synchronize(timeout=WAIT)
    check(x.copy_to_host(), np.full(6, 2.0))
    stream.launch_kernel(runtime.kernels.get("scale"), [x, x, 4])
    stream.synchronize(timeout=WAIT)
    check(x.copy_to_host(), np.full(6, 8.0))


def test_call_form_with_stream(stream):
    x = runtime.empty(6, "int32")
    runtime.kernels.fill(x, 7, stream=stream)
    stream.synchronize(timeout=WAIT)
    check(x.copy_to_host(), np.full(6, 7, np.int32))


def test_call_form_on_current_stream():
    x = runtime.empty(6, "int64")
    y = runtime.empty(6, "int64")
    runtime.kernels.fill(x, 5)  # the default stream
    runtime.kernels.scale(y, x, 3)
    check(y.copy_to_host(), np.full(6, 15))  # copy_to_host orders on the same stream
    s = runtime.Stream(0)
    with s:
        runtime.kernels.add(y, y, x)
    s.synchronize(timeout=WAIT)
    check(y.copy_to_host(), np.full(6, 20))
    s.destroy()


def test_kernels_on_other_device():
    s = runtime.Stream(2)
    x = runtime.empty(4, "float32", device=2)
    runtime.kernels.fill(x, 1.25, stream=s)
    s.synchronize(timeout=WAIT)
    check(x.copy_to_host(), np.full(4, 1.25, np.float32))
    s.destroy()


def test_python_kernel_sees_native_results_in_order(stream):
    x = runtime.empty(4, "float64")
    seen = []
    stream.launch_kernel(kernels.fill, (x, 1.0))
    stream.launch_kernel(lambda v: seen.append(v.copy()), (x,))
    stream.launch_kernel(kernels.scale, (x, x, 3.0))
    stream.launch_kernel(lambda v: seen.append(v.copy()), (x,))
    stream.synchronize(timeout=WAIT)
    check(seen[0], np.ones(4))
    check(seen[1], np.full(4, 3.0))


# --- bad launches: raise at launch, write nothing ---------------------------------------------


def sentinel(dtype, shape, value=42):
    return runtime.to_device(np.full(shape, value, dtype))


def assert_untouched(buf, value=42):
    got = buf.copy_to_host()
    assert (got == value).all(), got


F32 = "float32"

# case -> (output dtype, output shape, kernel, args after the output)
BAD_LAUNCHES = {
    "add size mismatch": (F32, 4, "add", lambda: (runtime.empty(4, F32), runtime.empty(5, F32))),
    "add dtype mismatch": (
        F32,
        4,
        "add",
        lambda: (runtime.empty(4, F32), runtime.empty(4, "float64")),
    ),
    "scale dtype mismatch": ("int32", 4, "scale", lambda: (runtime.empty(4, "int64"), 2)),
    "copy byte mismatch": (F32, 4, "copy", lambda: (runtime.empty(5, F32),)),
    "fill int with fraction": ("int64", 4, "fill", lambda: (2.5,)),
    "fill too few args": (F32, 4, "fill", lambda: ()),
    "fill too many args": (F32, 4, "fill", lambda: (1, 2)),
    "add too few args": (F32, 4, "add", lambda: (runtime.empty(4, F32),)),
    "add too many args": (F32, 4, "add", lambda: (runtime.empty(4, F32),) * 3),
    "noop with args": (F32, 4, "noop", lambda: ()),
    "scalar where tensor": (F32, 4, "add", lambda: (1.0, runtime.empty(4, F32))),
    "tensor where scalar": (F32, 4, "fill", lambda: (runtime.empty(4, F32),)),
    "uint8 fill out of range": ("uint8", 4, "fill", lambda: (256,)),
    "int8 fill out of range": ("int8", 4, "fill", lambda: (-129,)),
    "sum out too big": (F32, 2, "sum", lambda: (runtime.empty(8, F32),)),
    "sum dtype mismatch": (F32, 1, "sum", lambda: (runtime.empty(8, "int32"),)),
    "matmul inner mismatch": (
        F32,
        (2, 2),
        "matmul",
        lambda: (runtime.empty((2, 3), F32), runtime.empty((4, 2), F32)),
    ),
    "matmul wrong out shape": (
        F32,
        (2, 3),
        "matmul",
        lambda: (runtime.empty((2, 3), F32), runtime.empty((3, 2), F32)),
    ),
    "matmul not 2-D": (F32, 4, "matmul", lambda: (runtime.empty(4, F32), runtime.empty(4, F32))),
    "matmul dtype mismatch": (
        F32,
        (2, 2),
        "matmul",
        lambda: (runtime.empty((2, 2), "float64"), runtime.empty((2, 2), F32)),
    ),
    "tensor on another device": (
        F32,
        4,
        "add",
        lambda: (runtime.empty(4, F32, device=1), runtime.empty(4, F32)),
    ),
}


@pytest.mark.parametrize("case", list(BAD_LAUNCHES))
def test_bad_launch_raises_value_error_and_writes_nothing(stream, case):
    dtype, shape, name, rest = BAD_LAUNCHES[case]
    out = sentinel(dtype, shape)
    kernel = kernels.get(name)
    args = (out, *rest()) if name != "noop" else (out,)
    with pytest.raises(ValueError):
        stream.launch_kernel(kernel, args)
    with pytest.raises(ValueError):
        kernel(*args, stream=stream)
    stream.synchronize(timeout=WAIT)
    assert_untouched(out)


def test_bad_launch_message_names_argument(stream):
    out = runtime.empty(4, "float32")
    with pytest.raises(ValueError, match=r"^b: add: 3 elements"):
        stream.launch_kernel(kernels.add, (out, runtime.empty(4, "float32"), runtime.empty(3)))
    with pytest.raises(ValueError, match=r"^a: add: .*device buffer"):
        stream.launch_kernel(kernels.add, (out, 1.0, out))
    with pytest.raises(ValueError, match="takes 2 arguments"):
        stream.launch_kernel(kernels.fill, (out,))


def test_partial_overlap_refused(stream):
    raw = runtime.device_malloc(0, 64)
    runtime.memset(raw, 7)
    a = raw.view("float32", shape=(8,), offset=0)
    out = raw.view("float32", shape=(8,), offset=4)  # shares 28 of a's 32 bytes
    b = runtime.empty(8, "float32")
    for kernel, args in [
        (kernels.add, (out, a, b)),
        (kernels.add, (out, b, a)),
        (kernels.scale, (out, a, 2.0)),
        (kernels.axpy, (out, a, 2.0)),
        (kernels.copy, (out, a)),
    ]:
        with pytest.raises(ValueError, match="overlap"):
            stream.launch_kernel(kernel, args)
    m = raw.view("float32", shape=(2, 2), offset=0)
    c = raw.view("float32", shape=(2, 2), offset=8)
    with pytest.raises(ValueError, match="overlap"):
        stream.launch_kernel(kernels.matmul, (c, m, runtime.empty((2, 2), "float32")))
    with pytest.raises(ValueError, match="overlap"):
        stream.launch_kernel(kernels.matmul, (m, m, runtime.empty((2, 2), "float32")))
    with pytest.raises(ValueError, match="overlap"):
        stream.launch_kernel(kernels.sum, (raw.view("float32", shape=(1,)), a))
    stream.synchronize(timeout=WAIT)
    got = np.empty(64, np.uint8)
    runtime.memcpy_device_to_host(got, raw)
    assert (got == 7).all()


@pytest.mark.parametrize("bad", ["2", None, object(), [1.0], b"x"])
def test_non_number_scalar_raises_type_error(stream, bad):
    x = sentinel("float32", 4)
    with pytest.raises(TypeError, match=r"args\[1\]"):
        stream.launch_kernel(kernels.fill, (x, bad))
    with pytest.raises(TypeError):
        kernels.fill(x, bad, stream=stream)
    stream.synchronize(timeout=WAIT)
    assert_untouched(x)


def test_host_array_arg_raises_type_error(stream):
    x = sentinel("float32", 4)
    with pytest.raises(TypeError):
        stream.launch_kernel(kernels.copy, (x, np.zeros(4, np.float32)))
    stream.synchronize(timeout=WAIT)
    assert_untouched(x)


def test_integer_out_of_range_raises(stream):
    x = sentinel("int64", 4)
    with pytest.raises(ValueError, match="64-bit"):
        stream.launch_kernel(kernels.fill, (x, 2**64))
    stream.synchronize(timeout=WAIT)
    assert_untouched(x)


def test_freed_buffer_arg_raises(stream):
    x = runtime.empty(4, "float32")
    runtime.device_free(x)
    with pytest.raises(runtime.InvalidHandleError):
        stream.launch_kernel(kernels.fill, (x, 1.0))


def test_bool_scalar_is_an_int(stream):
    x = runtime.empty(3, "int32")
    run(stream, kernels.fill, x, True)
    check(x.copy_to_host(), np.ones(3, np.int32))
