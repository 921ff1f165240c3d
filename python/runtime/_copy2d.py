"""The 2-D copy :func:`memcpy_2d` in its two forms: CUDA's (pitches and sizes in bytes, the
extension's ``memcpy_2d``) and PyOpenCL's rectangle form over 2-D arrays (origins and region
in elements, pitches from the arrays' shapes)."""

from __future__ import annotations

from typing import Any

from . import _runtime


def _rows_of(obj: Any, arg: str) -> tuple[int, int]:
    """(row pitch in bytes, item size) of a 2-D C-contiguous array or DeviceBuffer."""
    shape = tuple(obj.shape)
    if len(shape) != 2:
        raise ValueError(f"{arg}: the rectangle form needs a 2-D array, got shape {shape}")
    itemsize = int(obj.itemsize)
    if not isinstance(obj, _runtime.DeviceBuffer):
        flags = getattr(obj, "flags", None)
        if flags is not None and not flags["C_CONTIGUOUS"]:
            raise ValueError(f"{arg}: the rectangle form needs a C-contiguous array")
    return shape[1] * itemsize, itemsize


def _pair(v: Any, arg: str) -> tuple[int, int]:
    try:
        x, y = v
    except (TypeError, ValueError):
        raise TypeError(f"{arg} must be a pair (x, y) of ints, got {v!r}") from None
    for n in (x, y):
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"{arg}: (x, y) must be non-negative ints, got {v!r}")
    return x, y


def memcpy_2d(
    dst: Any,
    *args: Any,
    stream: _runtime.Stream | None = None,
    dst_offset: int = 0,
    src_offset: int = 0,
    dst_origin: tuple[int, int] | None = None,
    src_origin: tuple[int, int] | None = None,
    region: tuple[int, int] | None = None,
) -> None:
    """Copy a rectangle of rows between device buffers and host memory, in any direction.

    CUDA's form (``cudaMemcpy2D`` / ``aclrtMemcpy2d``), sizes in bytes::

        memcpy_2d(dst, dpitch, src, spitch, width, height, stream=None,
                  dst_offset=0, src_offset=0)

    copies ``height`` rows of ``width`` bytes; rows are ``dpitch`` / ``spitch`` bytes apart.
    ``width`` above a pitch, or a row outside its buffer, is a ``ValueError`` naming the
    numbers. PyOpenCL's rectangle form (``enqueue_copy`` of buffer rectangles) over 2-D
    C-contiguous arrays of one item size, in elements::

        memcpy_2d(dst, src, region=(width, height), dst_origin=(x, y), src_origin=(x, y))

    With ``stream`` the copy is queued on it (from pinned memory it reads the source when it
    runs; pageable sources are staged at once); without, it runs on the current stream and is
    waited for."""
    if region is not None or dst_origin is not None or src_origin is not None:
        if len(args) != 1:
            raise TypeError(
                "memcpy_2d(dst, src, *, region=..., dst_origin=..., src_origin=...) takes dst "
                f"and src only, got {1 + len(args)} positional arguments"
            )
        if region is None:
            raise TypeError("memcpy_2d: the rectangle form needs region=(width, height)")
        src = args[0]
        dpitch, ditem = _rows_of(dst, "dst")
        spitch, sitem = _rows_of(src, "src")
        if ditem != sitem:
            raise ValueError(f"dst and src item sizes differ ({ditem} and {sitem} bytes)")
        w, h = _pair(region, "region")
        dx, dy = _pair(dst_origin or (0, 0), "dst_origin")
        sx, sy = _pair(src_origin or (0, 0), "src_origin")
        for arg, obj, (x, y) in (("dst", dst, (dx, dy)), ("src", src, (sx, sy))):
            rows, cols = obj.shape
            if (w and h) and (x + w > cols or y + h > rows):
                raise ValueError(
                    f"{arg}: a region of {w} x {h} elements at ({x}, {y}) does not fit in its "
                    f"{rows} x {cols} array (x counts columns, y rows)"
                )
        _runtime.memcpy_2d(
            dst,
            dpitch,
            src,
            spitch,
            w * ditem,
            h,
            stream,
            dst_offset=dst_offset + dy * dpitch + dx * ditem,
            src_offset=src_offset + sy * spitch + sx * sitem,
        )
        return
    if len(args) == 6 and stream is None:
        *args, stream = args  # type: ignore[assignment]
    if len(args) != 5:
        raise TypeError(
            "memcpy_2d(dst, dpitch, src, spitch, width, height, stream=None) takes 6 or 7 "
            f"positional arguments, got {1 + len(args)}"
        )
    dpitch, src, spitch, width, height = args
    _runtime.memcpy_2d(
        dst,
        dpitch,
        src,
        spitch,
        width,
        height,
        stream,
        dst_offset=dst_offset,
        src_offset=src_offset,
    )
