"""``acl.util``: pointer/bytes/numpy converters and pyACL's helper threads.

``bytes_to_ptr`` and ``numpy_to_ptr`` register the object's memory (in the native pointer
table, shared with the C library) as a host range that ``acl.rt.memcpy`` / ``memset`` may use (and write: pyACL samples copy device data into a
``bytes`` object this way; ``bytes`` of length 0 or 1 are shared by CPython and stay
read-only, a write into them returns ``ACL_ERROR_INVALID_PARAM``). runtime.acl keeps a reference to each registered object; once the
caller holds none, the newest ``_state.KEEP_UNREFERENCED`` of them stay valid and older ones
are released, after which their pointers are refused (``ACL_ERROR_INVALID_PARAM``) instead of
reaching freed memory. ``ptr_to_bytes`` / ``ptr_to_numpy`` read only host ranges runtime.acl
handed out; any other address raises ``ValueError`` (these functions return no ``ret``).
"""

from __future__ import annotations

import ctypes
import threading
import warnings
from typing import Any

import numpy as np

from runtime import _runtime as N

from . import _consts as C
from . import _state as S
from ._state import api, need_int

__all__ = [
    "bytes_to_ptr",
    "numpy_contiguous_to_ptr",
    "numpy_to_ptr",
    "ptr_to_bytes",
    "ptr_to_numpy",
    "start_thread",
    "stop_thread",
]


def bytes_to_ptr(data: bytes) -> int:
    """The address of ``data``'s own buffer (no copy); keep ``data`` alive while it is used."""
    if not isinstance(data, bytes):
        raise ValueError(f"acl.util.bytes_to_ptr: expected bytes, got {type(data).__name__}")
    addr = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value or 0
    # CPython shares every bytes object of length 0 and 1 made from data (b"", b"\x07"):
    # writing into one would change that value everywhere, so these stay read-only.
    S.borrow(addr, len(data), "bytes_to_ptr", data, len(data) > 1)
    return addr


def numpy_to_ptr(array: np.ndarray) -> int:
    """Deprecated in pyACL (warns): the address of a C-contiguous array's data."""
    warnings.warn("acl.util.numpy_to_ptr is deprecated; use acl.util.bytes_to_ptr", stacklevel=2)
    if not isinstance(array, np.ndarray):
        raise TypeError(
            f"acl.util.numpy_to_ptr args parse failed: expected numpy.ndarray, got {type(array).__name__}"
        )
    if not array.flags.c_contiguous:
        warnings.warn(
            "acl.util.numpy_to_ptr: the array is not contiguous; use numpy_contiguous_to_ptr",
            stacklevel=2,
        )
        raise ValueError("acl.util.numpy_to_ptr: the array is not C-contiguous")
    if array.dtype.hasobject:
        # Bytes copied into it would be dereferenced as Python objects.
        raise ValueError(
            f"acl.util.numpy_to_ptr: a {array.dtype} array holds Python object references, "
            "not data a copy may read or write"
        )
    addr = array.ctypes.data
    S.borrow(addr, array.nbytes, "numpy_to_ptr", array, bool(array.flags.writeable))
    return addr


def numpy_contiguous_to_ptr(array: np.ndarray) -> tuple[int, np.ndarray]:
    """``(ptr, contiguous_array)``; keep the returned array alive while ``ptr`` is used."""
    c = np.ascontiguousarray(array)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return numpy_to_ptr(c), c


def _host_range(name: str, ptr: Any, size: int) -> np.ndarray:
    """A uint8 array over ``[ptr, ptr + size)``, host memory the table knows (``ValueError``
    otherwise, as pyACL's converters raise)."""
    pinned, off, writable, ret = N.acl_host_range(ptr, size)
    if ret:
        msg = (S.recent_msg() or f"{name}: ptr {ptr:#x}").replace("acl.util.ptr_to_bytes", name)
        S.record_msg(msg)
        raise ValueError(msg)
    if pinned is not None:  # a malloc_host block: the array holds it
        return np.frombuffer(pinned, np.uint8)[off : off + size]
    if not size:
        return np.empty(0, np.uint8)
    arr = np.frombuffer((ctypes.c_char * size).from_address(ptr), np.uint8)
    if not writable:
        arr.flags.writeable = False
    return arr


def ptr_to_bytes(ptr: int, size: int) -> bytes:
    """A new ``bytes`` holding a copy of ``size`` bytes at host address ``ptr``."""
    need_int("acl.util.ptr_to_bytes", ptr=ptr, size=size)
    if size < 0:
        raise ValueError(f"acl.util.ptr_to_bytes: size {size} is negative")
    return _host_range("acl.util.ptr_to_bytes", ptr, size).tobytes()


def ptr_to_numpy(ptr: int, shape: tuple, npy_type: int) -> np.ndarray:
    """Deprecated in pyACL (warns): a writable array that wraps host memory at ``ptr``."""
    warnings.warn("acl.util.ptr_to_numpy is deprecated; use acl.util.ptr_to_bytes", stacklevel=2)
    need_int("acl.util.ptr_to_numpy", ptr=ptr, npy_type=npy_type)
    if not isinstance(shape, tuple) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise TypeError(
            "acl.util.ptr_to_numpy args parse failed: shape must be a tuple of non-negative ints"
        )
    dt = C.NPY_TYPES.get(npy_type)
    if dt is None:
        raise ValueError(f"acl.util.ptr_to_numpy: unknown numpy type code {npy_type}")
    dtype = np.dtype(dt)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return _host_range("acl.util.ptr_to_numpy", ptr, n).view(dtype).reshape(shape)


_threads: dict[int, tuple[threading.Thread, list]] = {}


@api("acl.util.start_thread", 1)
def start_thread(fn: Any, args: Any) -> tuple[int, int]:
    """Start a thread running ``fn(args)`` (``fn()`` when ``args`` is None): ``(thread_id, ret)``."""
    if not callable(fn):
        raise S.ArgTypeError("acl.util.start_thread args parse failed: fn must be callable")
    errors: list = []

    def run() -> None:
        try:
            fn() if args is None else fn(args)
        except BaseException as e:  # handed to stop_thread, as pyACL does
            errors.append(e)

    t = threading.Thread(target=run, name="acl.util.start_thread", daemon=True)
    t.start()
    assert t.ident is not None
    _threads[t.ident] = (t, errors)
    return t.ident, C.ACL_SUCCESS


def stop_thread(thread_id: int) -> int:
    """Join a thread from ``start_thread``; its exception is raised here as ``RuntimeError``."""
    need_int("acl.util.stop_thread", thread_id=thread_id)
    entry = _threads.pop(thread_id, None)
    if entry is None:
        S.record_msg(
            f"acl.util.stop_thread: {thread_id} is not a thread from acl.util.start_thread"
        )
        return C.ACL_ERROR_INVALID_PARAM
    t, errors = entry
    t.join()
    if errors:
        raise RuntimeError(f"acl.util.stop_thread: the thread raised {errors[0]!r}") from errors[0]
    return C.ACL_SUCCESS
