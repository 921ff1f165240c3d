"""Strided device buffers: F-ordered buffers and strided views (shape + byte strides, numpy's
contiguity flags), copies between layouts, and the refusals of what reads a buffer in one
order only. The rules are the core's `memory::layout`; see docs/semantics.md, "Layouts".

Translated upstream tests cite their source; where runtime does a copy that numba refuses
(numba's `copy_to_device` takes only compatible strides), the translation checks numpy's
values instead of numba's error, and says so.
"""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import runtime
from runtime import comm, kernels


@pytest.fixture(scope="module", autouse=True)
def _runtime():
    runtime.init(device_count=2, memory="256MiB")
    yield
    runtime.shutdown()


# -------------------------------------------------------------------- flags and strides


# numba: numba/cuda/tests/cudadrv/test_array_attr.py::TestArrayAttr::test_contigous_2d,
# test_contigous_3d and test_contigous_4d
@pytest.mark.parametrize("shape", [(2, 5), (2, 5, 2), (2, 5, 2, 3)])
def test_contiguity_of_c_and_f_arrays(shape):
    cary = np.arange(int(np.prod(shape))).reshape(shape)
    fary = np.asfortranarray(cary)
    dcary = runtime.to_device(cary)
    dfary = runtime.to_device(fary)
    assert dcary.is_c_contiguous()
    assert not dfary.is_c_contiguous()
    assert not dcary.is_f_contiguous()
    assert dfary.is_f_contiguous()
    assert dcary.strides == cary.strides
    assert dfary.strides == fary.strides
    assert dfary.flags == {"C_CONTIGUOUS": False, "F_CONTIGUOUS": True}
    np.testing.assert_array_equal(dfary.copy_to_host(), fary)


# numba: numba/cuda/tests/cudadrv/test_cuda_ndarray.py::TestCudaNDArray::
# test_c_f_contiguity_matches_numpy
@pytest.mark.parametrize(("shape", "order"), list(itertools.product([(1, 4), (4, 1)], "CF")))
def test_flags_match_numpy(shape, order):
    arr = np.ndarray(shape, order=order)
    d = runtime.to_device(arr)
    assert d.flags["C_CONTIGUOUS"] == arr.flags["C_CONTIGUOUS"]
    assert d.flags["F_CONTIGUOUS"] == arr.flags["F_CONTIGUOUS"]


def test_flags_of_empty_and_0d_buffers_are_both():
    for shape in [(), (0,), (3, 0, 2)]:
        d = runtime.empty(shape, "int32", order="F")
        assert d.flags == {"C_CONTIGUOUS": True, "F_CONTIGUOUS": True}, shape


def test_flags_is_a_new_dict_each_time():
    d = runtime.empty((2, 3), "float32")
    d.flags["C_CONTIGUOUS"] = False
    assert d.flags["C_CONTIGUOUS"]


# numba: numba/cuda/tests/cudadrv/test_cuda_ndarray.py::TestCoreContiguous::
# test_device_array_like_2d_f, test_device_array_like_3d_f, test_device_array_like_2d_transpose
@pytest.mark.parametrize("shape", [10, (10, 12), (10, 12, 14)])
def test_empty_in_f_order(shape):
    d = runtime.empty(shape, "float64", order="F")
    ref = np.empty(shape, "float64", order="F")
    assert d.strides == ref.strides
    assert d.flags["F_CONTIGUOUS"]
    assert d.T.flags["C_CONTIGUOUS"]
    assert d.T.strides == ref.T.strides
    with pytest.raises(ValueError, match="order: must be 'C' or 'F'"):
        runtime.empty(shape, order="K")


# ----------------------------------------------------------------- to_device / copy_to_host


