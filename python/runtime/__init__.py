"""runtime: a virtual accelerator runtime with a Rust core.

Devices, device memory, streams, events and kernel launch in the mould of the CUDA and Ascend
CANN runtimes. The devices are virtual: backed by host memory and host threads, so the whole
API (with real asynchrony and real timing) runs on any machine.

Call :func:`init` first; every other call (except :func:`set_option`, :func:`get_option` and
:func:`is_initialized`) raises :class:`NotInitializedError` before ``init`` and after
:func:`shutdown`.
"""

from __future__ import annotations

import atexit as _atexit

from . import comm, kernels
from ._allocator import using_allocator

# Pinned host memory and 2-D copies: pure-Python faces over the extension.
from ._copy2d import memcpy_2d
from ._native import get_include
from ._pinned import (
    PinnedArray,
    alloc_pinned_memory,
    empty_like_pinned,
    malloc_host,
    pinned,
    pinned_empty,
    zeros_like_pinned,
    zeros_pinned,
)
from ._runtime import (
    MAX_BLOCK_DIM,
    MAX_QUEUED,
    ComputeInfo,
    Device,
    DeviceBuffer,
    DeviceProperties,
    Error,
    Event,
    Graph,
    InvalidDeviceError,
    InvalidHandleError,
    InvalidOperationError,
    Kernel,
    KernelError,
    MemoryAsyncPool,
    MemoryInfo,
    MemoryPool,
    NotInitializedError,
    NotReadyError,
    OutOfMemoryError,
    PinnedMemory,
    PinnedMemoryPointer,
    Stream,
    WaitTimeoutError,
    _shutdown_at_exit,
    current_stream,
    default_stream,
    defer_cleanup,
    device_free,
    device_malloc,
    empty,
    empty_cache,
    free_async,
    free_host,
    get_allocator,
    get_available_devices,
    get_block_idx,
    get_block_num,
    get_default_memory_pool,
    get_device,
    get_device_compute_info,
    get_device_count,
    get_device_memory_info,
    get_device_properties,
    get_option,
    get_per_process_memory_fraction,
    host_empty_cache,
    host_is_registered,
    host_memory_stats,
    host_register,
    host_unregister,
    init,
    ipc_open,
    is_current_stream_capturing,
    is_initialized,
    malloc_async,
    malloc_managed,
    mem_advise,
    mem_range_attributes,
    memcpy_d2d,
    memcpy_device_to_host,
    memcpy_host_to_device,
    memory_stats,
    memset,
    option_names,
    prefetch,
    reset_peak_memory_stats,
    set_allocator,
    set_device,
    set_option,
    set_per_process_memory_fraction,
    set_stream,
    shutdown,
    stream_priority_range,
    stream_synchronize,
    to_device,
)
from ._summary import memory_summary
from .trace import profile

__version__ = "0.1.0"


def ExternalStream(handle, device=None) -> Stream:  # noqa: N802 - CuPy's and torch's name
    """A stream made elsewhere, wrapped from its handle (a ``Stream.id``, or the ``Stream``):
    CuPy's ``cupy.cuda.ExternalStream(ptr)``, torch's ``torch.cuda.ExternalStream(stream_ptr)``.
    Work queued through it goes to that stream; it never destroys the stream. The same as
    ``Stream.from_external(handle, device)`` (a ``Stream``, with ``is_external`` True)."""
    return Stream.from_external(handle, device)


def zeros(shape, dtype="float32", device=None, order="C") -> DeviceBuffer:
    """Allocate a zeroed typed buffer (device memory is always handed out zeroed), in C or
    F (``order="F"``) order."""
    return empty(shape, dtype, device, order)


def synchronize(device=None, timeout=None) -> None:
    """Wait for every stream of ``device`` (all devices when None)."""
    if device is None:
        stream_synchronize(timeout)
    else:
        Device(device).synchronize(timeout)


def memory_allocated(device=None) -> int:
    """Bytes live allocations use on ``device`` (the current device when None), as
    ``torch.cuda.memory_allocated``: ``memory_stats(device)["allocated"]``."""
    return memory_stats(device)["allocated"]


def max_memory_allocated(device=None) -> int:
    """Peak of :func:`memory_allocated` since start or ``reset_peak_memory_stats``."""
    return memory_stats(device)["peak_allocated"]


def memory_reserved(device=None) -> int:
    """Bytes the allocator holds on ``device`` (live plus cached), as
    ``torch.cuda.memory_reserved``."""
    return memory_stats(device)["reserved"]


def max_memory_reserved(device=None) -> int:
    """Peak of :func:`memory_reserved` since start or ``reset_peak_memory_stats``."""
    return memory_stats(device)["peak_reserved"]


def mem_get_info(device=None) -> tuple[int, int]:
    """``(free, total)`` bytes of ``device`` (the current device when None), as
    ``cudaMemGetInfo`` / ``torch.cuda.mem_get_info``: cached blocks count as used."""
    stats = memory_stats(device)
    return stats["free"], stats["total"]


