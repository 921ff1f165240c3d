"""memcpy_2d: pitched copies in every direction, checked against numpy slicing as the model
(a rectangle of `height` rows of `width` bytes, rows `pitch` bytes apart)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import runtime

WAIT = 10.0


@pytest.fixture(scope="module", autouse=True)
def rt():
    runtime.shutdown()
    runtime.init(device_count=2, memory="256MiB")
    yield
    runtime.shutdown()


def model(dst: np.ndarray, dst_off, dpitch, src: np.ndarray, src_off, spitch, width, height):
    """The expected result: numpy copies of each row."""
    out = dst.copy()
    for i in range(height):
        d, s = dst_off + i * dpitch, src_off + i * spitch
        out[d : d + width] = src[s : s + width]
    return out


def pattern(n, seed=1):
    return ((np.arange(n, dtype=np.uint64) * 13 + seed) % 251 + 1).astype(np.uint8)


KINDS = ["h2d", "d2h", "d2d", "h2h"]


def run_copy(kind, dst_bytes, src_bytes, rect, stream=None):
    """Copy with memcpy_2d between ends of `kind`, return the destination's bytes."""
    dst_off, dpitch, src_off, spitch, width, height = rect
    dst_dev = kind in ("h2d", "d2d")
    src_dev = kind in ("d2h", "d2d")
    dst = runtime.to_device(dst_bytes) if dst_dev else dst_bytes.copy()
    src = runtime.to_device(src_bytes) if src_dev else src_bytes.copy()
    runtime.memcpy_2d(
        dst, dpitch, src, spitch, width, height, stream, dst_offset=dst_off, src_offset=src_off
    )
    if stream is not None:
        stream.synchronize(timeout=WAIT)
    return dst.copy_to_host() if dst_dev else dst


@pytest.mark.parametrize("kind", KINDS)
def test_copies_a_rectangle(kind):
    dst, src = np.zeros(100, np.uint8), pattern(120)
    rect = (3, 10, 5, 12, 7, 6)
    assert (run_copy(kind, dst, src, rect) == model(dst, *rect[:2], src, *rect[2:])).all()


@pytest.mark.parametrize("kind", KINDS)
def test_queued_on_a_stream(kind):
    s = runtime.Stream(0)
    dst, src = np.zeros(64, np.uint8), pattern(64)
    rect = (0, 16, 0, 8, 8, 4)
    assert (run_copy(kind, dst, src, rect, s) == model(dst, *rect[:2], src, *rect[2:])).all()


def test_pageable_source_on_an_idle_stream_is_copied_at_once():
    """As a 1-D copy (``test_pinned.py``): on an idle stream a queued 2-D copy from pageable
    memory runs at once, reading the source where it is (no staging copy): nothing is pending
    when the call returns, the trace shows the copy run by the caller, and reusing the source
    changes nothing."""
    s = runtime.Stream(0)
    src = pattern(128)
    want = model(np.zeros(64, np.uint8), 0, 8, src, 0, 16, 8, 8)
    dev = runtime.zeros(64, np.uint8)
    s.synchronize(timeout=WAIT)
    with runtime.profile() as records:
        runtime.memcpy_2d(dev, 8, src, 16, 8, 8, s)
        assert s.query()
    src[:] = 0
    s.synchronize(timeout=WAIT)
    assert (dev.copy_to_host() == want).all()
    (run,) = [r for r in records if r["phase"] == "run" and r["name"] == "memcpy_2d_h2d"]
    assert run["engine"] == "caller"


@given(
    data=st.data(),
    kind=st.sampled_from(KINDS),
    width=st.integers(0, 24),
    height=st.integers(0, 8),
)
def test_matches_numpy_model(data, kind, width, height):
    dpitch = data.draw(st.integers(width, width + 16), label="dpitch")
    spitch = data.draw(st.integers(width, width + 16), label="spitch")
    dst_off = data.draw(st.integers(0, 20), label="dst_off")
    src_off = data.draw(st.integers(0, 20), label="src_off")
    span = lambda p: 0 if width == 0 or height == 0 else (height - 1) * p + width  # noqa: E731
    # ends sized to fit, sometimes one byte short (then the copy must fail and change nothing)
    short = data.draw(st.sampled_from([None, "dst", "src"]), label="short")
    dlen = dst_off + span(dpitch) + data.draw(st.integers(0, 8))
    slen = src_off + span(spitch) + data.draw(st.integers(0, 8))
    if short == "dst" and span(dpitch):
        dlen = dst_off + span(dpitch) - 1
    if short == "src" and span(spitch):
        slen = src_off + span(spitch) - 1
    dst, src = np.zeros(dlen, np.uint8), pattern(slen)
    rect = (dst_off, dpitch, src_off, spitch, width, height)
    fails = (short == "dst" and span(dpitch)) or (short == "src" and span(spitch))
    if fails:
        with pytest.raises(ValueError, match=short):
            run_copy(kind, dst, src, rect)
    else:
        assert (run_copy(kind, dst, src, rect) == model(dst, *rect[:2], src, *rect[2:])).all()


