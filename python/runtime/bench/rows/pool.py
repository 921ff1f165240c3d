"""Pool rows: allocate + free 4 KiB through the built-in pool, and through a plugged Python
allocator (``set_allocator``), one that takes every block from the pool and one that caches
freed blocks itself (CuPy's pattern of a user allocator returning pool memory)."""

from __future__ import annotations

import functools

import numpy as np

import runtime as rt

from ..config import Config
from ..timing import timed_calls
from .base import Row, _na

N = 4096

NO_PLUG = (
    "cupy.cuda.set_allocator and torch's CUDAPluggableAllocator plug into CUDA device memory; "
    "with no CUDA device here there is nothing to plug into"
)


def _cycle():
    rt.device_free(rt.device_malloc(0, N))


def _plugged(ctx, alloc, free, k):
    """Samples of ``k`` cycles with ``alloc``/``free`` plugged in: plugged for each sample and
    unplugged after it, outside the timing, so that the pool rows can be sampled in turn."""
    timed = timed_calls(_cycle, k)
    ctx.defer(lambda: rt.set_allocator(None))

    def fn():
        rt.set_allocator(alloc, free)
        try:
            return timed()
        finally:
            rt.set_allocator(None)

    return fn


def pool_rows(cfg: Config) -> list[Row]:
    k = cfg.batch

    def builtin(ctx):
        rt.set_allocator(None)
        return timed_calls(_cycle, k)

    def passthrough(ctx):
        pool = rt.get_default_memory_pool(0)

        def alloc(nbytes, device, stream):
            return pool.malloc(nbytes)

        def free(buf, nbytes, device):
            pass

        return _plugged(ctx, alloc, free, k)

    def caching(ctx):
        pool = rt.get_default_memory_pool(0)
        cache: dict[int, list] = {}

        def alloc(nbytes, device, stream):
            free_list = cache.get(nbytes)
            return free_list.pop() if free_list else pool.malloc(nbytes)

        def free(buf, nbytes, device):
            cache.setdefault(nbytes, []).append(buf)

        ctx.defer(cache.clear)
        return _plugged(ctx, alloc, free, k)

    def np_cycle(ctx):
        return timed_calls(functools.partial(np.zeros, N, np.uint8), k)

    def torch_cycle(ctx):
        t = ctx.peers.torch
        return timed_calls(functools.partial(t.zeros, N, dtype=t.uint8), k)

    def py_cycle(ctx):
        return timed_calls(functools.partial(bytearray, N), k)

    cpu_peers = {
        "numpy": np_cycle,
        "pyopencl": _na("no allocator to plug or pool to query: cl.Buffer is the driver's"),
        "torch": torch_cycle,
        "stdlib": py_cycle,
    }
    plug_peers = {p: _na(NO_PLUG) for p in ("numpy", "pyopencl", "torch", "stdlib")}
    return [
        Row(
            "pool_alloc_4k",
            "alloc + free 4 KiB, built-in pool",
            {"runtime": builtin, **cpu_peers},
            note="device_free(device_malloc(0, 4 KiB)) | np.zeros | n/a | torch.zeros | bytearray",
            group="pool",
        ),
        Row(
            "plugged_alloc_4k",
            "alloc + free 4 KiB, plugged Python allocator (pool.malloc per call)",
            {"runtime": passthrough, **plug_peers},
            note="set_allocator(alloc -> pool.malloc(n), free -> pass), then the cycle above",
            group="pool",
        ),
        Row(
            "plugged_cache_4k",
            "alloc + free 4 KiB, plugged caching Python allocator",
            {"runtime": caching, **plug_peers},
            note="set_allocator(alloc -> free list or pool.malloc, free -> free list), then the cycle above",
            group="pool",
        ),
    ]
