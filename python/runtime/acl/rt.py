"""``acl.rt``: devices, contexts, streams, events, memory and callbacks over ``runtime``.

Each function has pyACL's signature and return shape (a bare ``ret`` or a tuple ending with
``ret``) and returns CANN's error code instead of raising (see ``_state.api``).

====================================  ====================================================
pyACL                                 runtime
====================================  ====================================================
``set_device`` / ``reset_device``     the device's default context; its stream is
                                      ``runtime.default_stream(device)``
``create_context`` / ``set_context``  a context of this module: device + its own
                                      ``runtime.Stream``; current per thread
``create_stream`` / ``destroy_stream``  ``runtime.Stream(device)`` / ``Stream.destroy()``
``create_event`` / ``record_event``   ``runtime.Event()`` / ``Event.record(stream)``
``malloc`` / ``free``                 ``runtime.device_malloc`` / ``runtime.device_free``
``memcpy[_async]``                    ``memcpy_host_to_device`` / ``memcpy_device_to_host`` /
                                      ``memcpy_d2d`` with offsets; host to host in numpy
``memset[_async]``                    ``runtime.memset`` (host memory: numpy, stream-ordered
                                      through ``Stream.launch_host_func``)
``launch_callback``                   ``Stream.launch_host_func`` handing ``fn`` to the
                                      thread that called ``subscribe_report``
====================================  ====================================================
"""

from __future__ import annotations

import queue
import sys
import threading
import traceback
from typing import Any

import runtime

from . import _consts as C
from . import _state as S
from ._state import AclError, api, need_int

__all__ = [
    "create_context",
    "create_event",
    "create_event_ex_with_flag",
    "create_event_with_flag",
    "create_stream",
    "create_stream_with_config",
    "ctx_get_current_default_stream",
    "destroy_context",
    "destroy_event",
    "destroy_stream",
    "destroy_stream_force",
    "event_elapsed_time",
    "free",
    "free_host",
    "get_context",
    "get_device",
    "get_device_count",
    "get_mem_info",
    "get_run_mode",
    "launch_callback",
    "malloc",
    "malloc_align32",
    "malloc_cached",
    "malloc_host",
    "memcpy",
    "memcpy_async",
    "memset",
    "memset_async",
    "process_report",
    "query_event",
    "query_event_status",
    "record_event",
    "reset_device",
    "reset_device_force",
    "reset_event",
    "set_context",
    "set_device",
    "stream_query",
    "stream_wait_event",
    "subscribe_report",
    "synchronize_device",
    "synchronize_device_with_timeout",
    "synchronize_event",
    "synchronize_event_with_timeout",
    "synchronize_stream",
    "synchronize_stream_with_timeout",
    "unsubscribe_report",
]

# --------------------------------------------------------------------------- devices


@api("acl.rt.set_device")
def set_device(device_id: int) -> int:
    """Bind this thread to ``device_id``'s default context (made on first use)."""
    need_int("acl.rt.set_device", device_id=device_id)
    S.check_init("acl.rt.set_device")
    n = runtime.get_device_count()
    if not 0 <= device_id < n:
        raise AclError(
            C.ACL_ERROR_RT_INVALID_DEVICEID,
            f"acl.rt.set_device: device_id {device_id} is out of range (0..{n - 1})",
        )
    with S.lock:
        ctx = S.default_contexts.get(device_id)
        if ctx is None:
            ctx = S.Context(device_id, True)
            ctx.handle = S.new_handle(ctx)
            S.default_contexts[device_id] = ctx
    S.set_current(ctx)
    return C.ACL_SUCCESS


def _teardown_context(ctx: S.Context) -> None:
    for h in list(ctx.streams):
        rec = S.handles.get(h)
        S.drop(h)
        if type(rec) is S.StreamRec:
            _subs.pop(rec.stream.id, None)
            rec.stream.destroy()
    ctx.streams.clear()
    S.drop(ctx.handle)
    if ctx.is_default:
        ctx.stream.synchronize()
    else:
        ctx.stream.destroy()
    if getattr(S._tls, "ctx", None) is ctx:
        S.set_current(None)


@api("acl.rt.reset_device")
def reset_device(device_id: int) -> int:
    """Release the device's default context and the streams made under it (waits for them)."""
    need_int("acl.rt.reset_device", device_id=device_id)
    S.check_init("acl.rt.reset_device")
    n = runtime.get_device_count()
    if not 0 <= device_id < n:
        raise AclError(
            C.ACL_ERROR_RT_INVALID_DEVICEID,
            f"acl.rt.reset_device: device_id {device_id} is out of range (0..{n - 1})",
        )
    with S.lock:
        ctx = S.default_contexts.pop(device_id, None)
    if ctx is not None:
        _teardown_context(ctx)
    return C.ACL_SUCCESS