def get_device_name(device=None) -> str:
    """The name of ``device`` (the current device when None), as
    ``torch.cuda.get_device_name``; it always says the device is virtual."""
    return get_device_properties(get_device() if device is None else device).name


def UserEvent() -> Event:  # noqa: N802 - the OpenCL class name, kept for ported code
    """A user event (OpenCL's ``UserEvent``): pending until ``set()`` / ``set_status()``;
    streams can wait on it. Same as :meth:`Event.user`."""
    return Event.user()


def memcpy_host_to_device_async(dst, src, stream, **kw) -> None:
    """Stream-ordered host-to-device copy queued on ``stream``: pinned ``src`` (``malloc_host``,
    ``pinned_empty``) is read when the copy runs; other host memory is staged at once."""
    memcpy_host_to_device(dst, src, stream, **kw)


def memcpy_device_to_host_async(dst, src, stream, **kw) -> None:
    """Stream-ordered device-to-host copy: a pinned ``dst`` (``malloc_host``, ``pinned_empty``)
    is written when ``stream`` reaches it; into pageable memory the call returns once the copy
    is complete (CUDA's rule)."""
    memcpy_device_to_host(dst, src, stream, **kw)


def memcpy_d2d_async(dst, src, stream, **kw) -> None:
    """Stream-ordered device-to-device copy."""
    memcpy_d2d(dst, src, stream, **kw)


def memset_async(buf, value, stream, **kw) -> None:
    """Stream-ordered memset."""
    memset(buf, value, stream=stream, **kw)


# At exit: shutdown(), or, on Ctrl-C while it waits for queued work, abandon that work.
_atexit.register(_shutdown_at_exit)


def __getattr__(name: str):
    # runtime.acl (pyACL's face) is imported on first use, so `import runtime` stays lean.
    if name == "acl":
        import importlib

        return importlib.import_module(".acl", __name__)
    raise AttributeError(f"module 'runtime' has no attribute {name!r}")


__all__ = [
    "MAX_QUEUED",
    "ExternalStream",
    "comm",
    "ComputeInfo",
    "Device",
    "DeviceBuffer",
    "DeviceProperties",
    "Error",
    "Event",
    "Graph",
    "InvalidDeviceError",
    "InvalidHandleError",
    "InvalidOperationError",
    "Kernel",
    "KernelError",
    "MemoryInfo",
    "NotInitializedError",
    "NotReadyError",
    "OutOfMemoryError",
    "Stream",
    "UserEvent",
    "WaitTimeoutError",
    "__version__",
    "acl",
    "current_stream",
    "default_stream",
    "defer_cleanup",
    "device_free",
    "device_malloc",
    "empty",
    "empty_cache",
    "get_available_devices",
    "get_device",
    "get_device_compute_info",
    "get_device_count",
    "get_device_memory_info",
    "get_device_name",
    "get_device_properties",
    "get_option",
    "init",
    "is_current_stream_capturing",
    "ipc_open",
    "is_initialized",
    "kernels",
    "memcpy_d2d",
    "memcpy_d2d_async",
    "memcpy_device_to_host",
    "memcpy_device_to_host_async",
    "memcpy_host_to_device",
    "memcpy_host_to_device_async",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "memory_summary",
    "memset",
    "memset_async",
    "option_names",
    "profile",
    "reset_peak_memory_stats",
    "set_device",
    "set_option",
    "set_stream",
    "shutdown",
    "stream_priority_range",
    "stream_synchronize",
    "synchronize",
    "to_device",
    "zeros",
    # Memory fraction, pinned and managed memory, 2-D copies.
    "PinnedArray",
    "PinnedMemory",
    "PinnedMemoryPointer",
    "alloc_pinned_memory",
    "free_host",
    "get_per_process_memory_fraction",
    "host_register",
    "host_unregister",
    "host_is_registered",
    "pinned",
    "host_empty_cache",
    "host_memory_stats",
    "malloc_host",
    "malloc_managed",
    "mem_advise",
    "mem_range_attributes",
    "memcpy_2d",
    "pinned_empty",
    "zeros_pinned",
    "empty_like_pinned",
    "zeros_like_pinned",
    "prefetch",
    "set_per_process_memory_fraction",
]

# Custom operators: multi-block launches and native kernels (runtime/kernel.h).
__all__ += [
    "MAX_BLOCK_DIM",
    "get_block_idx",
    "get_block_num",
    "get_include",
]

# Memory pool and pluggable allocation.
__all__ += [
    "MemoryPool",
    "get_allocator",
    "get_default_memory_pool",
    "set_allocator",
    "using_allocator",
]

# Stream-ordered allocation.
__all__ += [
    "MemoryAsyncPool",
    "free_async",
    "malloc_async",
]
