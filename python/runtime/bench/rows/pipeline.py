"""Throughput rows: the copy -> compute -> copy pipeline and multi-stream matmul scaling."""

from __future__ import annotations

import functools
import hashlib
import os
from time import perf_counter_ns as _now

import numpy as np

import runtime as rt

from ..config import PEERS, Config, MiB
from .base import Row, _na, _stream, _tq


def pipeline_rows(cfg: Config) -> list[Row]:
    """A 2-stream H2D > scale > D2H pipeline, with the runtime's enablePipelining on and off."""
    rows: list[Row] = []

    C, CB = cfg.pipe_chunks, cfg.pipe_chunk
    pipe_title = f"pipeline {C}x{CB // MiB} MiB H2D>scale>D2H, 2 streams"
    for on in (True, False):
        impls: dict = {"runtime": functools.partial(_rt_pipeline, pipelining=on)}
        if on:
            impls.update(
                numpy=_np_pipeline,
                pyopencl=_cl_pipeline,
                torch=_na("not measured: the numpy and thread+queue columns cover host pipelines"),
                stdlib=_tq_pipeline,
            )
        else:
            reason = "peers are in the row above (the option is the runtime's)"
            impls.update({p: _na(reason) for p in PEERS})
        rows.append(
            Row(
                "pipeline_on" if on else "pipeline_off",
                f"{pipe_title}, pipelining {'on' if on else 'off'}",
                impls,
                nbytes=C * CB,
                reps=cfg.pipe_reps,
                group="pipeline",
                note="per whole pipeline; GB/s = input bytes / time | numpy: serial copyto/multiply/copyto | pyopencl: 2 in-order queues | stdlib: 2 worker threads running the numpy steps",
            )
        )
    return rows


def scaling_rows(cfg: Config) -> list[Row]:
    """matmul on 1..``cfg.mm_streams`` streams: weak scaling over streams."""
    rows: list[Row] = []

    for n in range(1, cfg.mm_streams + 1):
        rows.append(
            Row(
                f"matmul_streams_{n}",
                f"matmul {cfg.mm_n}^2 f32 x{cfg.mm_per_stream}/stream, {n} stream{'s' if n > 1 else ''}",
                {
                    "runtime": functools.partial(_rt_matmul, n=n),
                    "numpy": _na("not measured: numpy's matmul is OpenBLAS-threaded already"),
                    "pyopencl": _na("not measured: no BLAS in PyOpenCL"),
                    "torch": _na("not measured: torch CPU matmul is intra-op threaded"),
                    "stdlib": functools.partial(_tq_hash, n=n),
                },
                reps=cfg.mm_reps,
                group="scaling",
                references=("stdlib",),
                note="wall time / (streams x matmuls): weak scaling; each matmul one block "
                "(block_dim=1), so the streams, not the blocks of one launch, share the cores "
                "| stdlib (host reference, not "
                "the same work): hashlib.sha256 of 64 KiB in n worker threads (the GIL released), "
                "each pinned to its own CPU: how far this host's cores let n threads of native "
                "code scale right now",
            )
        )
    return rows


def _pipe_inputs(cfg):
    elems = cfg.pipe_chunk // 4
    rng = np.random.default_rng(0)
    hin = [rng.random(elems, dtype=np.float32) for _ in range(cfg.pipe_chunks)]
    hout = [np.zeros(elems, np.float32) for _ in range(cfg.pipe_chunks)]
    return elems, hin, hout


def _pipe_check(name, hin, hout):
    for a, b in zip(hin, hout):
        if not np.array_equal(b, a * np.float32(2)):
            raise RuntimeError(f"{name}: the pipeline's output is wrong")
        b.fill(0)


def _rt_pipeline(ctx, pipelining):
    cfg = ctx.cfg
    elems, hin, hout = _pipe_inputs(cfg)
    streams = [_stream(ctx), _stream(ctx)]
    din = [rt.empty(elems, "float32") for _ in streams]
    dout = [rt.empty(elems, "float32") for _ in streams]
    h2d, d2h, scale = rt.memcpy_host_to_device, rt.memcpy_device_to_host, rt.kernels.scale

    def run():
        for i in range(cfg.pipe_chunks):
            j = i & 1
            s = streams[j]
            h2d(din[j], hin[i], s)
            scale(dout[j], din[j], 2.0, stream=s)
            d2h(hout[i], dout[j], s)
        for s in streams:
            s.synchronize()

    prev = rt.get_option("enablePipelining")
    ctx.defer(lambda: rt.set_option("enablePipelining", True))

    def fn():
        rt.set_option("enablePipelining", pipelining)
        try:
            t0 = _now()
            run()
            return _now() - t0
        finally:
            rt.set_option("enablePipelining", prev)

    fn()
    _pipe_check(f"runtime (enablePipelining={pipelining})", hin, hout)
    return fn