reset_device_force = reset_device


@api("acl.rt.get_device", 1)
def get_device() -> tuple[int, int]:
    """``(device_id, ret)`` of this thread's current context."""
    return S.need_context("acl.rt.get_device").device, C.ACL_SUCCESS


@api("acl.rt.get_device_count", 1)
def get_device_count() -> tuple[int, int]:
    S.check_init("acl.rt.get_device_count")
    return runtime.get_device_count(), C.ACL_SUCCESS


@api("acl.rt.get_run_mode", 1)
def get_run_mode() -> tuple[int, int]:
    """``(ACL_HOST, ret)``: the program runs on the host, the device is separate (EP mode)."""
    S.check_init("acl.rt.get_run_mode")
    return C.ACL_HOST, C.ACL_SUCCESS


@api("acl.rt.synchronize_device")
def synchronize_device() -> int:
    ctx = S.need_context("acl.rt.synchronize_device")
    runtime.Device(ctx.device).synchronize()
    return C.ACL_SUCCESS


@api("acl.rt.synchronize_device_with_timeout")
def synchronize_device_with_timeout(timeout: int) -> int:
    need_int("acl.rt.synchronize_device_with_timeout", timeout=timeout)
    ctx = S.need_context("acl.rt.synchronize_device_with_timeout")
    runtime.Device(ctx.device).synchronize(
        _seconds(timeout, "acl.rt.synchronize_device_with_timeout")
    )
    return C.ACL_SUCCESS


def _seconds(timeout_ms: int, name: str) -> float | None:
    if timeout_ms == -1:
        return None
    if timeout_ms <= 0:
        raise AclError(
            C.ACL_ERROR_INVALID_PARAM, f"{name}: timeout {timeout_ms} ms (use -1 or > 0)"
        )
    return timeout_ms / 1000.0


# --------------------------------------------------------------------------- contexts


@api("acl.rt.create_context", 1)
def create_context(device_id: int) -> tuple[int, int]:
    """A new context on ``device_id`` with its own default stream; it becomes current."""
    need_int("acl.rt.create_context", device_id=device_id)
    S.check_init("acl.rt.create_context")
    n = runtime.get_device_count()
    if not 0 <= device_id < n:
        raise AclError(
            C.ACL_ERROR_RT_INVALID_DEVICEID,
            f"acl.rt.create_context: device_id {device_id} is out of range (0..{n - 1})",
        )
    ctx = S.Context(device_id, False)
    ctx.handle = S.new_handle(ctx)
    S.set_current(ctx)
    return ctx.handle, C.ACL_SUCCESS


@api("acl.rt.destroy_context")
def destroy_context(context: int) -> int:
    """Destroy a context from ``create_context`` (its streams are destroyed after their work)."""
    need_int("acl.rt.destroy_context", context=context)
    S.check_init("acl.rt.destroy_context")
    ctx = S.get(context, S.Context, "context", "acl.rt.destroy_context")
    if ctx.is_default:
        raise AclError(
            C.ACL_ERROR_INVALID_PARAM,
            "acl.rt.destroy_context: the device's default context is released by acl.rt.reset_device",
        )
    _teardown_context(ctx)
    return C.ACL_SUCCESS


@api("acl.rt.set_context")
def set_context(context: int) -> int:
    need_int("acl.rt.set_context", context=context)
    S.check_init("acl.rt.set_context")
    S.set_current(S.get(context, S.Context, "context", "acl.rt.set_context"))
    return C.ACL_SUCCESS


@api("acl.rt.get_context", 1)
def get_context() -> tuple[int, int]:
    return S.need_context("acl.rt.get_context").handle, C.ACL_SUCCESS


@api("acl.rt.ctx_get_current_default_stream", 1)
def ctx_get_current_default_stream() -> tuple[int, int]:
    """``(0, ret)``: the default stream is named by 0 in every stream argument."""
    S.need_context("acl.rt.ctx_get_current_default_stream")
    return 0, C.ACL_SUCCESS


# --------------------------------------------------------------------------- streams


def create_stream() -> tuple[int, int]:
    """``(stream, ret)``: a new stream on the current context's device."""
    try:
        ctx = S.need_context("acl.rt.create_stream")
        rec = S.StreamRec(runtime.Stream(ctx.device), ctx)
        h = rec.handle = S.new_handle(rec)
        ctx.streams.add(h)
        return h, C.ACL_SUCCESS
    except Exception as e:
        return 0, S.fail("acl.rt.create_stream", e)


