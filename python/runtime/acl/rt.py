"""``acl.rt``: devices, contexts, streams, events, memory and callbacks.

Each function has pyACL's signature and return shape (a bare ``ret`` or a tuple ending with
``ret``) and returns CANN's error code instead of raising. The work is done by the native
calls (``runtime._runtime.acl_*``): the Rust implementation of ACL's conventions that the C
library ``libascendcl.so`` runs too (crate ``runtime-acl``), so a C program and a Python
script in one process share one set of handles, one pointer table and one runtime; this
module checks pyACL's argument *types* (a ``TypeError``, as pyACL's argument parsing raises)
and converts the results.

Host memory here is memory the table knows: ``malloc_host`` blocks and objects registered by
``acl.util.bytes_to_ptr`` / ``numpy_to_ptr``; any other address is ``ACL_ERROR_INVALID_PARAM``.
Callbacks (``launch_callback``) run in the thread that ``subscribe_report``-ed the stream,
inside its ``process_report``; an exception a callback raises is printed, as pyACL does.
"""

from __future__ import annotations

from typing import Any

from runtime import _runtime as N

from . import _consts as C
from . import _state as S
from ._state import api, need_int

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
    "get_device_utilization_rate",
    "get_last_error",
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
    "peek_at_last_error",
    "process_report",
    "query_device_status",
    "query_event",
    "query_event_status",
    "query_event_wait_status",
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
    """Bind this thread to ``device_id``'s default context (made on first use; each call
    counts one reference, which ``reset_device`` drops)."""
    need_int("acl.rt.set_device", device_id=device_id)
    return N.acl_set_device(device_id)


@api("acl.rt.reset_device")
def reset_device(device_id: int) -> int:
    """Drop one reference to the device's default context; the last releases it and the
    streams made under it (after their work)."""
    need_int("acl.rt.reset_device", device_id=device_id)
    return N.acl_reset_device(device_id, False)


@api("acl.rt.reset_device_force")
def reset_device_force(device_id: int) -> int:
    """Release the device's default context whatever its reference count."""
    need_int("acl.rt.reset_device_force", device_id=device_id)
    return N.acl_reset_device(device_id, True)


def get_device() -> tuple[int, int]:
    """``(device_id, ret)`` of this thread's current context."""
    return N.acl_get_device()


def get_device_count() -> tuple[int, int]:
    return N.acl_get_device_count()


@api("acl.rt.query_device_status", 1)
def query_device_status(device_id: int) -> tuple[int, int]:
    """``(ACL_RT_DEVICE_STATUS_NORMAL (0) or _ABNORMAL (1), ret)``: abnormal once the device's
    runtime is gone (a forked child, after a shutdown)."""
    need_int("acl.rt.query_device_status", device_id=device_id)
    return N.acl_query_device_status(device_id)


@api("acl.rt.get_device_utilization_rate", 1, None)
def get_device_utilization_rate(device_id: int) -> tuple[dict[str, int] | None, int]:
    """``(utilization_info, ret)``: pyACL's ``aclrtUtilizationInfo`` dict. ``cube_utilization``
    is measured: the percent of the device's compute workers' time spent running kernels and
    host functions since the previous query of that device (the first: since it started).
    The device has no separate vector or AI CPU units and no memory utilisation, so those
    read -1, as CANN reports units a device lacks; ``utilization_extend`` is reserved (0)."""
    need_int("acl.rt.get_device_utilization_rate", device_id=device_id)
    (cube, vector, aicpu, memory), ret = N.acl_device_utilization(device_id)
    if ret != C.ACL_SUCCESS:
        return None, ret
    info = {
        "cube_utilization": cube,
        "vector_utilization": vector,
        "aicpu_utilization": aicpu,
        "memory_utilization": memory,
        "utilization_extend": 0,
    }
    return info, ret


def peek_at_last_error(level: int) -> int:
    """This thread's last error code (0 when none), left in place: ``aclrtPeekAtLastError``.
    ``level`` is required, as in pyACL; only ``ACL_RT_THREAD_LEVEL`` (0) exists."""
    need_int("acl.rt.peek_at_last_error", level=level)
    return N.acl_last_error(False)