def test_f_array_round_trips_with_numpys_strides():
    fary = np.asfortranarray(np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    d = runtime.to_device(fary)
    assert d.nbytes == fary.nbytes and d.size == fary.size and d.shape == fary.shape
    host = d.copy_to_host()
    assert host.strides == fary.strides
    assert host.flags["F_CONTIGUOUS"]
    np.testing.assert_array_equal(host, fary)
    # The device holds numpy's F bytes (what a byte copy or DLPack consumer sees).
    raw = np.empty(fary.nbytes, np.uint8)
    runtime.memcpy_device_to_host(raw, d)
    assert raw.tobytes() == fary.tobytes(order="F")


def test_non_contiguous_host_arrays_are_compacted_to_c():
    # numba refuses these (sentry_contiguous); runtime copies them C-contiguous, as before.
    base = np.arange(40, dtype=np.int16).reshape(5, 8)
    view = base[::2, 1::3]
    d = runtime.to_device(view)
    assert d.flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(d.copy_to_host(), view)


# numba: numba/cuda/tests/cudadrv/test_cuda_ndarray.py::TestCudaNDArray::
# _test_devicearray_contiguous_host_copy (test_devicearray_contiguous_copy_host_3d / _1d)
@pytest.mark.parametrize("shape", [(5, 5, 5), (5,)])
def test_host_copies_between_c_and_f(shape):
    a_c = np.arange(int(np.prod(shape))).reshape(shape)
    a_f = np.array(a_c, order="F")
    for original, copy in [(a_f, a_f), (a_f, a_c), (a_c, a_f), (a_c, a_c)]:
        d = runtime.to_device(original)
        d.copy_to_device(np.zeros_like(copy))
        d.copy_to_device(copy)
        np.testing.assert_array_equal(d.copy_to_host(), a_c)
        np.testing.assert_array_equal(d.copy_to_host(), a_f)
        assert d.strides == original.strides


def test_copy_to_host_out_in_another_layout_gets_numpys_values():
    a = np.arange(12, dtype=np.int64).reshape(3, 4)
    for src, out_order in [(np.asfortranarray(a), "C"), (a, "F"), (np.asfortranarray(a), "F")]:
        d = runtime.to_device(src)
        out = np.zeros((3, 4), np.int64, order=out_order)
        assert d.copy_to_host(out) is out
        np.testing.assert_array_equal(out, a)
    d = runtime.to_device(np.asfortranarray(a))
    with pytest.raises(ValueError, match="shape"):
        d.copy_to_host(np.zeros((4, 3), np.int64))
    with pytest.raises(ValueError, match="C-contiguous or F-contiguous"):
        d.copy_to_host(np.zeros((3, 8), np.int64)[:, ::2])


def test_copy_to_device_checks_dtype_and_shape():
    d = runtime.empty((2, 3), "float64", order="F")
    with pytest.raises(TypeError, match="ary: dtype"):
        d.copy_to_device(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="ary: shape"):
        d.copy_to_device(np.zeros((3, 2)))
    # Axes of length 1 aside, as numba compares squeezed shapes.
    d1 = runtime.empty((1, 3), "float64")
    d1.copy_to_device(np.arange(3.0))
    np.testing.assert_array_equal(d1.copy_to_host(), [[0.0, 1.0, 2.0]])


# ------------------------------------------------------------------------- strided views


# numba: numba/cuda/tests/cudadrv/test_cuda_ndarray.py::TestCudaNDArray::
# test_devicearray_transpose_ok, test_devicearray_transpose_T and
# test_devicearray_transpose_identity
def test_transpose_views_share_memory():
    original = np.arange(12).reshape(3, 4)
    d = runtime.to_device(original)
    np.testing.assert_array_equal(np.transpose(d).copy_to_host(), original.T)
    np.testing.assert_array_equal(d.T.copy_to_host(), original.T)
    assert d.T.flags["F_CONTIGUOUS"] and d.T.ptr == d.ptr
    o3 = np.arange(24).reshape(3, 4, 2)
    d3 = runtime.to_device(o3)
    np.testing.assert_array_equal(np.transpose(d3, axes=(0, 1, 2)).copy_to_host(), o3)
    np.testing.assert_array_equal(d3.transpose((2, 0, 1)).copy_to_host(), o3.transpose(2, 0, 1))
    # numba: test_devicearray_transpose_duplicatedaxis / _wrongaxis
    for axes in [(0, 0), (0, 2)]:
        with pytest.raises(ValueError, match="axes"):
            d.transpose(axes)
    # Writes through the transpose land in the original's memory.
    d.T.copy_to_device(np.zeros((4, 3), np.int64) + 7)
    assert (d.copy_to_host() == 7).all()


# numba: numba/cuda/tests/cudadrv/test_cuda_ndarray.py::TestCudaNDArray::
# test_devicearray_view_ok_not_c_contig and test_devicearray_view_bad_not_c_contig
def test_view_of_a_strided_view():
    original = np.arange(32, dtype="i2").reshape(4, 8)
    array = runtime.to_device(original)[:, ::2]
    np.testing.assert_array_equal(array.view("u2").copy_to_host(), original[:, ::2].view("u2"))
    with pytest.raises(ValueError, match="C-contiguous"):
        array.view("i4")
    with pytest.raises(ValueError, match="not one range of bytes"):
        array.view("u1", shape=4)


def test_step_slices_read_and_write_numpys_elements():
    base = np.arange(30, dtype=np.float32).reshape(5, 6)
    d = runtime.to_device(base)
    v = d[1:5:2, ::3]
    assert v.shape == (2, 2) and v.strides == base[1:5:2, ::3].strides
    assert not v.flags["C_CONTIGUOUS"] and not v.flags["F_CONTIGUOUS"]
    got = v.copy_to_host()
    assert got.strides == v.strides  # numba's copy_to_host keeps the strides
    np.testing.assert_array_equal(got, base[1:5:2, ::3])
    np.testing.assert_array_equal(np.asarray(v), base[1:5:2, ::3])
    v.copy_to_device(np.full((2, 2), -1, np.float32))
    want = base.copy()
    want[1:5:2, ::3] = -1
    np.testing.assert_array_equal(d.copy_to_host(), want)  # the gaps kept their values


# numba: numba/cuda/tests/cudadrv/test_cuda_ndarray.py::TestCudaNDArray::
# test_devicearray_contiguous_slice and test_devicearray_contiguous_host_strided. numba
# refuses the first (a strided destination); runtime copies the elements, so the check is
# the values numba's comment says the copy would give.
def test_copies_into_a_strided_row_of_an_f_buffer():
    a = np.arange(25).reshape(5, 5, order="F")
    s = np.full(fill_value=5, shape=(5,))
    d = runtime.to_device(a)
    a[2] = s
    d[2:3].copy_to_device(s.reshape(1, 5))
    np.testing.assert_array_equal(d.copy_to_host(), a)
    d10 = runtime.to_device(np.arange(10))
    arr = np.arange(20)[::2]
    d10.copy_to_device(arr)
    np.testing.assert_array_equal(d10.copy_to_host(), arr)


# numba: numba/cuda/tests/cudadrv/test_cuda_ndarray.py::TestCudaNDArray::
# test_devicearray_contiguous_copy_device and test_devicearray_contiguous_device_strided.
# numba refuses device copies between different strides; runtime copies the elements
# (numpy's copyto), in the core's stream op.
def test_device_copies_between_layouts():
    a_c = np.arange(125).reshape(5, 5, 5)
    a_f = np.array(a_c, order="F")
    for dst, src in itertools.product([a_c, a_f], repeat=2):
        d = runtime.to_device(np.zeros_like(dst))
        d.copy_to_device(runtime.to_device(src))
        np.testing.assert_array_equal(d.copy_to_host(), a_c)
        assert d.strides == dst.strides
    d = runtime.to_device(np.arange(10))
    d.copy_to_device(runtime.to_device(np.arange(20))[::2])
    np.testing.assert_array_equal(d.copy_to_host(), np.arange(20)[::2])
    # Across devices, on a stream.
    other = runtime.to_device(np.zeros((5, 5, 5), np.int64), device=1)
    s = runtime.Stream(0)
    other.copy_to_device(runtime.to_device(a_f), stream=s)
    s.synchronize()
    np.testing.assert_array_equal(other.copy_to_host(), a_c)
    with pytest.raises(ValueError, match="shape"):
        d.copy_to_device(runtime.to_device(np.arange(9)))
    with pytest.raises(TypeError, match="dtype"):
        d.copy_to_device(runtime.to_device(np.arange(10.0)))


def test_overlapping_device_copy_reads_the_source_first():
    # Within one allocation, dst = src transposed: the source is read whole first.
    a = np.arange(16, dtype=np.int32).reshape(4, 4)
    d = runtime.to_device(a)
    d.copy_to_device(d.T)
    np.testing.assert_array_equal(d.copy_to_host(), a.T)


layouts = st.tuples(
    st.lists(st.integers(1, 5), min_size=1, max_size=3),
    st.booleans(),
    st.data(),
)


# Property: for any C or F buffer and any positive-step slices, the view's values, strides and
# flags are numpy's, and writing through it changes what numpy's view would change.
@settings(max_examples=60, deadline=None)
@given(layouts)
def test_views_match_numpy(case):
    shape, fortran, data = case
    ref = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
    if fortran:
        ref = np.asfortranarray(ref)
    d = runtime.to_device(ref)
    key = tuple(
        slice(
            data.draw(st.integers(-n - 1, n + 1)),
            data.draw(st.integers(-n - 1, n + 1)),
            data.draw(st.integers(1, 3)),
        )
        for n in shape[: data.draw(st.integers(1, len(shape)))]
    )
    view, want = d[key], ref[key]
    assert view.shape == want.shape
    if want.size > 1:
        assert view.strides == want.strides
    assert view.flags["C_CONTIGUOUS"] == want.flags["C_CONTIGUOUS"]
    assert view.flags["F_CONTIGUOUS"] == want.flags["F_CONTIGUOUS"]
    np.testing.assert_array_equal(view.copy_to_host(), want)
    fill = -np.arange(want.size, dtype=np.int32).reshape(want.shape) - 1
    view.copy_to_device(fill)
    expect = ref.copy(order="K")
    expect[key] = fill
    np.testing.assert_array_equal(d.copy_to_host(), expect)


# ------------------------------------------------------------------------------ refusals


def test_byte_operations_refuse_strided_views():
    d = runtime.to_device(np.arange(10.0))
    v = d[::2]
    host = np.empty(5)
    with pytest.raises(ValueError, match="src: a strided DeviceBuffer view"):
        runtime.memcpy_device_to_host(host, v)
    with pytest.raises(ValueError, match="dst: a strided DeviceBuffer view"):
        runtime.memcpy_host_to_device(v, host)
    with pytest.raises(ValueError, match="buf: a strided DeviceBuffer view"):
        runtime.memset(v, 0)
    with pytest.raises(ValueError, match="not one range of bytes"):
        v + 8
    np.testing.assert_array_equal(d.copy_to_host(), np.arange(10.0))  # nothing changed
    # A dense F buffer is one range of bytes: byte copies take it.
    f = runtime.to_device(np.asfortranarray(np.ones((2, 3))))
    runtime.memset(f, 0)
    assert (f.copy_to_host() == 0).all()


def test_kernels_and_collectives_refuse_non_c_buffers():
    s = runtime.Stream(0)
    f = runtime.empty((3, 4), "int64", order="F")
    with pytest.raises(ValueError, match=r"args\[0\]: native kernels take C-contiguous"):
        s.launch_kernel(kernels.fill, (f, 1))
    with pytest.raises(ValueError, match=r"args\[0\]: native kernels take C-contiguous"):
        s.launch_kernel(kernels.fill, (runtime.empty(8, "int64")[::2], 1))
    assert (f.copy_to_host() == 0).all()
    (c,) = comm.init_all([0])
    with pytest.raises(ValueError, match="collectives take C-contiguous"):
        c.all_reduce(f, f)
    with pytest.raises(ValueError, match="pickling"):
        f.__reduce__()


def test_buffer_protocol_requests_are_checked():
    f = runtime.to_device(np.asfortranarray(np.arange(6.0).reshape(2, 3)))
    m = memoryview(f)  # a strided request: numpy's view with the F strides
    assert m.strides == (8, 16) and m.f_contiguous
    np.testing.assert_array_equal(np.asarray(f), np.arange(6.0).reshape(2, 3))
    with pytest.raises(BufferError, match="C-contiguous"):
        np.frombuffer(f, np.float64)  # a simple request reads C order
    v = runtime.to_device(np.arange(6.0))[::2]
    np.testing.assert_array_equal(np.asarray(v), [0.0, 2.0, 4.0])


# ------------------------------------------------------------------------------- DLPack


def test_dlpack_exports_the_strides():
    fary = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    d = runtime.to_device(fary)
    x = np.from_dlpack(d)
    assert x.strides == fary.strides
    np.testing.assert_array_equal(x, fary)
    v = runtime.to_device(np.arange(10, dtype=np.int64))[1::3]
    np.testing.assert_array_equal(np.from_dlpack(v), np.arange(10)[1::3])


def test_torch_from_dlpack_of_an_f_buffer():
    torch = pytest.importorskip("torch")
    fary = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    t = torch.from_dlpack(runtime.to_device(fary))
    assert t.stride() == (1, 3)
    assert t.tolist() == fary.tolist()


# numba: numba/cuda/tests/cudadrv/test_cuda_ndarray.py::TestCudaNDArray::
# test_devicearray_relaxed_strides (a (1, 10) array with a first stride of 800 is both C- and
# F-contiguous) and test_issue_8477 (a zero-length view of any strides copies both ways).
def test_views_with_explicit_strides():
    d = runtime.empty(200, "float64")
    arr = d.view("float64", (1, 10), strides=(800, 8))
    assert arr.flags == {"C_CONTIGUOUS": True, "F_CONTIGUOUS": True}
    empty = d.view("int8", (0,), strides=(8,))
    host = np.ndarray(shape=(0,), strides=(0,), dtype=np.int8)
    empty.copy_to_host(host)
    empty.copy_to_device(host)
    # A column of a 4x5 C matrix, as numpy's own strided view of the same bytes.
    m = runtime.to_device(np.arange(20, dtype=np.int32).reshape(4, 5))
    col = m.view("int32", (4,), offset=8, strides=(20,))
    np.testing.assert_array_equal(col.copy_to_host(), np.arange(20).reshape(4, 5)[:, 2])
    with pytest.raises(ValueError, match="past the end"):
        m.view("int32", (5,), offset=8, strides=(20,))
    with pytest.raises(ValueError, match="multiple of the int32 item size"):
        m.view("int32", (4,), strides=(6,))
    with pytest.raises(ValueError, match="strides"):
        m.view("int32", (4,), strides=(-4,))
    with pytest.raises(TypeError, match="needs its shape"):
        m.view("int32", strides=(4,))


# ---------------------------------------------------------------- found in review


def test_a_view_whose_elements_overflow_is_refused_not_exported():
    # Zero strides reach one byte whatever the shape; the element count wrapped, nbytes came
    # out small, and bytes(view) wrote every element into a buffer of that size (a crash).
    b = runtime.to_device(np.arange(4, dtype=np.uint8))
    with pytest.raises(ValueError, match="shape"):
        b.view("uint8", shape=(2**40 + 1, 2**24), strides=(0, 0))
    v = b.view("uint8", shape=(3, 4), strides=(0, 1))  # the same 4 bytes, 3 times
    assert v.nbytes == 12
    np.testing.assert_array_equal(
        np.frombuffer(bytes(memoryview(v)), np.uint8), np.tile(np.arange(4, dtype=np.uint8), 3)
    )


def test_copies_into_interleaved_strided_views_on_one_stream_keep_each_other():
    # Each copy used to read the view's whole reach to the host and write it all back, gaps
    # included: the second copy wrote the first one's elements back to their old values.
    buf = runtime.zeros(8, "int32")
    even, odd = buf[::2], buf[1::2]
    s = runtime.Stream()
    release = threading.Event()
    s.launch_host_func(lambda: release.wait(30))  # both copies queue behind this
    odd.copy_to_device(np.array([1, 3, 5, 7], np.int32), stream=s)
    even.copy_to_device(np.array([10, 30, 50, 70], np.int32), stream=s)
    release.set()
    s.synchronize()
    np.testing.assert_array_equal(buf.copy_to_host(), [10, 1, 30, 3, 50, 5, 70, 7])


def test_copy_into_a_strided_view_leaves_its_gaps_alone():
    buf = runtime.to_device(np.full((4, 6), -1, np.int64))
    view = buf[::2, 1::2]
    view.copy_to_device(np.arange(6, dtype=np.int64).reshape(2, 3))
    want = np.full((4, 6), -1, np.int64)
    want[::2, 1::2] = np.arange(6).reshape(2, 3)
    np.testing.assert_array_equal(buf.copy_to_host(), want)


@pytest.mark.parametrize("axes", [(-1, 0), (1, -2), (-1, -2)])
def test_transpose_takes_numpys_negative_axes(axes):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = runtime.to_device(a).transpose(axes)
    assert t.shape == a.transpose(axes).shape
    np.testing.assert_array_equal(t.copy_to_host(), a.transpose(axes))
    with pytest.raises(ValueError, match="axes"):
        runtime.to_device(a).transpose((0, 2))


def test_a_dlpack_producers_refusal_names_the_argument():
    class Refuses:
        def __dlpack_device__(self):
            return (1, 0)

        def __dlpack__(self, **kw):
            raise BufferError("cannot export this one")

    with pytest.raises(BufferError, match=r"^array: cannot export this one"):
        runtime.to_device(Refuses())