@api("acl.rt.create_stream_with_config", 1)
def create_stream_with_config(priority: int, flag: int) -> tuple[int, int]:
    """A stream with ``priority`` (clamped to the runtime's range); ``flag`` is accepted."""
    need_int("acl.rt.create_stream_with_config", priority=priority, flag=flag)
    ctx = S.need_context("acl.rt.create_stream_with_config")
    lo, hi = sorted(runtime.stream_priority_range())
    rec = S.StreamRec(runtime.Stream(ctx.device, priority=min(max(priority, lo), hi)), ctx)
    h = rec.handle = S.new_handle(rec)
    ctx.streams.add(h)
    return h, C.ACL_SUCCESS


@api("acl.rt.destroy_stream")
def destroy_stream(stream: int) -> int:
    """Destroy a stream after its queued work ran."""
    need_int("acl.rt.destroy_stream", stream=stream)
    S.check_init("acl.rt.destroy_stream")
    rec = S.get(stream, S.StreamRec, "stream", "acl.rt.destroy_stream")
    S.drop(stream)
    rec.ctx.streams.discard(stream)
    _subs.pop(rec.stream.id, None)
    rec.stream.destroy()
    return C.ACL_SUCCESS


destroy_stream_force = destroy_stream


def synchronize_stream(stream: int) -> int:
    """Wait for ``stream``'s queued work (0: the default stream)."""
    try:
        if type(stream) is not int:  # before any lookup: a list is a TypeError, not a code
            need_int("acl.rt.synchronize_stream", stream=stream)
        srec = S.handles.get(stream)
        if type(srec) is S.StreamRec:
            srec.stream.synchronize()
            return C.ACL_SUCCESS
        S.stream_of(stream, "acl.rt.synchronize_stream").synchronize()
        return C.ACL_SUCCESS
    except S.ArgTypeError:
        raise
    except Exception as e:
        return S.fail("acl.rt.synchronize_stream", e)


@api("acl.rt.synchronize_stream_with_timeout")
def synchronize_stream_with_timeout(stream: int, timeout: int) -> int:
    name = "acl.rt.synchronize_stream_with_timeout"
    need_int(name, stream=stream, timeout=timeout)
    s = S.stream_of(stream, name)
    try:
        s.synchronize(_seconds(timeout, name))
    except runtime.WaitTimeoutError as e:
        raise AclError(C.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT, str(e)) from e
    return C.ACL_SUCCESS


@api("acl.rt.stream_query", 1)
def stream_query(stream: int) -> tuple[int, int]:
    """``(ACL_STREAM_STATUS_COMPLETE or ..._NOT_READY, ret)``."""
    need_int("acl.rt.stream_query", stream=stream)
    done = S.stream_of(stream, "acl.rt.stream_query").query()
    return (C.ACL_STREAM_STATUS_COMPLETE if done else C.ACL_STREAM_STATUS_NOT_READY), C.ACL_SUCCESS


@api("acl.rt.stream_wait_event")
def stream_wait_event(stream: int, event: int) -> int:
    name = "acl.rt.stream_wait_event"
    need_int(name, stream=stream, event=event)
    s = S.stream_of(stream, name)
    s.wait_event(S.get(event, EventRec, "event", name).ev)
    return C.ACL_SUCCESS


# --------------------------------------------------------------------------- events


class EventRec:
    """An ACL event: the runtime event (replaced by ``reset_event``) and its flag."""

    __slots__ = ("ev", "flag")

    def __init__(self, flag: int):
        self.ev = runtime.Event(enable_timing=True)
        self.flag = flag


def _new_event(name: str, flag: int) -> tuple[int, int]:
    S.need_context(name)
    return S.new_handle(EventRec(flag)), C.ACL_SUCCESS


@api("acl.rt.create_event", 1)
def create_event() -> tuple[int, int]:
    return _new_event("acl.rt.create_event", 0)


@api("acl.rt.create_event_with_flag", 1)
def create_event_with_flag(flag: int) -> tuple[int, int]:
    need_int("acl.rt.create_event_with_flag", flag=flag)
    if flag < 0 or flag & ~0x7F:
        raise AclError(
            C.ACL_ERROR_INVALID_PARAM, f"acl.rt.create_event_with_flag: unknown flag {flag:#x}"
        )
    return _new_event("acl.rt.create_event_with_flag", flag)


create_event_ex_with_flag = create_event_with_flag


