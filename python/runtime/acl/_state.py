"""The ACL face's bookkeeping: error codes and messages, handles, pointer tables, contexts.

pyACL speaks plain integers: error codes, handles (contexts, streams, events, descriptors,
buffers, attrs) and raw addresses. This module owns the tables that turn them back into
``runtime`` objects, and the one place (:func:`api`) where a failure becomes a return code:

* :class:`AclError` carries a CANN error code and a message; :func:`api` catches it (and the
  runtime's own exceptions, mapped by :func:`code_of`), stores the message for
  ``acl.get_recent_err_msg()`` (per thread, as ``aclGetRecentErrMsg``) and returns the code in
  the function's result shape. Wrong Python *types* still raise ``TypeError``, as pyACL's
  argument parsing does.
* Handles are integers from one counter that never repeats, so a destroyed handle is always
  reported stale (``ACL_ERROR_INVALID_RESOURCE_HANDLE``), never mistaken for a new object.
* Device pointers are ``DeviceBuffer.ptr`` addresses. Live allocations sit in a sorted table
  (bisect), and every pointer a call receives must lie, with its size, inside one of them.
* Host pointers are checked against the host ranges this module handed out: ``malloc_host``
  blocks (owned here), and the objects behind ``util.bytes_to_ptr`` / ``util.numpy_to_ptr``
  (referenced here while in use, see :class:`HostTable`).
"""

from __future__ import annotations

import itertools
import sys
import threading
from bisect import bisect_right, insort
from typing import Any

import numpy as np

import runtime

from . import _consts as C

_tls = threading.local()
lock = threading.RLock()


class AclError(Exception):
    """A failure that the ACL face returns as ``code`` (never raised to the caller)."""

    def __init__(self, code: int, msg: str):
        super().__init__(msg)
        self.code = code


def record_msg(msg: str) -> None:
    _tls.msg = msg


def recent_msg() -> str | None:
    msg = getattr(_tls, "msg", None)
    _tls.msg = None
    return msg


def code_of(e: BaseException) -> int:
    """The CANN error code for an exception raised by ``runtime`` under an ACL call."""
    if isinstance(e, AclError):
        return e.code
    if isinstance(e, runtime.NotInitializedError):
        return C.ACL_ERROR_UNINITIALIZE
    if isinstance(e, runtime.InvalidDeviceError):
        return C.ACL_ERROR_RT_INVALID_DEVICEID
    if isinstance(e, runtime.OutOfMemoryError):
        return C.ACL_ERROR_BAD_ALLOC
    if isinstance(e, runtime.InvalidHandleError):
        return C.ACL_ERROR_INVALID_RESOURCE_HANDLE
    if isinstance(e, runtime.WaitTimeoutError):
        return C.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT
    if isinstance(e, runtime.NotReadyError):
        return C.ACL_ERROR_RT_EVENT_NOT_COMPLETE
    if isinstance(e, runtime.KernelError):
        return C.ACL_ERROR_RT_AICORE_EXCEPTION
    if isinstance(e, (ValueError, TypeError, OverflowError, runtime.InvalidOperationError)):
        return C.ACL_ERROR_INVALID_PARAM
    return C.ACL_ERROR_INTERNAL_ERROR


def fail(name: str, e: BaseException) -> int:
    code = code_of(e)
    msg = str(e) if isinstance(e, AclError) else f"{name}: {type(e).__name__}: {e}"
    record_msg(f"{msg} (error code {code})")
    return code


def api(name: str, nout: int = 0, fill: Any = 0):
    """Decorate an ACL function: failures return ``code`` (``nout == 0``) or
    ``(fill,) * nout + (code,)``. ``TypeError`` raised by argument checks propagates."""

    def deco(fn):
        if nout == 0:

            def wrapper(*args, **kw):
                try:
                    return fn(*args, **kw)
                except ArgTypeError:
                    raise
                except Exception as e:  # every failure becomes a code, never a raise
                    _raise_if_call_failed(name, e)
                    return fail(name, e)
        else:
            filler = (fill,) * nout

            def wrapper(*args, **kw):
                try:
                    return fn(*args, **kw)
                except ArgTypeError:
                    raise
                except Exception as e:
                    _raise_if_call_failed(name, e)
                    return (*filler, fail(name, e))

        wrapper.__name__ = fn.__name__
        wrapper.__qualname__ = fn.__qualname__
        wrapper.__doc__ = fn.__doc__
        wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
        return wrapper

    return deco


class ArgTypeError(TypeError):
    """pyACL's argument parsing failed: raised to the caller, as pyACL does."""


