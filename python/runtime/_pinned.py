"""Pinned (page-locked) host memory as numpy arrays: :func:`malloc_host`, :func:`pinned_empty`,
and CuPy's ``cupyx`` creation functions (:func:`zeros_pinned`, :func:`empty_like_pinned`,
:func:`zeros_like_pinned`); and as CuPy's pointer objects: :func:`alloc_pinned_memory`.

The memory comes from the core's caching pinned allocator (``runtime._runtime.PinnedMemory``,
one block each); the array keeps its block alive, and the block returns to the cache once no
array over it and no queued copy is left. Copies queued on a stream from pinned memory read it
when the stream runs them (truly asynchronous); copies from ordinary (pageable) numpy arrays
are staged when queued, so those arrays may be reused as soon as the call returns.
"""

from __future__ import annotations

import contextlib
import math
import resource
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

from ._runtime import (
    PinnedMemory,
    PinnedMemoryPointer,
    _malloc_host,
    host_register,
    host_unregister,
)


class PinnedArray(np.ndarray):
    """A numpy array over pinned host memory (returned by :func:`malloc_host` and
    :func:`pinned_empty`); slices and views of it are ``PinnedArray`` too."""

    @property
    def ptr(self) -> int:
        """Address of element 0 (``cupy``'s ``PinnedMemoryPointer.ptr``)."""
        return int(self.__array_interface__["data"][0])

    @property
    def is_pinned(self) -> bool:
        """Whether the OS locked the pages (``torch.Tensor.is_pinned``); False when ``mlock``
        was refused and the memory is pageable."""
        mem = _block(self)
        return mem is not None and mem.locked


def _block(arr: np.ndarray) -> PinnedMemory | None:
    """The pinned block under ``arr`` (through its chain of bases), if any."""
    base: Any = arr
    while base is not None:
        if isinstance(base, PinnedMemory):
            return base
        if isinstance(base, memoryview):
            base = base.obj
        else:
            base = getattr(base, "base", None)
    return None


def _allocate(nbytes: int, what: str) -> PinnedMemory:
    mem = _malloc_host(nbytes)
    if nbytes and not mem.locked:
        soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        limit = "unlimited" if soft == resource.RLIM_INFINITY else f"{soft} bytes"
        warnings.warn(
            f"{what}: the OS refused to lock {nbytes} bytes in RAM (RLIMIT_MEMLOCK is {limit}); "
            "the memory is pageable, though copies still treat it as pinned. Raise the limit "
            "with `ulimit -l` for page-locked memory.",
            RuntimeWarning,
            stacklevel=3,
        )
    return mem


def malloc_host(nbytes: int, mapped: bool = False) -> PinnedArray:
    """``nbytes`` of pinned host memory as a 1-D ``uint8`` :class:`PinnedArray`
    (``cudaMallocHost`` / ``aclrtMallocHost``; ``cupy.cuda.alloc_pinned_memory``).

    ``mapped=True`` (numba's ``cuda.pinned_array``/``mapped_array`` flag) is accepted: on
    virtual devices host memory is always addressable by device work. Fresh memory is zero;
    memory reused from the pinned cache keeps its old bytes. Warns ``RuntimeWarning`` when
    the OS refuses to lock the pages."""
    if not isinstance(mapped, bool):
        raise TypeError(f"mapped must be a bool, got {type(mapped).__name__}")
    mem = _allocate(nbytes, "malloc_host")
    return np.frombuffer(mem, dtype=np.uint8).view(PinnedArray)


def alloc_pinned_memory(nbytes: int) -> PinnedMemoryPointer:
    """``nbytes`` of pinned host memory as a :class:`PinnedMemoryPointer` at its first byte
    (``cupy.cuda.alloc_pinned_memory``): ``p + n``, ``n + p``, ``p - n`` give pointers ``n``
    bytes on or back, ``p += n`` / ``p -= n`` move ``p`` itself (all within the block),
    ``p.ptr`` / ``int(p)`` is the address, ``p.size()`` the bytes to the block's end, and
    ``numpy.frombuffer(p, dtype, count)`` an array over the memory from ``p`` on. Warns
    ``RuntimeWarning`` when the OS refuses to lock the pages, as :func:`malloc_host` does."""
    return PinnedMemoryPointer(_allocate(nbytes, "alloc_pinned_memory"), 0)