@api("acl.rt.destroy_event")
def destroy_event(event: int) -> int:
    """Forget the event; work that records it still completes (no wait, as CANN)."""
    need_int("acl.rt.destroy_event", event=event)
    S.check_init("acl.rt.destroy_event")
    S.get(event, EventRec, "event", "acl.rt.destroy_event")
    S.drop(event)
    return C.ACL_SUCCESS


def record_event(event: int, stream: int) -> int:
    """Record ``event`` at the end of ``stream``'s queued work (0: the default stream)."""
    try:
        name = "acl.rt.record_event"
        if type(event) is not int or type(stream) is not int:  # before any lookup
            need_int(name, event=event, stream=stream)
        rec = S.handles.get(event)
        srec = S.handles.get(stream)
        if type(rec) is EventRec and type(srec) is S.StreamRec:
            rec.ev.record(srec.stream)
            return C.ACL_SUCCESS
        S.check_init(name)
        rec = S.get(event, EventRec, "event", name)
        rec.ev.record(S.stream_of(stream, name))
        return C.ACL_SUCCESS
    except S.ArgTypeError:
        raise
    except Exception as e:
        return S.fail("acl.rt.record_event", e)


@api("acl.rt.reset_event")
def reset_event(event: int, stream: int) -> int:
    """Return the event to its never-recorded state (at once, not in ``stream``'s order)."""
    name = "acl.rt.reset_event"
    need_int(name, event=event, stream=stream)
    S.check_init(name)
    rec = S.get(event, EventRec, "event", name)
    S.stream_of(stream, name)
    rec.ev = runtime.Event(enable_timing=True)
    return C.ACL_SUCCESS


@api("acl.rt.query_event_status", 1)
def query_event_status(event: int) -> tuple[int, int]:
    """``(ACL_EVENT_RECORDED_STATUS_COMPLETE (1) or _NOT_READY (0), ret)``."""
    need_int("acl.rt.query_event_status", event=event)
    S.check_init("acl.rt.query_event_status")
    rec = S.get(event, EventRec, "event", "acl.rt.query_event_status")
    done = rec.ev.query()
    return (
        C.ACL_EVENT_RECORDED_STATUS_COMPLETE if done else C.ACL_EVENT_RECORDED_STATUS_NOT_READY
    ), 0


@api("acl.rt.query_event", 1)
def query_event(event: int) -> tuple[int, int]:
    """Deprecated: ``(ACL_EVENT_STATUS_COMPLETE (0) or _NOT_READY (1), ret)``."""
    need_int("acl.rt.query_event", event=event)
    S.check_init("acl.rt.query_event")
    rec = S.get(event, EventRec, "event", "acl.rt.query_event")
    return (C.ACL_EVENT_STATUS_COMPLETE if rec.ev.query() else C.ACL_EVENT_STATUS_NOT_READY), 0


@api("acl.rt.synchronize_event")
def synchronize_event(event: int) -> int:
    need_int("acl.rt.synchronize_event", event=event)
    S.check_init("acl.rt.synchronize_event")
    S.get(event, EventRec, "event", "acl.rt.synchronize_event").ev.synchronize()
    return C.ACL_SUCCESS


@api("acl.rt.synchronize_event_with_timeout")
def synchronize_event_with_timeout(event: int, timeout: int) -> int:
    name = "acl.rt.synchronize_event_with_timeout"
    need_int(name, event=event, timeout=timeout)
    S.check_init(name)
    rec = S.get(event, EventRec, "event", name)
    try:
        rec.ev.synchronize(_seconds(timeout, name))
    except runtime.WaitTimeoutError as e:
        raise AclError(C.ACL_ERROR_RT_EVENT_SYNC_TIMEOUT, str(e)) from e
    return C.ACL_SUCCESS


@api("acl.rt.event_elapsed_time", 1, 0.0)
def event_elapsed_time(start: int, end: int) -> tuple[float, int]:
    """``(milliseconds, ret)`` between two completed records."""
    name = "acl.rt.event_elapsed_time"
    need_int(name, start=start, end=end)
    S.check_init(name)
    a = S.get(start, EventRec, "start event", name)
    b = S.get(end, EventRec, "end event", name)
    return float(a.ev.elapsed_time(b.ev)), C.ACL_SUCCESS


# --------------------------------------------------------------------------- memory


def _device_alloc(name: str, size: Any, nbytes: int, kind: str, align: int) -> tuple[int, int]:
    ctx = S.need_context(name)
    buf = runtime.device_malloc(ctx.device, nbytes)
    ptr = buf.ptr
    if ptr % align:
        runtime.device_free(buf)
        raise AclError(
            C.ACL_ERROR_RT_MEMORY_ALLOCATION,
            f"{name}: the runtime returned {ptr:#x}, not {align}-byte aligned",
        )
    S.mem.add(S.DevAlloc(buf, ptr, size, kind))
    return ptr, C.ACL_SUCCESS


