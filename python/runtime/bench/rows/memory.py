"""Memory rows: allocate / free 1 MiB, first touch, and the blocking copies (H2D, D2H, D2D)."""

from __future__ import annotations

import functools

import numpy as np

import runtime as rt

from ..config import ASCEND910_US, Config, MiB, NotApplicable
from ..timing import timed_calls, timed_create, timed_destroy
from .base import Row, _na


def alloc_rows(cfg: Config) -> list[Row]:
    """Row 3 of the Ascend 910 reference table and its companions: alloc 1 MiB zeroed, free, first write."""
    k = cfg.batch
    n1 = MiB
    rows: list[Row] = []

    def rt_alloc(ctx):
        return timed_create(functools.partial(rt.device_malloc, 0, n1), k, destroy=rt.device_free)

    def np_alloc(ctx):
        return timed_create(functools.partial(np.zeros, n1, np.uint8), k)

    def cl_alloc(ctx):
        p = ctx.peers
        cl, q = p.cl, p.cl_q
        zero = np.uint8(0)

        def make():
            b = cl.Buffer(p.cl_ctx, cl.mem_flags.READ_WRITE, n1)
            cl.enqueue_fill_buffer(q, b, zero, 0, n1)
            return b

        return timed_create(make, k, destroy=lambda b: b.release(), finish=q.finish)

    def torch_alloc(ctx):
        t = ctx.peers.torch
        return timed_create(functools.partial(t.zeros, n1, dtype=t.uint8), k)

    def py_alloc(ctx):
        return timed_create(functools.partial(bytearray, n1), k)

    rows.append(
        Row(
            "alloc_1m",
            "alloc 1 MiB zeroed",
            {
                "runtime": rt_alloc,
                "numpy": np_alloc,
                "pyopencl": cl_alloc,
                "torch": torch_alloc,
                "stdlib": py_alloc,
            },
            ascend910_us=ASCEND910_US["alloc 1 MiB"],
            note="device_malloc(0, 1 MiB) | np.zeros | cl.Buffer + enqueue_fill_buffer(0) (+ finish per batch) | torch.zeros | bytearray",
        )
    )

    def rt_free(ctx):
        return timed_destroy(functools.partial(rt.device_malloc, 0, n1), k, destroy=rt.device_free)

    def np_free(ctx):
        return timed_destroy(functools.partial(np.zeros, n1, np.uint8), k)

    def cl_free(ctx):
        p = ctx.peers
        cl = p.cl

        def make():
            b = cl.Buffer(p.cl_ctx, cl.mem_flags.READ_WRITE, n1)
            cl.enqueue_fill_buffer(p.cl_q, b, np.uint8(0), 0, n1).wait()
            return b

        return timed_destroy(make, k, destroy=lambda b: b.release())

    def torch_free(ctx):
        t = ctx.peers.torch
        return timed_destroy(functools.partial(t.zeros, n1, dtype=t.uint8), k)

    def py_free(ctx):
        return timed_destroy(functools.partial(bytearray, n1), k)

    rows.append(
        Row(
            "free_1m",
            "free 1 MiB",
            {
                "runtime": rt_free,
                "numpy": np_free,
                "pyopencl": cl_free,
                "torch": torch_free,
                "stdlib": py_free,
            },
            note="device_free(buf) + drop the handle | drop the last reference | Buffer.release()",
        )
    )

    def rt_alloc_touch(ctx):
        def make():
            b = rt.device_malloc(0, n1)
            rt.memset(b, 1)
            return b

        return timed_create(make, k, destroy=rt.device_free)

    def np_alloc_touch(ctx):
        def make():
            a = np.zeros(n1, np.uint8)
            a.fill(1)
            return a

        return timed_create(make, k)

    def cl_alloc_touch(ctx):
        p = ctx.peers
        cl, q = p.cl, p.cl_q
        one = np.uint8(1)

        def make():
            b = cl.Buffer(p.cl_ctx, cl.mem_flags.READ_WRITE, n1)
            cl.enqueue_fill_buffer(q, b, one, 0, n1)
            return b

        return timed_create(make, k, destroy=lambda b: b.release(), finish=q.finish)

    def torch_alloc_touch(ctx):
        t = ctx.peers.torch

        def make():
            x = t.zeros(n1, dtype=t.uint8)
            x.fill_(1)
            return x

        return timed_create(make, k)

    rows.append(
        Row(
            "alloc_touch_1m",
            "alloc 1 MiB zeroed + first write",
            {
                "runtime": rt_alloc_touch,
                "numpy": np_alloc_touch,
                "pyopencl": cl_alloc_touch,
                "torch": torch_alloc_touch,
                "stdlib": _na("no byte-fill on bytearray without a second buffer"),
            },
            note="row 3 then fill every byte with 1 (runtime.memset | a.fill | enqueue_fill_buffer | fill_): shows lazily-zeroed pages' first-touch cost",
        )
    )
    return rows


def copy_rows(cfg: Config) -> list[Row]:
    """Row 4 of the Ascend 910 reference table: blocking copies in each direction at 1 MiB and ``cfg.big``."""
    k = cfg.batch
    rows: list[Row] = []

    for size, label in ((MiB, "1 MiB"), (cfg.big, f"{cfg.big // MiB} MiB")):
        kk = k if size <= MiB else 1
        reps = None if size <= MiB else cfg.big_reps
        ref = ASCEND910_US["memcpy per MiB"] * size / MiB
        for direction in ("H2D", "D2H", "D2D"):
            rows.append(
                Row(
                    f"copy_{direction.lower()}_{size // MiB}m",
                    f"memcpy {direction} {label}",
                    _copy_impls(direction, size, kk),
                    ascend910_us=ref,
                    nbytes=size,
                    reps=reps,
                    note="blocking: memcpy_host_to_device / memcpy_device_to_host / memcpy_d2d | np.copyto | cl.enqueue_copy(is_blocking) / .wait() | Tensor.copy_ | memoryview slice assignment",
                )
            )
    return rows


