"""Operator rows: the built-in kernels at the machine's speed (``add`` and ``matmul`` beside
numpy and torch), a numba ``@cfunc`` kernel at ``block_dim`` 1, 2 and 8, and the amortised
no-op launch with batching off (the ``launch_amortised`` row runs with it on, the default).

Every runtime cell launches and synchronizes per operation, so a kernel row is the whole
cost a caller sees (launch, the blocks on the workers, the wait); numpy and torch run the
same operation on the calling thread into a preallocated output.
"""

from __future__ import annotations

import functools

import numpy as np

import runtime as rt

from ..config import Config, NotApplicable
from ..timing import timed_amortised, timed_calls
from .base import NO_STREAMS_NUMPY, TORCH_NO_QUEUES, Row, _na, _stream

#: ``add`` sizes (float32 elements) and ``matmul`` sizes (square, float32).
ADD_SIZES = (16, 20, 24)
MATMUL_SIZES = (256, 1024)
QUICK_ADD_SIZES = (16, 20)
QUICK_MATMUL_SIZES = (256,)

NO_KERNELS_CL = "the PoCL peer times only the executor rows"
NO_KERNELS_STDLIB = "the stdlib peer has no kernels"


def _ops_per_sample(nbytes: int) -> int:
    """Operations per timed sample: about 4 MiB of data touched, 1 to 64 operations."""
    return max(1, min(64, (4 << 20) // max(nbytes, 1)))


def _data(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def _np_add(ctx, n: int, k: int):
    """The numpy peer of the add rows: ``k`` calls of ``np.add(a, b, out=out)`` on ``n`` floats."""
    a, b, out = _data(n, 1), _data(n, 2), np.empty(n, np.float32)
    return timed_calls(functools.partial(np.add, a, b, out=out), k)


def _torch_add(ctx, n: int, k: int):
    """The torch peer of the add rows: ``k`` calls of ``torch.add(a, b, out=out)``."""
    t = ctx.peers.torch
    a, b = t.from_numpy(_data(n, 1)), t.from_numpy(_data(n, 2))
    out = t.empty(n, dtype=t.float32)
    return timed_calls(functools.partial(t.add, a, b, out=out), k)


def _rt_add(ctx, n: int, k: int, block_dim: int | None = None):
    """The runtime cell of the add rows: ``k`` calls of ``kernels.add`` on ``n`` floats, each
    followed by ``synchronize`` (``block_dim`` None: the kernel chooses), checked once
    against numpy."""
    s = _stream(ctx)
    a, b = rt.to_device(_data(n, 1)), rt.to_device(_data(n, 2))
    out = rt.empty(n, "float32")
    add, sync = rt.kernels.add, s.synchronize

    def call():
        add(out, a, b, stream=s, block_dim=block_dim)
        sync()

    call()
    if not np.array_equal(out.copy_to_host(), _data(n, 1) + _data(n, 2)):
        raise RuntimeError("kernels.add differs from numpy")
    return timed_calls(call, k)


def kernel_rows(cfg: Config) -> list[Row]:
    """``add`` at 2^16 / 2^20 / 2^24 and ``matmul`` at 256^2 / 1024^2, float32."""
    rows: list[Row] = []
    for p in QUICK_ADD_SIZES if cfg.quick else ADD_SIZES:
        n = 1 << p
        k = _ops_per_sample(3 * 4 * n)

        rows.append(
            Row(
                f"add_2p{p}",
                f"add 2^{p} float32 (+ synchronize)",
                {
                    "runtime": functools.partial(_rt_add, n=n, k=k),
                    "numpy": functools.partial(_np_add, n=n, k=k),
                    "pyopencl": _na(NO_KERNELS_CL),
                    "torch": functools.partial(_torch_add, n=n, k=k),
                    "stdlib": _na(NO_KERNELS_STDLIB),
                },
                nbytes=3 * 4 * n,
                reps=None if p < 24 else (10 if cfg.quick else 21),
                apart=("torch",),
                note="kernels.add(out, a, b, stream=s) + s.synchronize() (block_dim chosen by the "
                "kernel) | np.add(a, b, out=out) | torch.add(a, b, out=out) (sampled after the "
                "others: its OpenMP threads spin on after each call)",
            )
        )
    # An operator author's explicit block_dim on a small input: the blocks are shorter than
    # a wake-up, and the waiting thread runs the second one.
    n8, k8 = 1 << 16, _ops_per_sample(3 * 4 * (1 << 16))
    rows.append(
        Row(
            "add_2p16_block_dim8",
            "add 2^16 float32, block_dim=8 (+ synchronize)",
            {
                "runtime": functools.partial(_rt_add, n=n8, k=k8, block_dim=8),
                "numpy": functools.partial(_np_add, n=n8, k=k8),
                "pyopencl": _na(NO_KERNELS_CL),
                "torch": functools.partial(_torch_add, n=n8, k=k8),
                "stdlib": _na(NO_KERNELS_STDLIB),
            },
            nbytes=3 * 4 * n8,
            apart=("torch",),
            note="kernels.add(out, a, b, stream=s, block_dim=8) + s.synchronize() | "
            "np.add(a, b, out=out) | torch.add(a, b, out=out)",
        )
    )
    # Many adds queued before one synchronize: the stream runs behind the launching thread,
    # which then sleeps in synchronize while the backlog drains.
    nq, q = 1 << 16, (200 if cfg.quick else 2000)

    def rt_add_queued(ctx):
        s = _stream(ctx)
        a, b = rt.to_device(_data(nq, 1)), rt.to_device(_data(nq, 2))
        out = rt.empty(nq, "float32")
        add = rt.kernels.add
        return timed_amortised(lambda: add(out, a, b, stream=s), q, s.synchronize)

    rows.append(
        Row(
            "add_2p16_queued",
            f"add 2^16 float32, {q:,} queued + 1 synchronize (per add)",
            {
                "runtime": rt_add_queued,
                "numpy": functools.partial(_np_add, n=nq, k=q),
                "pyopencl": _na(NO_KERNELS_CL),
                "torch": functools.partial(_torch_add, n=nq, k=q),
                "stdlib": _na(NO_KERNELS_STDLIB),
            },
            reps=cfg.loop_reps,
            apart=("torch",),
            note=f"{q:,} x kernels.add(out, a, b, stream=s), then s.synchronize(), per add | "
            f"{q:,} x np.add(a, b, out=out) | {q:,} x torch.add(a, b, out=out)",
        )
    )
    for m in QUICK_MATMUL_SIZES if cfg.quick else MATMUL_SIZES:
        k = 8 if m <= 256 else 1

        def rt_mm(ctx, m=m, k=k):
            s = _stream(ctx)
            a = rt.to_device(_data(m * m, 3).reshape(m, m))
            b = rt.to_device(_data(m * m, 4).reshape(m, m))
            c = rt.empty((m, m), "float32")
            mm, sync = rt.kernels.matmul, s.synchronize

            def call():
                mm(c, a, b, stream=s)
                sync()

            call()
            want = _data(m * m, 3).reshape(m, m) @ _data(m * m, 4).reshape(m, m)
            if not np.allclose(c.copy_to_host(), want, rtol=1e-3, atol=1e-3):
                raise RuntimeError("kernels.matmul differs from numpy")
            return timed_calls(call, k)

        def np_mm(ctx, m=m, k=k):
            a = _data(m * m, 3).reshape(m, m)
            b = _data(m * m, 4).reshape(m, m)
            c = np.empty((m, m), np.float32)
            return timed_calls(functools.partial(np.matmul, a, b, out=c), k)

        def torch_mm(ctx, m=m, k=k):
            t = ctx.peers.torch
            a = t.from_numpy(_data(m * m, 3).reshape(m, m))
            b = t.from_numpy(_data(m * m, 4).reshape(m, m))
            c = t.empty((m, m), dtype=t.float32)
            return timed_calls(functools.partial(t.matmul, a, b, out=c), k)

        rows.append(
            Row(
                f"matmul_{m}",
                f"matmul {m}^2 float32 (+ synchronize)",
                {
                    "runtime": rt_mm,
                    "numpy": np_mm,
                    "pyopencl": _na(NO_KERNELS_CL),
                    "torch": torch_mm,
                    "stdlib": _na(NO_KERNELS_STDLIB),
                },
                reps=None if m <= 256 else (10 if cfg.quick else 21),
                apart=("torch",),
                note="kernels.matmul(c, a, b, stream=s) + s.synchronize() | np.matmul(a, b, "
                "out=c) (OpenBLAS) | torch.matmul(a, b, out=c) (sampled after the others)",
            )
        )
    return rows


NUMBA_N = 1 << 24
NUMBA_BLOCKS = (1, 2, 8)


@functools.lru_cache(maxsize=1)
def _numba_add_custom():
    """The numba ``@cfunc`` add_custom of ``examples/custom_operator.py`` as a Kernel, or the
    reason it cannot be made."""
    try:
        import numba
        from numba import carray, types
    except ImportError as e:
        return f"numba is not installed ({e}); pip install numba"

    @numba.cfunc(types.int32(types.uint32, types.uint32, types.CPointer(types.voidptr)))
    def add_custom(block_idx, block_num, params):
        total = carray(params[3], (1,), np.int64)[0]
        x = carray(params[0], (total,), np.float32)
        y = carray(params[1], (total,), np.float32)
        z = carray(params[2], (total,), np.float32)
        lo = total * block_idx // block_num
        hi = total * (block_idx + 1) // block_num
        xs, ys, zs = x[lo:hi], y[lo:hi], z[lo:hi]
        for i in range(zs.shape[0]):
            zs[i] = xs[i] + ys[i]
        return 0

    return rt.Kernel.from_cfunc(add_custom, nargs=4, read_only=(0, 1))


def numba_rows(cfg: Config) -> list[Row]:
    """A numba ``@cfunc`` add of 2^24 float32 at block_dim 1, 2 and 8 (one group: its cells
    are sampled in turns), numpy's np.add beside each."""
    if cfg.quick:
        return []
    n = NUMBA_N
    rows = []
    for blocks in NUMBA_BLOCKS:

        def rt_numba(ctx, blocks=blocks):
            k = _numba_add_custom()
            if isinstance(k, str):
                raise NotApplicable(k)
            s = _stream(ctx)
            x, y = rt.to_device(_data(n, 1)), rt.to_device(_data(n, 2))
            z = rt.empty(n, "float32")
            sync = s.synchronize

            def call():
                k(x, y, z, n, stream=s, block_dim=blocks)
                sync()

            call()
            if not np.array_equal(z.copy_to_host(), _data(n, 1) + _data(n, 2)):
                raise RuntimeError("the numba add_custom differs from numpy")
            return timed_calls(call, 1)

        def np_add(ctx):
            a, b, out = _data(n, 1), _data(n, 2), np.empty(n, np.float32)
            return timed_calls(functools.partial(np.add, a, b, out=out), 1)

        rows.append(
            Row(
                f"numba_add_b{blocks}",
                f"numba @cfunc add 2^24 float32, block_dim={blocks}",
                {
                    "runtime": rt_numba,
                    "numpy": np_add,
                    "pyopencl": _na(NO_KERNELS_CL),
                    "torch": _na("the row times a numba kernel launched by the runtime"),
                    "stdlib": _na(NO_KERNELS_STDLIB),
                },
                reps=21,
                group="numba_blocks",
                note="Kernel.from_cfunc(numba @cfunc add_custom)(x, y, z, n, block_dim=...) + "
                "synchronize | np.add(x, y, out=z)",
            )
        )
    return rows


def batching_rows(cfg: Config) -> list[Row]:
    """The amortised no-op launch with ``enableBatching`` off (set for each sample, restored
    after), for comparison with ``launch_amortised`` (on, the default)."""
    N = cfg.n_launch

    def rt_off(ctx):
        s = _stream(ctx)
        inner = timed_amortised(
            functools.partial(s.launch_kernel, rt.kernels.noop), N, s.synchronize
        )

        def fn():
            rt.set_option("enableBatching", False)
            try:
                return inner()
            finally:
                rt.set_option("enableBatching", True)

        return fn

    def cl_launch_amortised(ctx):
        p = ctx.peers
        q = p.cl.CommandQueue(p.cl_ctx, p.cl_dev)
        launch = functools.partial(p.cl.enqueue_nd_range_kernel, q, p.cl_noop, (1,), None)
        return timed_amortised(launch, N, q.finish)

    return [
        Row(
            "launch_amortised_unbatched",
            f"no-op launch, amortised over {N:,}, batching off",
            {
                "runtime": rt_off,
                "numpy": _na(NO_STREAMS_NUMPY),
                "pyopencl": cl_launch_amortised,
                "torch": _na(TORCH_NO_QUEUES),
                "stdlib": _na("the stdlib row is under the batched launch row"),
            },
            reps=cfg.loop_reps,
            note="as the amortised launch row, with set_option('enableBatching', False)",
        )
    ]