def _check_size(name: str, size: int) -> None:
    if size <= 0:
        raise AclError(C.ACL_ERROR_INVALID_PARAM, f"{name}: size {size} (must be > 0)")


def malloc(size: int, policy: int) -> tuple[int, int]:
    """``(dev_ptr, ret)``: ``size`` bytes of device memory, 64-byte aligned. Every access is
    checked against ``size`` (CANN pads the block by up to 63 bytes and does not check)."""
    # Hot path: the api() wrapper's work is inlined (a return code, never a raise).
    try:
        if type(size) is not int or type(policy) is not int:
            need_int("acl.rt.malloc", size=size, policy=policy)
        if size <= 0 or policy < 0:
            raise AclError(
                C.ACL_ERROR_INVALID_PARAM,
                f"acl.rt.malloc: size {size} (must be > 0), policy {policy}",
            )
        ctx = S.need_context("acl.rt.malloc")
        buf = runtime.device_malloc(ctx.device, (size + 31) & ~31)
        ptr = buf.ptr
        if ptr & 63:
            runtime.device_free(buf)
            raise AclError(
                C.ACL_ERROR_RT_MEMORY_ALLOCATION, f"acl.rt.malloc: {ptr:#x} is not 64-byte aligned"
            )
        S.mem.add(S.DevAlloc(buf, ptr, size, "malloc"))
        return ptr, C.ACL_SUCCESS
    except S.ArgTypeError:
        raise
    except Exception as e:
        return 0, S.fail("acl.rt.malloc", e)