def _raise_if_call_failed(name: str, e: Exception) -> None:
    """Raise a ``TypeError`` that the call itself got (wrong number or names of arguments:
    raised in the wrapper's own frame, before the function ran) as pyACL's argument parsing
    does, instead of turning it into a return code."""
    tb = e.__traceback__
    if type(e) is TypeError and tb is not None and tb.tb_next is None:
        raise ArgTypeError(f"{name} args parse failed: {e}") from None


def need_int(name: str, **kw: Any) -> None:
    for k, v in kw.items():
        if type(v) is not int and not isinstance(v, (int, np.integer)) or isinstance(v, bool):
            raise ArgTypeError(
                f"{name} args parse failed: {k} must be an int, got {type(v).__name__}"
            )


# --------------------------------------------------------------------------- init state

initialized = False
owns_runtime = False


def check_init(name: str) -> None:
    if not initialized:
        raise AclError(C.ACL_ERROR_UNINITIALIZE, f"{name}: acl.init() has not been called")


# --------------------------------------------------------------------------- handles

_handle_numbers = itertools.count(0x1000_0000, 16)  # next() is atomic under the GIL
handles: dict[int, Any] = {}


def new_handle(obj: Any) -> int:
    h = next(_handle_numbers)
    handles[h] = obj
    return h


def get(h: Any, kind: type, what: str, name: str) -> Any:
    obj = handles.get(h)
    if obj is None or type(obj) is not kind:
        if h == 0:
            raise AclError(C.ACL_ERROR_INVALID_PARAM, f"{name}: {what} is null (0)")
        raise AclError(
            C.ACL_ERROR_INVALID_RESOURCE_HANDLE,
            f"{name}: {what} {h:#x} is not a live {kind.__name__.lower()} (destroyed or never created)",
        )
    return obj


def drop(h: int) -> None:
    handles.pop(h, None)


#: bumped by every call that destroys, frees or changes something an operator call may have
#: resolved (descriptors, data buffers, attrs, memory): acl.op's recorded plans check it
generation = 0


def bump() -> None:
    global generation
    generation += 1


# --------------------------------------------------------------------------- contexts


class Context:
    """A device context: its device, its default stream, and the streams made under it."""

    __slots__ = ("device", "handle", "is_default", "stream", "streams")

    def __init__(self, device: int, is_default: bool):
        self.device = device
        self.is_default = is_default
        self.stream = runtime.default_stream(device) if is_default else runtime.Stream(device)
        self.streams: set[int] = set()
        self.handle = 0


default_contexts: dict[int, Context] = {}


def set_current(ctx: Context | None) -> None:
    _tls.ctx = ctx


def need_context(name: str) -> Context:
    ctx = getattr(_tls, "ctx", None)
    if ctx is not None and handles.get(ctx.handle) is ctx:
        return ctx
    if not initialized:
        raise AclError(C.ACL_ERROR_UNINITIALIZE, f"{name}: acl.init() has not been called")
    raise AclError(
        C.ACL_ERROR_RT_CONTEXT_NULL,
        f"{name}: this thread has no current context (call acl.rt.set_device or acl.rt.set_context first)",
    )


class StreamRec:
    """An ACL stream: the runtime stream and the context that made it."""

    __slots__ = ("ctx", "handle", "stream")

    def __init__(self, stream: runtime.Stream, ctx: Context):
        self.stream = stream
        self.ctx = ctx
        self.handle = 0


def stream_of(h: Any, name: str) -> runtime.Stream:
    """The runtime stream for handle ``h`` (0: the current context's default stream)."""
    rec = handles.get(h)
    if type(rec) is StreamRec:
        return rec.stream
    if h == 0:
        return need_context(name).stream
    check_init(name)
    raise AclError(
        C.ACL_ERROR_INVALID_RESOURCE_HANDLE,
        f"{name}: stream {h:#x} is not a live stream (destroyed or never created)",
    )


# --------------------------------------------------------------------------- pointer tables


class DevAlloc:
    """A device allocation: ``buf`` is the runtime buffer, ``size`` what the caller asked for."""

    __slots__ = ("buf", "kind", "ptr", "size")
    is_dev = True

    def __init__(self, buf: runtime.DeviceBuffer, ptr: int, size: int, kind: str):
        self.buf = buf
        self.ptr = ptr
        self.size = size
        self.kind = kind


class HostAlloc:
    """A host range runtime.acl handed out: ``arr`` is a writable uint8 view of it."""

    __slots__ = ("arr", "kind", "owner", "ptr", "size")
    is_dev = False

    def __init__(self, ptr: int, size: int, kind: str, arr: np.ndarray, owner: Any):
        self.ptr = ptr
        self.size = size
        self.kind = kind
        self.arr = arr
        self.owner = owner