def _copy_impls(direction, size, k):
    def host_pair():
        src = np.ones(size, np.uint8)
        dst = np.zeros(size, np.uint8)
        dst.fill(2)
        return src, dst

    def rt_impl(ctx):
        h_src, h_dst = host_pair()
        d1 = rt.device_malloc(0, size)
        d2 = rt.device_malloc(0, size)
        ctx.defer(lambda: (rt.device_free(d1), rt.device_free(d2)))
        rt.memset(d1, 3)
        rt.memset(d2, 4)
        if direction == "H2D":
            call = functools.partial(rt.memcpy_host_to_device, d1, h_src)
        elif direction == "D2H":
            call = functools.partial(rt.memcpy_device_to_host, h_dst, d1)
        else:
            call = functools.partial(rt.memcpy_d2d, d2, d1)
        return timed_calls(call, k)

    def np_impl(ctx):
        src, dst = host_pair()
        return timed_calls(functools.partial(np.copyto, dst, src), k)

    def cl_impl(ctx):
        p = ctx.peers
        cl, q = p.cl, p.cl_q
        h_src, h_dst = host_pair()
        d1 = cl.Buffer(p.cl_ctx, cl.mem_flags.READ_WRITE, size)
        d2 = cl.Buffer(p.cl_ctx, cl.mem_flags.READ_WRITE, size)
        cl.enqueue_fill_buffer(q, d1, np.uint8(3), 0, size)
        cl.enqueue_fill_buffer(q, d2, np.uint8(4), 0, size)
        q.finish()
        ctx.defer(lambda: (d1.release(), d2.release()))
        if direction == "H2D":
            call = functools.partial(cl.enqueue_copy, q, d1, h_src, is_blocking=True)
        elif direction == "D2H":
            call = functools.partial(cl.enqueue_copy, q, h_dst, d1, is_blocking=True)
        else:

            def call():
                cl.enqueue_copy(q, d2, d1).wait()

        return timed_calls(call, k)

    def torch_impl(ctx):
        t = ctx.peers.torch
        src = t.ones(size, dtype=t.uint8)
        dst = t.full((size,), 2, dtype=t.uint8)
        return timed_calls(functools.partial(dst.copy_, src), k)

    def py_impl(ctx):
        src = memoryview(bytearray(b"\x01") * size)
        dst = memoryview(bytearray(b"\x02") * size)

        def call():
            dst[:] = src

        return timed_calls(call, k)

    return {
        "runtime": rt_impl,
        "numpy": np_impl,
        "pyopencl": cl_impl,
        "torch": torch_impl,
        "stdlib": py_impl,
    }


def async_copy_rows(cfg: Config) -> list[Row]:
    """Stream-ordered H2D of ``cfg.big`` bytes from pinned and from pageable host memory: the
    call plus the wait for the copy. From pinned memory the queued command reads the source
    when it runs (one copy); from pageable memory the call stages the bytes first (CUDA's
    rule: it returns once the source may be reused), so it copies twice."""
    size = cfg.big
    label = f"{size // MiB} MiB"
    rows: list[Row] = []
    for pinned in (True, False):
        kind = "pinned" if pinned else "pageable"

        def rt_impl(ctx, pinned=pinned):
            s = _rt_stream(ctx)
            if pinned:
                src = rt.pinned_empty(size, np.uint8)
                src.fill(1)
            else:
                src = np.ones(size, np.uint8)
            d = rt.device_malloc(0, size)
            ctx.defer(lambda: rt.device_free(d))
            rt.memset(d, 3)

            def call():
                rt.memcpy_host_to_device(d, src, s)
                s.synchronize()

            return timed_calls(call, 1)

        def torch_impl(ctx, pinned=pinned):
            t = ctx.peers.torch
            src = t.ones(size, dtype=t.uint8)
            if pinned:
                try:  # pinning needs a CUDA device: torch refuses on a host without one
                    src = src.pin_memory()
                except RuntimeError as e:
                    raise NotApplicable(f"Tensor.pin_memory(): {str(e).split('.')[0]}") from e
            dst = t.full((size,), 3, dtype=t.uint8)

            def call():
                dst.copy_(src, non_blocking=True)

            return timed_calls(call, 1)

        rows.append(
            Row(
                f"copy_async_h2d_{kind}_{size // MiB}m",
                f"memcpy H2D {label} queued, {kind} source",
                {
                    "runtime": rt_impl,
                    "numpy": _na("numpy has no streams or queued copies"),
                    "pyopencl": _na("not measured in this row"),
                    "torch": torch_impl,
                    "stdlib": _na("no queued copies"),
                },
                nbytes=size,
                reps=cfg.big_reps,
                note=(
                    "runtime: memcpy_host_to_device(d, src, stream) + stream.synchronize(), src from "
                    "pinned_empty | np.ones | torch: dst.copy_(src[.pin_memory()], non_blocking=True)"
                ),
            )
        )
    return rows


def _rt_stream(ctx):
    s = rt.Stream()
    ctx.defer(s.destroy)
    return s