def get_last_error(level: int) -> int:
    """This thread's last error code (0 when none), then cleared: ``aclrtGetLastError``."""
    need_int("acl.rt.get_last_error", level=level)
    return N.acl_last_error(True)


def get_run_mode() -> tuple[int, int]:
    """``(ACL_HOST, ret)``: the program runs on the host (answered before ``acl.init`` too)."""
    return C.ACL_HOST, C.ACL_SUCCESS


def synchronize_device() -> int:
    return N.acl_synchronize_device(-1)


@api("acl.rt.synchronize_device_with_timeout")
def synchronize_device_with_timeout(timeout: int) -> int:
    need_int("acl.rt.synchronize_device_with_timeout", timeout=timeout)
    return N.acl_synchronize_device(timeout)


# --------------------------------------------------------------------------- contexts


@api("acl.rt.create_context", 1)
def create_context(device_id: int) -> tuple[int, int]:
    """A new context on ``device_id`` with its own default stream; it becomes current."""
    need_int("acl.rt.create_context", device_id=device_id)
    return N.acl_create_context(device_id)


@api("acl.rt.destroy_context")
def destroy_context(context: int) -> int:
    """Destroy a context from ``create_context`` (its streams are destroyed after their work)."""
    need_int("acl.rt.destroy_context", context=context)
    return N.acl_destroy_context(context)


@api("acl.rt.set_context")
def set_context(context: int) -> int:
    need_int("acl.rt.set_context", context=context)
    return N.acl_set_context(context)


def get_context() -> tuple[int, int]:
    return N.acl_get_context()


@api("acl.rt.ctx_get_current_default_stream", 1)
def ctx_get_current_default_stream() -> tuple[int, int]:
    """``(0, ret)``: the default stream is named by 0 in every stream argument."""
    ctx, ret = N.acl_get_context()
    return 0, ret


# --------------------------------------------------------------------------- streams


def create_stream() -> tuple[int, int]:
    """``(stream, ret)``: a new stream on the current context's device."""
    return N.acl_create_stream(0)


@api("acl.rt.create_stream_with_config", 1)
def create_stream_with_config(priority: int, flag: int) -> tuple[int, int]:
    """A stream with ``priority`` (clamped to the runtime's range); ``flag`` is accepted."""
    need_int("acl.rt.create_stream_with_config", priority=priority, flag=flag)
    return N.acl_create_stream(max(-(2**31), min(priority, 2**31 - 1)))


@api("acl.rt.destroy_stream")
def destroy_stream(stream: int) -> int:
    """Destroy a stream after its queued work ran."""
    need_int("acl.rt.destroy_stream", stream=stream)
    return N.acl_destroy_stream(stream)


destroy_stream_force = destroy_stream


@api("acl.rt.synchronize_stream")
def synchronize_stream(stream: int) -> int:
    """Wait for ``stream``'s queued work (0: the default stream)."""
    if type(stream) is not int:
        need_int("acl.rt.synchronize_stream", stream=stream)
    return N.acl_synchronize_stream(stream, -1)


@api("acl.rt.synchronize_stream_with_timeout")
def synchronize_stream_with_timeout(stream: int, timeout: int) -> int:
    need_int("acl.rt.synchronize_stream_with_timeout", stream=stream, timeout=timeout)
    return N.acl_synchronize_stream(stream, timeout)


@api("acl.rt.stream_query", 1)
def stream_query(stream: int) -> tuple[int, int]:
    """``(ACL_STREAM_STATUS_COMPLETE or ..._NOT_READY, ret)``."""
    need_int("acl.rt.stream_query", stream=stream)
    return N.acl_stream_query(stream)


@api("acl.rt.stream_wait_event")
def stream_wait_event(stream: int, event: int) -> int:
    need_int("acl.rt.stream_wait_event", stream=stream, event=event)
    return N.acl_stream_wait_event(stream, event)


# --------------------------------------------------------------------------- events


@api("acl.rt.create_event", 1)
def create_event() -> tuple[int, int]:
    return N.acl_create_event(0)


@api("acl.rt.create_event_with_flag", 1)
def create_event_with_flag(flag: int) -> tuple[int, int]:
    need_int("acl.rt.create_event_with_flag", flag=flag)
    return N.acl_create_event(flag)