@pytest.mark.parametrize("pitch", ["dpitch", "spitch"])
def test_width_above_a_pitch_is_an_error_naming_the_numbers(pitch):
    d, s = runtime.empty(256, np.uint8), np.zeros(256, np.uint8)
    dp, sp = (4, 16) if pitch == "dpitch" else (16, 4)
    with pytest.raises(
        ValueError, match=rf"width: 8 bytes per row is more than {pitch} \(4 bytes\)"
    ):
        runtime.memcpy_2d(d, dp, s, sp, 8, 2)


def test_out_of_bounds_names_the_numbers_and_copies_nothing():
    d = runtime.to_device(np.full(40, 9, np.uint8))
    s = np.ones(100, np.uint8)
    with pytest.raises(
        ValueError,
        match=r"dst: 4 rows of 8 bytes, 12 bytes apart, from offset 5 end at byte 49, outside the 40-byte device buffer",
    ):
        runtime.memcpy_2d(d, 12, s, 8, 8, 4, dst_offset=5)
    assert (d.copy_to_host() == 9).all()
    with pytest.raises(ValueError, match=r"src: .* outside the 100-byte host buffer"):
        runtime.memcpy_2d(d, 8, s, 40, 8, 4)


def test_overflowing_rectangle_is_refused():
    d, s = runtime.empty(16, np.uint8), np.zeros(16, np.uint8)
    with pytest.raises(ValueError, match="past 2"):
        runtime.memcpy_2d(d, 2**63, s, 8, 8, 4)


def test_bad_argument_types():
    d, s = runtime.empty(16, np.uint8), np.zeros(16, np.uint8)
    with pytest.raises(TypeError):
        runtime.memcpy_2d(d, 4, s, 4, 4, 2, 3)
    with pytest.raises((TypeError, ValueError)):
        runtime.memcpy_2d(d, -1, s, 4, 4, 2)
    with pytest.raises(ValueError, match="read-only"):
        runtime.memcpy_2d(b"\0" * 16, 4, d, 4, 4, 2)


def test_typed_views_use_their_offset():
    base = runtime.to_device(np.zeros(64, np.uint8))
    view = base.view(np.uint8, 32, offset=16)
    runtime.memcpy_2d(view, 8, np.full(8, 7, np.uint8), 4, 4, 2)
    got = base.copy_to_host()
    assert got[16:20].tolist() == [7] * 4 and got[24:28].tolist() == [7] * 4
    assert got[:16].sum() == 0 and got[20:24].sum() == 0


def test_rectangle_form_over_2d_arrays():
    # pyopencl: test/test_wrapper.py::test_copy_buffer_rect (origins and region in elements)
    src = runtime.to_device(np.arange(6, dtype=np.float32).reshape(2, 3))
    dst = runtime.empty((4, 5), np.float32)
    runtime.memcpy_2d(dst, src, dst_origin=(1, 2), src_origin=(1, 0), region=(2, 2))
    expect = np.zeros((4, 5), np.float32)
    expect[2:4, 1:3] = np.arange(6, dtype=np.float32).reshape(2, 3)[:, 1:3]
    assert (dst.copy_to_host() == expect).all()
    host = np.zeros((3, 3), np.float32)
    runtime.memcpy_2d(host, dst, src_origin=(1, 2), region=(2, 2))
    assert host[:2, :2].tolist() == [[1, 2], [4, 5]]


def test_rectangle_form_errors():
    a, b = runtime.empty((2, 2), np.float32), runtime.empty(4, np.float32)
    with pytest.raises(ValueError, match="2-D"):
        runtime.memcpy_2d(a, b, region=(1, 1))
    with pytest.raises(ValueError, match="item sizes"):
        runtime.memcpy_2d(a, runtime.empty((2, 2), np.float64), region=(1, 1))
    with pytest.raises(TypeError, match="region"):
        runtime.memcpy_2d(a, a, dst_origin=(0, 0))
    with pytest.raises(ValueError, match="dst"):
        runtime.memcpy_2d(a, a, dst_origin=(1, 1), region=(2, 2))