def _dims(shape: Any) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    for n in dims:
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 0:
            raise ValueError(f"shape: dimensions must be non-negative ints, got {shape!r}")
    return tuple(int(n) for n in dims)


def pinned_empty(
    shape: int | tuple[int, ...], dtype: Any = "float32", order: str = "C"
) -> PinnedArray:
    """A :class:`PinnedArray` of ``shape`` and ``dtype`` over pinned host memory
    (``torch.empty(..., pin_memory=True)``; ``cupyx.empty_pinned``), in C (row-major) or
    ``order="F"`` (column-major) layout. Not zeroed when the memory is reused from the pinned
    cache."""
    if order not in ("C", "F"):
        raise ValueError(f"order must be 'C' or 'F', got {order!r}")
    dt = np.dtype(dtype)
    dims = _dims(shape)
    count = math.prod(dims)
    mem = _allocate(count * dt.itemsize, "pinned_empty")
    arr = np.frombuffer(mem, dtype=dt, count=count).reshape(dims, order=order)
    return arr.view(PinnedArray)


def zeros_pinned(
    shape: int | tuple[int, ...], dtype: Any = "float32", order: str = "C"
) -> PinnedArray:
    """:func:`pinned_empty`, zeroed (``cupyx.zeros_pinned``)."""
    out = pinned_empty(shape, dtype, order)
    out.fill(0)
    return out


def _like_order(a: np.ndarray, order: str, shape: Any) -> str:
    """numpy's ``order`` of a ``*_like`` call: ``K`` and ``A`` keep ``a``'s column-major
    layout when ``a`` has it and the number of dimensions does not change."""
    if order in ("C", "F"):
        return order
    if order not in ("K", "A"):
        raise ValueError(f"order must be 'C', 'F', 'A' or 'K', got {order!r}")
    same_ndim = shape is None or len(_dims(shape)) == a.ndim
    fortran = a.flags["F_CONTIGUOUS"] and not a.flags["C_CONTIGUOUS"]
    return "F" if same_ndim and fortran else "C"


def empty_like_pinned(
    a: Any, dtype: Any = None, order: str = "K", shape: Any = None
) -> PinnedArray:
    """A :class:`PinnedArray` with ``a``'s shape and dtype, or those given
    (``cupyx.empty_like_pinned``; ``numpy.empty_like`` over pinned memory)."""
    a = np.asarray(a)
    return pinned_empty(
        a.shape if shape is None else shape,
        a.dtype if dtype is None else dtype,
        _like_order(a, order, shape),
    )


def zeros_like_pinned(
    a: Any, dtype: Any = None, order: str = "K", shape: Any = None
) -> PinnedArray:
    """:func:`empty_like_pinned`, zeroed (``cupyx.zeros_like_pinned``)."""
    out = empty_like_pinned(a, dtype, order, shape)
    out.fill(0)
    return out


@contextlib.contextmanager
def pinned(*arrays: Any) -> Iterator[None]:
    """Register ``arrays`` as pinned memory for the block (numba's ``cuda.pinned(*arrays)``):
    :func:`host_register` on entry, :func:`host_unregister` on exit, in reverse order. Copies
    queued from or to them inside the block read or write them when the stream runs them, so
    the block's end refuses (``NotReadyError``) while one is still queued: synchronize first.
    An array that cannot be registered unregisters the ones before it."""
    done: list[Any] = []
    try:
        for a in arrays:
            host_register(a)
            done.append(a)
        yield
    finally:
        for a in reversed(done):
            host_unregister(a)