def _np_pipeline(ctx):
    cfg = ctx.cfg
    elems, hin, hout = _pipe_inputs(cfg)
    din, dout = np.zeros(elems, np.float32), np.zeros(elems, np.float32)
    two = np.float32(2)

    def fn():
        t0 = _now()
        for i in range(cfg.pipe_chunks):
            np.copyto(din, hin[i])
            np.multiply(din, two, out=dout)
            np.copyto(hout[i], dout)
        return _now() - t0

    fn()
    _pipe_check("numpy", hin, hout)
    return fn


def _cl_pipeline(ctx):
    cfg = ctx.cfg
    p = ctx.peers
    cl = p.cl
    elems, hin, hout = _pipe_inputs(cfg)
    qs = [cl.CommandQueue(p.cl_ctx, p.cl_dev) for _ in range(2)]
    mf = cl.mem_flags.READ_WRITE
    din = [cl.Buffer(p.cl_ctx, mf, cfg.pipe_chunk) for _ in qs]
    dout = [cl.Buffer(p.cl_ctx, mf, cfg.pipe_chunk) for _ in qs]
    ctx.defer(lambda: [b.release() for b in din + dout])
    knl = cl.Kernel(p.cl_prg, "scale")
    two = np.float32(2)

    def fn():
        t0 = _now()
        for i in range(cfg.pipe_chunks):
            j = i & 1
            q = qs[j]
            cl.enqueue_copy(q, din[j], hin[i], is_blocking=False)
            knl.set_args(dout[j], din[j], two)
            cl.enqueue_nd_range_kernel(q, knl, (elems,), None)
            cl.enqueue_copy(q, hout[i], dout[j], is_blocking=False)
        for q in qs:
            q.finish()
        return _now() - t0

    fn()
    _pipe_check("pyopencl", hin, hout)
    return fn


def _tq_pipeline(ctx):
    cfg = ctx.cfg
    elems, hin, hout = _pipe_inputs(cfg)
    ws = [_tq(ctx), _tq(ctx)]
    din = [np.zeros(elems, np.float32) for _ in ws]
    dout = [np.zeros(elems, np.float32) for _ in ws]
    two = np.float32(2)

    def step(i, j):
        np.copyto(din[j], hin[i])
        np.multiply(din[j], two, out=dout[j])
        np.copyto(hout[i], dout[j])

    def fn():
        t0 = _now()
        for i in range(cfg.pipe_chunks):
            ws[i & 1].q.put(functools.partial(step, i, i & 1))
        for w in ws:
            w.q.join()
        return _now() - t0

    fn()
    _pipe_check("stdlib", hin, hout)
    return fn


def _mm_inputs(cfg, n):
    rng = np.random.default_rng(1)
    m = cfg.mm_n
    return [
        (rng.random((m, m), dtype=np.float32), rng.random((m, m), dtype=np.float32))
        for _ in range(n)
    ]


def _rt_matmul(ctx, n):
    cfg = ctx.cfg
    streams = [_stream(ctx) for _ in range(n)]
    ins = _mm_inputs(cfg, n)
    a = [rt.to_device(x) for x, _ in ins]
    b = [rt.to_device(y) for _, y in ins]
    c = [rt.empty((cfg.mm_n, cfg.mm_n), "float32") for _ in range(n)]
    mm = rt.kernels.matmul
    M = cfg.mm_per_stream

    def fn():
        t0 = _now()
        for _ in range(M):
            for i in range(n):
                mm(c[i], a[i], b[i], stream=streams[i], block_dim=1)
        for s in streams:
            s.synchronize()
        return (_now() - t0) / (n * M)

    fn()
    for i, (x, y) in enumerate(ins):
        if not np.allclose(c[i].copy_to_host(), x @ y, rtol=1e-4, atol=1e-3):
            raise RuntimeError("runtime matmul result differs from numpy")
    return fn


def _pin_thread(cpu: int) -> None:
    """Keep the calling thread on ``cpu``; where the OS refuses, leave it unpinned (an
    exception here would end the worker thread, and the row would wait for it for ever)."""
    try:
        os.sched_setaffinity(0, {cpu})
    except OSError:
        pass


def _tq_hash(ctx, n):
    """The host's own scaling: ``n`` worker threads hashing (native code, GIL released),
    each kept on its own CPU where the OS lets a thread choose (Linux): the reference is
    what the host's cores can do, not where the OS happens to wake two new threads (beside
    each other, in about a third of the rounds of five full runs, which read 1.0x then)."""
    cfg = ctx.cfg
    ws = [_tq(ctx) for _ in range(n)]
    if hasattr(os, "sched_getaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        for i, w in enumerate(ws):
            w.q.put(functools.partial(_pin_thread, cpus[i % len(cpus)]))
            w.q.join()
    data = [bytes(np.random.default_rng(i).integers(0, 256, 64 * 1024, np.uint8)) for i in range(n)]
    calls = [functools.partial(hashlib.sha256, d) for d in data]
    M = cfg.mm_per_stream

    def fn():
        t0 = _now()
        for _ in range(M):
            for i in range(n):
                ws[i].q.put(calls[i])
        for w in ws:
            w.q.join()
        return (_now() - t0) / (n * M)

    return fn