class RangeTable:
    """Live ranges ``[ptr, ptr + size)`` keyed by start, found with bisect. Device memory is
    host memory mapped by the runtime, so device and host ranges never overlap and share one
    table."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.by_start: dict[int, Any] = {}

    # No lock: each mutation is one C call under the GIL, and a start is put in ``by_start``
    # before ``starts`` and taken out of ``starts`` first, so every start a reader finds in
    # ``starts`` has its record (or the reader sees None and reports the pointer unknown).
    def add(self, rec: Any) -> None:
        new = rec.ptr not in self.by_start
        self.by_start[rec.ptr] = rec
        if new:
            insort(self.starts, rec.ptr)

    def remove(self, ptr: int) -> Any:
        rec = self.by_start.get(ptr)
        if rec is not None:
            bump()
            self.starts.remove(ptr)
            del self.by_start[ptr]
        return rec

    def find(self, ptr: int) -> Any:
        """The record whose range holds ``ptr`` (an empty range holds only its start), or None."""
        starts = self.starts
        i = bisect_right(starts, ptr) - 1
        if i < 0:
            return None
        try:
            rec = self.by_start.get(starts[i])
        except IndexError:  # a concurrent remove shortened the list
            return None
        if rec is None or (ptr >= rec.ptr + rec.size and ptr != rec.ptr):
            return None
        return rec

    def clear(self) -> list[Any]:
        out = list(self.by_start.values())
        self.starts.clear()
        self.by_start.clear()
        return out


mem = RangeTable()

#: bytes / numpy objects behind util.bytes_to_ptr / numpy_to_ptr pointers that only this
#: module still references, kept (most recent last) so that ``memcpy(dst, n,
#: bytes_to_ptr(a.tobytes()), n, kind)`` works; beyond this many they are released.
KEEP_UNREFERENCED = 64
_borrowed: list[int] = []


def borrow(ptr: int, size: int, kind: str, arr: np.ndarray, owner: Any) -> None:
    """Register a host range owned by a caller's object (kept alive while registered). A range
    inside one already registered (a view of it) needs no entry of its own."""
    with lock:
        have = mem.find(ptr)
        if have is not None and have.ptr != ptr and ptr + size <= have.ptr + have.size:
            return
        mem.add(HostAlloc(ptr, size, kind, arr, owner))
        if ptr in _borrowed:
            _borrowed.remove(ptr)
        _borrowed.append(ptr)
        _prune()


def _prune() -> None:
    # An entry whose owner only this table references is no longer the caller's; the newest
    # KEEP_UNREFERENCED of those stay valid, older ones are released (their pointer then fails).
    unref = []
    for p in _borrowed:
        rec = mem.by_start.get(p)
        if rec is None or rec.is_dev:
            continue
        # references: the record's slot and getrefcount's argument
        if sys.getrefcount(rec.owner) <= 2:
            unref.append(p)
    for p in unref[: max(0, len(unref) - KEEP_UNREFERENCED)]:
        mem.remove(p)
        _borrowed.remove(p)


def resolve(ptr: Any, size: int, what: str, name: str) -> tuple[Any, int]:
    """``(record, offset)`` of ``[ptr, ptr + size)`` inside one live allocation runtime.acl
    handed out (``record.is_dev`` says device or host); ``AclError`` otherwise."""
    rec = mem.find(ptr)
    if rec is not None:
        off = ptr - rec.ptr
        if off + size <= rec.size:
            return rec, off
        where = "device allocation" if rec.is_dev else "host buffer"
        raise AclError(
            C.ACL_ERROR_INVALID_PARAM,
            f"{name}: {what} {ptr:#x} + {size} bytes runs past the end of its {where} "
            f"({rec.ptr:#x}, {rec.size} bytes) by {off + size - rec.size} bytes",
        )
    if ptr == 0:
        raise AclError(C.ACL_ERROR_INVALID_PARAM, f"{name}: {what} is null (0)")
    raise AclError(
        C.ACL_ERROR_INVALID_PARAM,
        f"{name}: {what} {ptr:#x} is not inside any live allocation (device memory from "
        "acl.rt.malloc / acl.media.dvpp_malloc, host memory from acl.rt.malloc_host / "
        "acl.util.bytes_to_ptr / acl.util.numpy_to_ptr)",
    )


def reset_all() -> None:
    """Forget every handle and pointer (acl.finalize)."""
    global initialized
    bump()
    with lock:
        handles.clear()
        default_contexts.clear()
        mem.clear()
        _borrowed.clear()
    _tls.ctx = None
    initialized = False
