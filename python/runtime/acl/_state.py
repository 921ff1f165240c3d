"""The ACL face's Python-side bookkeeping, over the one implementation of ACL's conventions in
Rust (crate ``runtime-acl``, the same code as the C library ``libascendcl.so``).

What lives in Rust, shared with C callers in the same process: whether ``acl.init`` ran; the
handles of contexts, streams and events (one counter that never repeats); the table from raw
addresses back to allocations (device memory, ``malloc_host`` blocks, registered host
objects); every thread's current context; the per-thread recent error message
(``acl.get_recent_err_msg()`` is ``aclGetRecentErrMsg``). The native calls are the ``acl_*``
functions of ``runtime._runtime``.

What lives here: pyACL's Python conventions and the objects only Python has:

* :func:`api` turns a failure into a return code in the function's result shape (the native
  calls return codes themselves; this catches the Python-level failures: ``AclError`` raised
  here, the runtime's exceptions, ``OverflowError`` for an int out of a C type's range). Wrong
  Python *types* still raise ``TypeError`` (:class:`ArgTypeError`), as pyACL's argument
  parsing does.
* Handles of Python-only objects (tensor descriptors, data buffers, operator attributes and
  handles) take their numbers from the same counter as the native handles.
* Python objects registered as host memory (``util.bytes_to_ptr`` / ``numpy_to_ptr``): the
  native table holds each object while registered; this module decides when a registration
  the caller no longer references is released (:data:`KEEP_UNREFERENCED`).
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

import numpy as np

import runtime
from runtime import _runtime as N

from . import _consts as C

lock = threading.RLock()


def _before_fork() -> None:
    lock.acquire()  # the state it guards is whole when the process is copied


def _after_fork_in_parent() -> None:
    lock.release()


def _after_fork_in_child() -> None:
    # A lock of the child's own: a thread that held the copied one does not exist here.
    global lock
    lock = threading.RLock()


os.register_at_fork(
    before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child
)


class AclError(Exception):
    """A failure that the ACL face returns as ``code`` (never raised to the caller)."""

    def __init__(self, code: int, msg: str):
        super().__init__(msg)
        self.code = code


def record_msg(msg: str) -> None:
    """Keep ``msg`` as this thread's recent error message (shared with the C library)."""
    N.acl_record_err_msg(msg)


def recent_msg() -> str | None:
    """This thread's recent error message, cleared once read."""
    return N.acl_recent_err_msg()


def code_of(e: BaseException) -> int:
    """The CANN error code for an exception raised under an ACL call."""
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
    # The message for get_recent_err_msg, the code for get_last_error / peek_at_last_error.
    N.acl_record_error(code, f"{msg} (error code {code})")
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


def is_initialized() -> bool:
    return N.acl_is_initialized()


def check_init(name: str) -> None:
    if not N.acl_is_initialized():
        raise AclError(C.ACL_ERROR_UNINITIALIZE, f"{name}: acl.init() has not been called")


# --------------------------------------------------------------------------- handles

#: Python-only objects (descriptors, data buffers, operator attributes and handles) by handle
handles: dict[int, Any] = {}


def new_handle(obj: Any) -> int:
    h = N.acl_new_handle()
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


#: bumped by every call that destroys or changes a Python-only object an operator call may
#: have resolved (descriptors, data buffers, attrs): see :func:`state_key`
generation = 0


def bump() -> None:
    global generation
    generation += 1


def state_key() -> tuple[int, int]:
    """Changes whenever something an operator call resolved may have changed: a Python-only
    object (:data:`generation`) or the native pointer table (a free, from Python or C)."""
    return generation, N.acl_memory_generation()


def stream_of(h: Any, name: str) -> runtime.Stream:
    """The runtime stream for ACL stream handle ``h`` (0: the current context's default)."""
    s, ret = N.acl_stream(h)
    if ret:
        raise AclError(ret, recent_msg() or f"{name}: stream {h:#x}")
    return s


def resolve_device(ptr: int, size: int, what: str, name: str) -> tuple[runtime.DeviceBuffer, int]:
    """``(buffer over the whole device allocation, offset)`` for ``[ptr, ptr + size)``."""
    buf, off, ret = N.acl_resolve_device(ptr, size, what, name)
    if ret:
        raise AclError(ret, recent_msg() or f"{name}: {what} {ptr:#x}")
    return buf, off


# --------------------------------------------------------------------------- host objects

#: registered Python objects by address (also held by the native table while registered)
owners: dict[int, Any] = {}

#: bytes / numpy objects behind util.bytes_to_ptr / numpy_to_ptr pointers that only this
#: module still references, kept (most recent last) so that ``memcpy(dst, n,
#: bytes_to_ptr(a.tobytes()), n, kind)`` works; beyond this many they are released.
KEEP_UNREFERENCED = 64
_borrowed: list[int] = []


def borrow(ptr: int, size: int, tag: str, owner: Any, writable: bool) -> None:
    """Register ``size`` bytes at ``ptr``, the data of ``owner``, as host memory the copy
    calls accept. A range inside one already registered (a view of it) needs no entry."""
    with lock:
        if not N.acl_register_host(owner, ptr, size, writable, tag):
            return
        owners[ptr] = owner
        if ptr in _borrowed:
            _borrowed.remove(ptr)
        _borrowed.append(ptr)
        _prune()


def _prune() -> None:
    # An entry whose owner only this module and the native table reference is no longer the
    # caller's; the newest KEEP_UNREFERENCED of those stay valid, older ones are released
    # (their pointers then fail).
    unref = []
    for p in _borrowed:
        # references: ``owners``, the native table, getrefcount's argument
        if p in owners and sys.getrefcount(owners[p]) <= 3:
            unref.append(p)
    for p in unref[: max(0, len(unref) - KEEP_UNREFERENCED)]:
        N.acl_unregister_host(p)
        owners.pop(p, None)
        _borrowed.remove(p)


def reset_all() -> None:
    """Forget the Python-side objects (``acl.finalize``; the native tables are cleared by it)."""
    bump()
    with lock:
        handles.clear()
        for p in list(owners):
            N.acl_unregister_host(p)
        owners.clear()
        _borrowed.clear()