create_event_ex_with_flag = create_event_with_flag


@api("acl.rt.destroy_event")
def destroy_event(event: int) -> int:
    """Forget the event; work that records it still completes (no wait, as CANN)."""
    need_int("acl.rt.destroy_event", event=event)
    return N.acl_destroy_event(event)


@api("acl.rt.record_event")
def record_event(event: int, stream: int) -> int:
    """Record ``event`` at the end of ``stream``'s queued work (0: the default stream)."""
    if type(event) is not int or type(stream) is not int:
        need_int("acl.rt.record_event", event=event, stream=stream)
    return N.acl_record_event(event, stream)


@api("acl.rt.reset_event")
def reset_event(event: int, stream: int) -> int:
    """Return the event to its never-recorded state (at once, not in ``stream``'s order)."""
    need_int("acl.rt.reset_event", event=event, stream=stream)
    return N.acl_reset_event(event, stream)


@api("acl.rt.query_event_status", 1)
def query_event_status(event: int) -> tuple[int, int]:
    """``(ACL_EVENT_RECORDED_STATUS_COMPLETE (1) or _NOT_READY (0), ret)``."""
    need_int("acl.rt.query_event_status", event=event)
    return N.acl_query_event(event, True)


@api("acl.rt.query_event", 1)
def query_event(event: int) -> tuple[int, int]:
    """Deprecated: ``(ACL_EVENT_STATUS_COMPLETE (0) or _NOT_READY (1), ret)``."""
    need_int("acl.rt.query_event", event=event)
    return N.acl_query_event(event, False)


@api("acl.rt.query_event_wait_status", 1)
def query_event_wait_status(event: int) -> tuple[int, int]:
    """``(ACL_EVENT_WAIT_STATUS_COMPLETE (0) or _NOT_READY (1), ret)``: whether every stream
    made to wait for ``event`` (``stream_wait_event``) has received it (passed its wait);
    COMPLETE when no stream waits for it."""
    need_int("acl.rt.query_event_wait_status", event=event)
    return N.acl_query_event_wait_status(event)


@api("acl.rt.synchronize_event")
def synchronize_event(event: int) -> int:
    need_int("acl.rt.synchronize_event", event=event)
    return N.acl_synchronize_event(event, -1)


@api("acl.rt.synchronize_event_with_timeout")
def synchronize_event_with_timeout(event: int, timeout: int) -> int:
    need_int("acl.rt.synchronize_event_with_timeout", event=event, timeout=timeout)
    return N.acl_synchronize_event(event, timeout)


@api("acl.rt.event_elapsed_time", 1, 0.0)
def event_elapsed_time(start: int, end: int) -> tuple[float, int]:
    """``(milliseconds, ret)`` between two completed records."""
    need_int("acl.rt.event_elapsed_time", start=start, end=end)
    return N.acl_event_elapsed_time(start, end)


# --------------------------------------------------------------------------- memory


@api("acl.rt.malloc", 1)
def malloc(size: int, policy: int) -> tuple[int, int]:
    """``(dev_ptr, ret)``: ``size`` bytes of device memory, 64-byte aligned. Every access is
    checked against ``size`` (CANN pads the block by up to 63 bytes and does not check)."""
    if type(size) is not int or type(policy) is not int:
        need_int("acl.rt.malloc", size=size, policy=policy)
    return N.acl_malloc(size, False)


malloc_align32 = malloc
malloc_cached = malloc


@api("acl.rt.free")
def free(dev_ptr: int) -> int:
    """Free ``malloc`` memory (work still queued on it finishes first)."""
    if type(dev_ptr) is not int:
        need_int("acl.rt.free", dev_ptr=dev_ptr)
    return N.acl_free(dev_ptr, False)


@api("acl.rt.malloc_host", 1)
def malloc_host(size: int) -> tuple[int, int]:
    """``(host_ptr, ret)``: ``size`` bytes of page-locked host memory (the runtime's pinned
    memory): stream-ordered copies read it when they run, not when queued."""
    need_int("acl.rt.malloc_host", size=size)
    return N.acl_malloc_host(size)