@api("acl.rt.malloc_align32", 1)
def malloc_align32(size: int, policy: int) -> tuple[int, int]:
    need_int("acl.rt.malloc_align32", size=size, policy=policy)
    _check_size("acl.rt.malloc_align32", size)
    return _device_alloc("acl.rt.malloc_align32", size, (size + 31) // 32 * 32, "malloc", 64)


malloc_cached = malloc


def dvpp_alloc(size: int) -> tuple[int, int]:
    _check_size("acl.media.dvpp_malloc", size)
    return _device_alloc("acl.media.dvpp_malloc", size, (size + 31) // 32 * 32, "dvpp", 128)


def device_free(name: str, ptr: int, kind: str) -> int:
    S.check_init(name)
    rec = S.mem.by_start.get(ptr)
    if rec is None or not rec.is_dev or rec.kind != kind:
        if ptr == 0:
            raise AclError(C.ACL_ERROR_INVALID_PARAM, f"{name}: ptr is null (0)")
        if rec is not None and rec.is_dev:
            other = "acl.rt.free" if rec.kind == "malloc" else "acl.media.dvpp_free"
            why = f"it was allocated by {'acl.rt.malloc' if rec.kind == 'malloc' else 'acl.media.dvpp_malloc'}; free it with {other}"
        elif (inner := S.mem.find(ptr)) is not None and inner.is_dev:
            why = f"it is {ptr - inner.ptr} bytes inside the allocation at {inner.ptr:#x}, not its start"
        elif inner is not None:
            why = "it is host memory (acl.rt.free_host frees acl.rt.malloc_host memory)"
        else:
            why = "it is not a live device allocation (freed already, or never allocated)"
        raise AclError(C.ACL_ERROR_INVALID_PARAM, f"{name}: ptr {ptr:#x}: {why}")
    S.mem.remove(ptr)
    runtime.device_free(rec.buf)
    return C.ACL_SUCCESS


def free(dev_ptr: int) -> int:
    """Free ``malloc`` memory (work still queued on it finishes first)."""
    try:
        if type(dev_ptr) is not int:  # before the lookup: a list is a TypeError, not a code
            need_int("acl.rt.free", dev_ptr=dev_ptr)
        rec = S.mem.by_start.get(dev_ptr)
        if type(rec) is not S.DevAlloc or rec.kind != "malloc" or not S.initialized:
            return device_free("acl.rt.free", dev_ptr, "malloc")
        S.mem.remove(dev_ptr)
        runtime.device_free(rec.buf)
        return C.ACL_SUCCESS
    except S.ArgTypeError:
        raise
    except Exception as e:
        return S.fail("acl.rt.free", e)


@api("acl.rt.malloc_host", 1)
def malloc_host(size: int) -> tuple[int, int]:
    """``(host_ptr, ret)``: ``size`` bytes of page-locked host memory (``runtime.malloc_host``),
    as ``aclrtMallocHost`` gives: stream-ordered copies read it when they run, not when queued."""
    need_int("acl.rt.malloc_host", size=size)
    S.check_init("acl.rt.malloc_host")
    _check_size("acl.rt.malloc_host", size)
    try:
        arr = runtime.malloc_host(size)
    except MemoryError as e:
        raise AclError(C.ACL_ERROR_BAD_ALLOC, f"acl.rt.malloc_host: {size} bytes: {e}") from e
    S.mem.add(S.HostAlloc(arr.ptr, size, "malloc_host", arr, arr))
    return arr.ptr, C.ACL_SUCCESS


@api("acl.rt.free_host")
def free_host(host_ptr: int) -> int:
    """Free ``malloc_host`` memory (queued copies still holding it keep it alive until they ran)."""
    need_int("acl.rt.free_host", host_ptr=host_ptr)
    S.check_init("acl.rt.free_host")
    rec = S.mem.by_start.get(host_ptr)
    if rec is None or rec.is_dev or rec.kind != "malloc_host":
        if host_ptr == 0:
            why = "is null (0)"
        elif rec is not None and not rec.is_dev:
            why = f"was not allocated by acl.rt.malloc_host (it comes from {rec.kind})"
        elif (inner := S.mem.find(host_ptr)) is not None and inner.is_dev:
            why = "is device memory (use acl.rt.free)"
        else:
            why = "is not a live acl.rt.malloc_host block (freed already, or never allocated)"
        raise AclError(C.ACL_ERROR_INVALID_PARAM, f"acl.rt.free_host: host_ptr {host_ptr:#x} {why}")
    S.mem.remove(host_ptr)
    runtime.free_host(rec.arr)  # copies already queued from it keep it alive until they ran
    return C.ACL_SUCCESS


def _copy(name: str, dst: int, dest_max: int, src: int, count: int, kind: int, stream: Any) -> int:
    if not S.initialized:
        S.check_init(name)
    if not 0 <= kind <= 7 or count < 0 or count > dest_max:
        if not 0 <= kind <= C.ACL_MEMCPY_INTER_DEVICE_TO_DEVICE:
            raise AclError(
                C.ACL_ERROR_INVALID_PARAM, f"{name}: kind {kind} is not an aclrtMemcpyKind (0..7)"
            )
        if count < 0:
            raise AclError(C.ACL_ERROR_INVALID_PARAM, f"{name}: negative count {count}")
        raise AclError(
            C.ACL_ERROR_INVALID_PARAM, f"{name}: count {count} exceeds dest_max {dest_max}"
        )
    # Pointers at the start of an allocation (the usual case) are one dict lookup; any other
    # address is found by bisecting the table.
    by_start = S.mem.by_start
    d = by_start.get(dst)
    if d is not None and dest_max <= d.size:
        doff = 0
    else:
        d, doff = S.resolve(dst, dest_max, "dst", name)
    src_rec = by_start.get(src)
    if src_rec is not None and count <= src_rec.size:
        soff = 0
    else:
        src_rec, soff = S.resolve(src, count, "src", name)
    if count == 0:
        return C.ACL_SUCCESS
    # As CANN documents, the direction follows the two addresses; kind only has to be valid.
    if d.is_dev:
        if src_rec.is_dev:
            runtime.memcpy_d2d(
                d.buf, src_rec.buf, stream, count=count, dst_offset=doff, src_offset=soff
            )
        else:
            runtime.memcpy_host_to_device(
                d.buf, src_rec.arr, stream, count=count, dst_offset=doff, src_offset=soff
            )
    elif src_rec.is_dev:
        runtime.memcpy_device_to_host(
            d.arr, src_rec.buf, stream, count=count, dst_offset=doff, src_offset=soff
        )
    else:
        if stream is not None:
            raise AclError(
                C.ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
                f"{name}: an asynchronous host-to-host copy is not supported (EP mode); use acl.rt.memcpy",
            )
        d.arr[doff : doff + count] = src_rec.arr[soff : soff + count]
    return C.ACL_SUCCESS


def memcpy(dst: int, dest_max: int, src: int, count: int, kind: int) -> int:
    """Synchronous copy of ``count`` bytes; both ranges must lie in live allocations."""
    try:
        if (
            type(dst) is not int
            or type(src) is not int
            or type(count) is not int
            or type(dest_max) is not int
            or type(kind) is not int
        ):
            need_int("acl.rt.memcpy", dst=dst, dest_max=dest_max, src=src, count=count, kind=kind)
        return _copy("acl.rt.memcpy", dst, dest_max, src, count, kind, None)
    except S.ArgTypeError:
        raise
    except Exception as e:
        return S.fail("acl.rt.memcpy", e)


@api("acl.rt.memcpy_async")
def memcpy_async(dst: int, dest_max: int, src: int, count: int, kind: int, stream: int) -> int:
    """Stream-ordered copy (host buffers are kept alive until it ran)."""
    name = "acl.rt.memcpy_async"
    if (
        type(dst) is not int
        or type(src) is not int
        or type(count) is not int
        or type(dest_max) is not int
        or type(kind) is not int
        or type(stream) is not int
    ):
        need_int(name, dst=dst, dest_max=dest_max, src=src, count=count, kind=kind, stream=stream)
    return _copy(name, dst, dest_max, src, count, kind, S.stream_of(stream, name))


def _set(name: str, ptr: int, max_count: int, value: int, count: int, stream: Any) -> int:
    S.check_init(name)
    if count < 0 or max_count < 0:
        raise AclError(
            C.ACL_ERROR_INVALID_PARAM,
            f"{name}: negative size (count {count}, max_count {max_count})",
        )
    if count > max_count:
        raise AclError(
            C.ACL_ERROR_INVALID_PARAM, f"{name}: count {count} exceeds max_count {max_count}"
        )
    p, off = S.resolve(ptr, max_count, "dev_ptr", name)
    if count == 0:
        return C.ACL_SUCCESS
    byte = value & 0xFF
    if p.is_dev:
        runtime.memset(p.buf, byte, count, offset=off, stream=stream)
    else:
        view = p.arr[off : off + count]
        if stream is None:
            view[:] = byte
        else:

            def fill(view=view, byte=byte):
                view[:] = byte

            stream.launch_host_func(fill)
    return C.ACL_SUCCESS


@api("acl.rt.memset")
def memset(dev_ptr: int, max_count: int, value: int, count: int) -> int:
    """Set ``count`` bytes to ``value & 0xFF`` (device or runtime.acl host memory)."""
    need_int("acl.rt.memset", dev_ptr=dev_ptr, max_count=max_count, value=value, count=count)
    return _set("acl.rt.memset", dev_ptr, max_count, value, count, None)


@api("acl.rt.memset_async")
def memset_async(dev_ptr: int, max_count: int, value: int, count: int, stream: int) -> int:
    name = "acl.rt.memset_async"
    need_int(name, dev_ptr=dev_ptr, max_count=max_count, value=value, count=count, stream=stream)
    return _set(name, dev_ptr, max_count, value, count, S.stream_of(stream, name))


_DDR = {
    C.ACL_DDR_MEM,
    C.ACL_DDR_MEM_HUGE,
    C.ACL_DDR_MEM_NORMAL,
    C.ACL_DDR_MEM_P2P_HUGE,
    C.ACL_DDR_MEM_P2P_NORMAL,
}


@api("acl.rt.get_mem_info", 2)
def get_mem_info(attr: int) -> tuple[int, int, int]:
    """``(free, total, ret)`` in bytes of the current device. The virtual device's memory is
    its HBM (every HBM and generic attribute reports it); DDR attributes report 0, 0."""
    need_int("acl.rt.get_mem_info", attr=attr)
    ctx = S.need_context("acl.rt.get_mem_info")
    if not 0 <= attr <= C.ACL_MEM_P2P_HUGE1G:
        raise AclError(
            C.ACL_ERROR_INVALID_PARAM,
            f"acl.rt.get_mem_info: attr {attr} is not an aclrtMemAttr (0..17)",
        )
    if attr in _DDR:
        return 0, 0, C.ACL_SUCCESS
    # CANN's free returns memory to the device at once: blocks runtime's allocator caches for
    # reuse count as free here.
    stats = runtime.memory_stats(ctx.device)
    return stats["total"] - stats["allocated"], stats["total"], C.ACL_SUCCESS


# --------------------------------------------------------------------------- callbacks
#
# pyACL's model: a thread calls subscribe_report(its id, stream), then loops on
# process_report(timeout); launch_callback(fn, data, block, stream) queues fn on the stream and,
# when the stream reaches it, fn(data) runs in that subscribed thread. With ACL_CALLBACK_BLOCK
# the stream waits until fn returned.

_subs: dict[int, int] = {}  # runtime stream id -> subscribed thread id
_queues: dict[int, queue.SimpleQueue] = {}  # thread id -> reports waiting for process_report


@api("acl.rt.subscribe_report")
def subscribe_report(thread_id: int, stream: int) -> int:
    name = "acl.rt.subscribe_report"
    need_int(name, thread_id=thread_id, stream=stream)
    s = S.stream_of(stream, name)
    with S.lock:
        have = _subs.get(s.id)
        if have == thread_id:
            raise AclError(
                C.ACL_ERROR_REPEAT_SUBSCRIBE,
                f"{name}: thread {thread_id} already serves this stream",
            )
        if have is not None:
            raise AclError(
                C.ACL_ERROR_RT_STREAM_SUBSCRIBE,
                f"{name}: the stream is served by thread {have} already",
            )
        _subs[s.id] = thread_id
        _queues.setdefault(thread_id, queue.SimpleQueue())
    return C.ACL_SUCCESS


@api("acl.rt.unsubscribe_report")
def unsubscribe_report(thread_id: int, stream: int) -> int:
    name = "acl.rt.unsubscribe_report"
    need_int(name, thread_id=thread_id, stream=stream)
    s = S.stream_of(stream, name)
    with S.lock:
        if _subs.get(s.id) != thread_id:
            raise AclError(
                C.ACL_ERROR_RT_STREAM_NO_CB_REG,
                f"{name}: thread {thread_id} does not serve this stream",
            )
        del _subs[s.id]
        if thread_id not in _subs.values():
            q = _queues.pop(thread_id, None)
            if q is not None:
                q.put(None)  # wakes a process_report waiting in that thread
    return C.ACL_SUCCESS


@api("acl.rt.launch_callback")
def launch_callback(fn: Any, user_data: Any, block_type: int, stream: int) -> int:
    """Queue ``fn(user_data)`` on ``stream``; the subscribed thread runs it in process_report."""
    name = "acl.rt.launch_callback"
    if not callable(fn):
        raise S.ArgTypeError(f"{name} args parse failed: fn must be callable")
    need_int(name, block_type=block_type, stream=stream)
    if block_type not in (C.ACL_CALLBACK_NO_BLOCK, C.ACL_CALLBACK_BLOCK):
        raise AclError(
            C.ACL_ERROR_INVALID_PARAM, f"{name}: block_type {block_type} (0 = no block, 1 = block)"
        )
    s = S.stream_of(stream, name)
    tid = _subs.get(s.id)
    if tid is None:
        raise AclError(
            C.ACL_ERROR_RT_STREAM_NO_CB_REG,
            f"{name}: no thread is subscribed to the stream (acl.rt.subscribe_report)",
        )
    sid = s.id
    block = block_type == C.ACL_CALLBACK_BLOCK

    def report() -> None:
        q = _queues.get(tid)
        if q is None or _subs.get(sid) != tid:
            return
        done = threading.Event() if block else None
        q.put((fn, user_data, done))
        if done is not None:
            # the stream waits for the callback, as long as its thread still serves it
            while not done.wait(0.05):
                if _subs.get(sid) != tid or not S.initialized:
                    return

    s.launch_host_func(report)
    return C.ACL_SUCCESS


@api("acl.rt.process_report")
def process_report(timeout: int) -> int:
    """Run the callbacks that reached this thread, waiting up to ``timeout`` ms (-1: forever)."""
    name = "acl.rt.process_report"
    need_int(name, timeout=timeout)
    S.check_init(name)
    q = _queues.get(threading.get_ident())
    if q is None:
        raise AclError(
            C.ACL_ERROR_RT_THREAD_SUBSCRIBE,
            f"{name}: this thread serves no stream (acl.rt.subscribe_report)",
        )
    secs = _seconds(timeout, name)
    try:
        if secs is None:
            item = None
            while item is None:
                try:
                    item = q.get(timeout=0.1)
                except queue.Empty:
                    if _queues.get(threading.get_ident()) is not q:
                        raise AclError(
                            C.ACL_ERROR_RT_THREAD_SUBSCRIBE, f"{name}: unsubscribed while waiting"
                        ) from None
        else:
            item = q.get(timeout=secs)
    except queue.Empty:
        raise AclError(
            C.ACL_ERROR_RT_REPORT_TIMEOUT, f"{name}: no callback within {timeout} ms"
        ) from None
    while item is not None:
        fn, data, done = item
        try:
            fn(data)
        except Exception:  # pyACL logs a callback's exception and goes on
            print(f"{name}: callback {fn!r} raised:", file=sys.stderr)
            traceback.print_exc()
        finally:
            if done is not None:
                done.set()
        try:
            item = q.get_nowait()
        except queue.Empty:
            break
    return C.ACL_SUCCESS


def _reset_callbacks() -> None:
    with S.lock:
        _subs.clear()
        for q in _queues.values():
            q.put(None)
        _queues.clear()