@api("acl.rt.free_host")
def free_host(host_ptr: int) -> int:
    """Free ``malloc_host`` memory (queued copies still holding it keep it until they ran)."""
    need_int("acl.rt.free_host", host_ptr=host_ptr)
    return N.acl_free_host(host_ptr)


@api("acl.rt.memcpy")
def memcpy(dst: int, dest_max: int, src: int, count: int, kind: int) -> int:
    """Synchronous copy of ``count`` bytes; both ranges must lie in live allocations (the
    direction follows the addresses; a kind naming a device side needs device memory there)."""
    if (
        type(dst) is not int
        or type(src) is not int
        or type(count) is not int
        or type(dest_max) is not int
        or type(kind) is not int
    ):
        need_int("acl.rt.memcpy", dst=dst, dest_max=dest_max, src=src, count=count, kind=kind)
    return N.acl_memcpy(dst, dest_max, src, count, kind)


@api("acl.rt.memcpy_async")
def memcpy_async(dst: int, dest_max: int, src: int, count: int, kind: int, stream: int) -> int:
    """Stream-ordered copy (host buffers are kept alive until it ran)."""
    name = "acl.rt.memcpy_async"
    need_int(name, dst=dst, dest_max=dest_max, src=src, count=count, kind=kind, stream=stream)
    return N.acl_memcpy(dst, dest_max, src, count, kind, stream)


@api("acl.rt.memset")
def memset(dev_ptr: int, max_count: int, value: int, count: int) -> int:
    """Set ``count`` bytes to ``value & 0xFF`` (device or runtime.acl host memory)."""
    need_int("acl.rt.memset", dev_ptr=dev_ptr, max_count=max_count, value=value, count=count)
    return N.acl_memset(dev_ptr, max_count, value & 0xFF, count)


@api("acl.rt.memset_async")
def memset_async(dev_ptr: int, max_count: int, value: int, count: int, stream: int) -> int:
    name = "acl.rt.memset_async"
    need_int(name, dev_ptr=dev_ptr, max_count=max_count, value=value, count=count, stream=stream)
    return N.acl_memset(dev_ptr, max_count, value & 0xFF, count, stream)


@api("acl.rt.get_mem_info", 2)
def get_mem_info(attr: int) -> tuple[int, int, int]:
    """``(free, total, ret)`` in bytes of the current device. The virtual device's memory is
    its HBM (every HBM and generic attribute reports it); DDR attributes report 0, 0."""
    need_int("acl.rt.get_mem_info", attr=attr)
    return N.acl_get_mem_info(attr)


# --------------------------------------------------------------------------- callbacks
#
# pyACL's model: a thread calls subscribe_report(its id, stream), then loops on
# process_report(timeout); launch_callback(fn, data, block, stream) queues fn on the stream and,
# when the stream reaches it, fn(data) runs in that subscribed thread. With ACL_CALLBACK_BLOCK
# the stream's later work waits until fn returned.


@api("acl.rt.subscribe_report")
def subscribe_report(thread_id: int, stream: int) -> int:
    need_int("acl.rt.subscribe_report", thread_id=thread_id, stream=stream)
    return N.acl_subscribe_report(thread_id, stream)


@api("acl.rt.unsubscribe_report")
def unsubscribe_report(thread_id: int, stream: int) -> int:
    need_int("acl.rt.unsubscribe_report", thread_id=thread_id, stream=stream)
    return N.acl_unsubscribe_report(thread_id, stream)


@api("acl.rt.launch_callback")
def launch_callback(fn: Any, user_data: Any, block_type: int, stream: int) -> int:
    """Queue ``fn(user_data)`` on ``stream``; the subscribed thread runs it in process_report."""
    if not callable(fn):
        raise S.ArgTypeError("acl.rt.launch_callback args parse failed: fn must be callable")
    need_int("acl.rt.launch_callback", block_type=block_type, stream=stream)
    return N.acl_launch_callback(fn, user_data, block_type, stream)


@api("acl.rt.process_report")
def process_report(timeout: int) -> int:
    """Run the callbacks that reached this thread, waiting up to ``timeout`` ms (-1: forever)."""
    need_int("acl.rt.process_report", timeout=timeout)
    return N.acl_process_report(timeout)
