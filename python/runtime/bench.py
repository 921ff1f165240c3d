"""The benchmark suite: ``python -m runtime bench``.

Measures the seed's performance table (stream create, event record, allocate 1 MB zeroed,
memcpy, synchronize an idle stream) and the executor rows (launch, Python-callable launch,
graph replay, a copy -> compute -> copy pipeline, multi-stream scaling) for ``runtime`` and,
side by side in the same process, for the peers that are installed:

* ``numpy``: ``np.zeros``, ``del``, ``np.copyto``, BLAS matmul;
* ``pyopencl``: PyOpenCL on PoCL's CPU device (queues, markers, buffers, a no-op kernel);
* ``torch``: torch on the CPU (``torch.zeros``, ``copy_``; torch's CPU streams and events are
  no-op placeholders, so those cells say n/a);
* ``stdlib``: ``bytearray`` / ``memoryview`` and a thread + ``queue.Queue`` executor written
  here (stream = worker thread, event record = a marker that sets a ``threading.Event``,
  launch = put a callable, synchronize = ``Queue.join``).

A missing peer is reported as missing, with its import error; nothing is ever estimated.
Every figure is the time of one operation in microseconds (lower is better): median and p90
over many repetitions after a warm-up, with the garbage collector disabled while timing and
``time.perf_counter_ns`` as the clock. Ratios are runtime / other, so < 1 means runtime is
faster. The issues' targets are checked and printed as PASS / MISS lines (reported, never
asserted).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import gc
import json
import math
import os
import platform
import queue
import sys
import threading
import time
from time import perf_counter_ns as _now

import numpy as np

import runtime as rt

SYSTEMS = ("runtime", "numpy", "pyopencl", "torch", "stdlib")
PEERS = SYSTEMS[1:]

MiB = 1 << 20

# The seed's figures (measured on Ascend 910), in microseconds. memcpy: 500 us per MiB.
SEED_US = {
    "stream create": 10.0,
    "event record": 1.0,
    "alloc 1 MiB": 100.0,
    "memcpy per MiB": 500.0,
    "sync idle": 1.0,
}

_OCL_SRC = """
__kernel void noop(void) {}
__kernel void scale(__global float *out, __global const float *x, const float alpha) {
    size_t i = get_global_id(0);
    out[i] = alpha * x[i];
}
"""


class NotApplicable(Exception):
    """The system has no equivalent of this row (the reason is shown)."""


# --------------------------------------------------------------------------------------
# configuration, peers, helpers


class Config:
    """Sizes and repetition counts; ``quick`` shrinks everything for a smoke run."""

    def __init__(self, quick: bool, reps: int | None = None):
        self.quick = quick
        self.reps = reps or (20 if quick else 300)  # latency rows
        self.warmup = 3 if quick else 30
        self.budget_s = 0.15 if quick else 2.0  # per latency cell, after the minimum reps
        self.min_reps = 5
        self.batch = 8  # ops per sample in latency rows
        self.big = (16 if quick else 64) * MiB  # the "large copy" size
        self.big_reps = 8 if quick else 40
        self.n_launch = 2000 if quick else 10_000  # native no-op launches per sample
        self.n_pylaunch = 500 if quick else 2000  # Python-callable launches per sample
        self.loop_reps = 4 if quick else 10  # samples of the N-launch rows
        self.graph_nodes = 100
        self.graph_replays = 20 if quick else 100  # replays per amortised sample
        self.pipe_chunks = 8
        self.pipe_chunk = (1 if quick else 4) * MiB
        self.pipe_reps = 5 if quick else 20
        self.mm_n = 128 if quick else 256
        self.mm_per_stream = 8 if quick else 32
        self.mm_streams = 4
        self.mm_reps = 3 if quick else 9


class ThreadQueueStream:
    """The stdlib peer: one worker thread draining a ``queue.Queue`` of callables."""

    def __init__(self):
        self.q: queue.Queue = queue.Queue()
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self):
        get, done = self.q.get, self.q.task_done
        while True:
            f = get()
            if f is None:
                done()
                return
            try:
                f()
            finally:
                done()

    def close(self):
        self.q.put(None)
        self.t.join()


class Peers:
    """Imports and sets up the peers; a failure marks the peer missing with its error."""

    def __init__(self, wanted):
        self.missing: dict[str, str] = {}
        self.versions: dict[str, str] = {"numpy": np.__version__}
        self.cl = self.torch = None
        self.info: dict[str, str] = {}
        if "pyopencl" in wanted:
            try:
                import pyopencl as cl

                dev = None
                for p in cl.get_platforms():
                    for d in p.get_devices():
                        if d.type & cl.device_type.CPU:
                            dev = d
                            break
                    if dev is not None:
                        break
                if dev is None:
                    raise RuntimeError(
                        "no OpenCL CPU device (is pocl-binary-distribution installed?)"
                    )
                self.cl = cl
                self.cl_dev = dev
                self.cl_ctx = cl.Context([dev])
                self.cl_q = cl.CommandQueue(self.cl_ctx, dev)
                self.cl_prg = cl.Program(self.cl_ctx, _OCL_SRC).build()
                self.cl_noop = cl.Kernel(self.cl_prg, "noop")
                self.versions["pyopencl"] = cl.VERSION_TEXT
                self.info["opencl_device"] = f"{dev.platform.version} / {dev.name.strip()}"
            except Exception as e:  # any failure: the peer is missing, with the reason
                self.cl = None
                self.missing["pyopencl"] = f"{type(e).__name__}: {e}"
        if "torch" in wanted:
            try:
                import torch

                self.torch = torch
                self.versions["torch"] = torch.__version__
                self.info["torch_threads"] = str(torch.get_num_threads())
            except Exception as e:
                self.missing["torch"] = f"{type(e).__name__}: {e}"


def _stats(vals):
    s = sorted(vals)
    n = len(s)
    med = s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
    p90 = s[min(n - 1, max(0, math.ceil(0.9 * n) - 1))]
    return med, p90


def timer_floor_ns() -> dict:
    """Cost of the clock itself and of one ``for`` iteration, for the noise notes."""
    gc.disable()
    try:
        d = [-_now() + _now() for _ in range(2000)]
        k = 100_000
        t0 = _now()
        for _ in range(k):
            pass
        loop = (_now() - t0) / k
    finally:
        gc.enable()
    return {"perf_counter_ns_pair": _stats(d)[0], "empty_loop_iteration": loop}


def machine_info(peers: Peers) -> dict:
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal"):
                    mem = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_bytes": mem,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "runtime": rt.__version__,
        "versions": dict(peers.versions),
        "peer_info": dict(peers.info),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "loadavg_start": _loadavg(),
    }


def _loadavg():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


# --------------------------------------------------------------------------------------
# generic sample makers: each returns a function that times one sample and returns ns per op


def timed_create(make, k, destroy=None, finish=None):
    """Time ``k`` calls of ``make()`` (plus ``finish()``), then destroy outside the timing."""

    def fn():
        out = [None] * k
        t0 = _now()
        for i in range(k):
            out[i] = make()
        if finish is not None:
            finish()
        t = _now() - t0
        if destroy is not None:
            for o in out:
                destroy(o)
        return t / k

    return fn


def timed_destroy(make, k, destroy=None):
    """Make ``k`` objects outside the timing, then time freeing them (``destroy(o)`` and
    dropping the last reference)."""

    def fn():
        objs = [make() for _ in range(k)]
        if destroy is None:
            t0 = _now()
            for i in range(k):
                objs[i] = None
            t = _now() - t0
        else:
            t0 = _now()
            for i in range(k):
                destroy(objs[i])
                objs[i] = None
            t = _now() - t0
        return t / k

    return fn


def timed_calls(call, k, after=None):
    """Time ``k`` calls of ``call()``; ``after()`` runs outside the timing."""

    def fn():
        t0 = _now()
        for _ in range(k):
            call()
        t = _now() - t0
        if after is not None:
            after()
        return t / k

    return fn


def timed_amortised(launch, n, sync):
    """``n`` calls of ``launch()`` then one ``sync()``: per-launch time, plus the enqueue-only
    part and the final synchronize."""

    def fn():
        t0 = _now()
        for _ in range(n):
            launch()
        t1 = _now()
        sync()
        t2 = _now()
        return {"t": (t2 - t0) / n, "enqueue": (t1 - t0) / n, "final_sync": t2 - t1}

    return fn


# --------------------------------------------------------------------------------------
# rows


class Row:
    """One benchmark row: ``impls[system](ctx) -> sample function``."""

    def __init__(
        self, key, title, impls, *, seed_us=None, nbytes=None, reps=None, note="", group=None
    ):
        self.key = key
        self.title = title
        self.impls = impls
        self.seed_us = seed_us
        self.nbytes = nbytes
        self.reps = reps
        self.note = note
        self.group = group


class Ctx:
    """What the implementations need; cleanups run when the row is done."""

    def __init__(self, cfg: Config, peers: Peers):
        self.cfg = cfg
        self.peers = peers
        self._cleanups: list = []

    def defer(self, f):
        self._cleanups.append(f)

    def close(self):
        while self._cleanups:
            f = self._cleanups.pop()
            try:
                f()
            except Exception as e:  # cleanup must not hide the measurement
                print(f"bench: cleanup failed: {type(e).__name__}: {e}", file=sys.stderr)


def _na(reason):
    def impl(ctx):
        raise NotApplicable(reason)

    return impl


def _stream(ctx):
    s = rt.Stream()
    ctx.defer(s.destroy)
    return s


def _tq(ctx):
    w = ThreadQueueStream()
    ctx.defer(w.close)
    return w


def _nothing():
    pass


TORCH_NO_QUEUES = (
    "torch CPU ops run synchronously on the caller; torch.cpu.Stream/Event/synchronize are "
    "no-op placeholders for device-agnostic code"
)
TORCH_NO_EVENTS = (
    "torch.Event(device='cpu').record() raises 'cpu backend doesn't support events'; "
    "torch.cpu.Event.record is a no-op placeholder"
)
NO_STREAMS_NUMPY = "numpy has no streams or queues"


def rows_for(cfg: Config) -> list[Row]:
    k = cfg.batch
    rows: list[Row] = []

    # 1 stream create -------------------------------------------------------------
    def rt_stream_create(ctx):
        return timed_create(rt.Stream, k, destroy=lambda s: s.destroy())

    def cl_queue_create(ctx):
        p = ctx.peers
        return timed_create(functools.partial(p.cl.CommandQueue, p.cl_ctx, p.cl_dev), k)

    def tq_create(ctx):
        return timed_create(ThreadQueueStream, k, destroy=ThreadQueueStream.close)

    rows.append(
        Row(
            "stream_create",
            "stream create",
            {
                "runtime": rt_stream_create,
                "numpy": _na(NO_STREAMS_NUMPY),
                "pyopencl": cl_queue_create,
                "torch": _na(TORCH_NO_QUEUES),
                "stdlib": tq_create,
            },
            seed_us=SEED_US["stream create"],
            note="runtime.Stream() | cl.CommandQueue(ctx, dev) | start a worker thread with a queue.Queue",
        )
    )

    # 2 event record --------------------------------------------------------------
    # One record on each of k idle streams per sample: every record finds its stream idle
    # (the seed's case), and the timer's own cost is spread over k records.
    def rt_record(ctx):
        ss = [_stream(ctx) for _ in range(k)]
        evs = [rt.Event() for _ in range(k)]
        pairs = list(zip(evs, ss))

        def fn():
            t0 = _now()
            for e, s in pairs:
                e.record(s)
            t = _now() - t0
            for s in ss:
                s.synchronize()
            return t / k

        return fn

    def cl_marker(ctx):
        p = ctx.peers
        qs = [p.cl.CommandQueue(p.cl_ctx, p.cl_dev) for _ in range(k)]
        marker = p.cl.enqueue_marker

        def fn():
            t0 = _now()
            for q in qs:
                marker(q)
            t = _now() - t0
            for q in qs:
                q.finish()
            return t / k

        return fn

    def tq_record(ctx):
        ws = [_tq(ctx) for _ in range(k)]
        evs = [threading.Event() for _ in range(k)]
        puts = [functools.partial(w.q.put, e.set) for w, e in zip(ws, evs)]

        def fn():
            t0 = _now()
            for put in puts:
                put()
            t = _now() - t0
            for w in ws:
                w.q.join()
            for e in evs:
                e.clear()
            return t / k

        return fn

    rows.append(
        Row(
            "event_record",
            "event record",
            {
                "runtime": rt_record,
                "numpy": _na(NO_STREAMS_NUMPY),
                "pyopencl": cl_marker,
                "torch": _na(TORCH_NO_EVENTS),
                "stdlib": tq_record,
            },
            seed_us=SEED_US["event record"],
            note="one record on each of 8 idle streams: Event.record(stream), timing enabled | cl.enqueue_marker(q) | q.put(event.set)",
        )
    )

    # 3 alloc / free 1 MiB ----------------------------------------------------------
    n1 = MiB

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
            seed_us=SEED_US["alloc 1 MiB"],
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

    # 4 copies ----------------------------------------------------------------------
    for size, label in ((MiB, "1 MiB"), (cfg.big, f"{cfg.big // MiB} MiB")):
        kk = k if size <= MiB else 1
        reps = None if size <= MiB else cfg.big_reps
        seed = SEED_US["memcpy per MiB"] * size / MiB
        for direction in ("H2D", "D2H", "D2D"):
            rows.append(
                Row(
                    f"copy_{direction.lower()}_{size // MiB}m",
                    f"memcpy {direction} {label}",
                    _copy_impls(direction, size, kk),
                    seed_us=seed,
                    nbytes=size,
                    reps=reps,
                    note="blocking: memcpy_host_to_device / memcpy_device_to_host / memcpy_d2d | np.copyto | cl.enqueue_copy(is_blocking) / .wait() | Tensor.copy_ | memoryview slice assignment",
                )
            )

    # 5 synchronize idle -------------------------------------------------------------
    def rt_sync_idle(ctx):
        s = _stream(ctx)
        s.synchronize()
        return timed_calls(s.synchronize, k * 4)

    def cl_finish_idle(ctx):
        p = ctx.peers
        q = p.cl.CommandQueue(p.cl_ctx, p.cl_dev)
        q.finish()
        return timed_calls(q.finish, k * 4)

    def tq_join_idle(ctx):
        w = _tq(ctx)
        return timed_calls(w.q.join, k * 4)

    rows.append(
        Row(
            "sync_idle",
            "synchronize idle stream",
            {
                "runtime": rt_sync_idle,
                "numpy": _na(NO_STREAMS_NUMPY),
                "pyopencl": cl_finish_idle,
                "torch": _na(TORCH_NO_QUEUES),
                "stdlib": tq_join_idle,
            },
            seed_us=SEED_US["sync idle"],
            note="Stream.synchronize() | CommandQueue.finish() | Queue.join(), all on an idle queue",
        )
    )

    # 6 no-op launch, amortised --------------------------------------------------------
    N = cfg.n_launch

    def rt_launch_amortised(ctx):
        s = _stream(ctx)
        return timed_amortised(
            functools.partial(s.launch_kernel, rt.kernels.noop), N, s.synchronize
        )

    def cl_launch_amortised(ctx):
        p = ctx.peers
        q = p.cl.CommandQueue(p.cl_ctx, p.cl_dev)
        launch = functools.partial(p.cl.enqueue_nd_range_kernel, q, p.cl_noop, (1,), None)
        return timed_amortised(launch, N, q.finish)

    def tq_launch_amortised(ctx):
        w = _tq(ctx)
        return timed_amortised(functools.partial(w.q.put, _nothing), N, w.q.join)

    rows.append(
        Row(
            "launch_amortised",
            f"no-op launch, amortised over {N:,}",
            {
                "runtime": rt_launch_amortised,
                "numpy": _na(NO_STREAMS_NUMPY),
                "pyopencl": cl_launch_amortised,
                "torch": _na(TORCH_NO_QUEUES),
                "stdlib": tq_launch_amortised,
            },
            reps=cfg.loop_reps,
            note="(N launches + 1 synchronize) / N: stream.launch_kernel(kernels.noop) | enqueue_nd_range_kernel(noop, (1,)) + finish | q.put(noop callable) + join",
        )
    )

    # 7 launch + sync round trip -------------------------------------------------------
    def rt_launch_sync(ctx):
        s = _stream(ctx)
        launch, sync, noop = s.launch_kernel, s.synchronize, rt.kernels.noop

        def call():
            launch(noop)
            sync()

        return timed_calls(call, 4)

    def cl_launch_sync(ctx):
        p = ctx.peers
        q = p.cl.CommandQueue(p.cl_ctx, p.cl_dev)
        enq, knl, finish = p.cl.enqueue_nd_range_kernel, p.cl_noop, q.finish

        def call():
            enq(q, knl, (1,), None)
            finish()

        return timed_calls(call, 4)

    def tq_launch_sync(ctx):
        w = _tq(ctx)
        put, join = w.q.put, w.q.join

        def call():
            put(_nothing)
            join()

        return timed_calls(call, 4)

    rows.append(
        Row(
            "launch_sync",
            "no-op launch + synchronize",
            {
                "runtime": rt_launch_sync,
                "numpy": _na(NO_STREAMS_NUMPY),
                "pyopencl": cl_launch_sync,
                "torch": _na(TORCH_NO_QUEUES),
                "stdlib": tq_launch_sync,
            },
            note="one launch, then wait for it (round trip)",
        )
    )

    # 8 Python-callable launch ---------------------------------------------------------
    NP = cfg.n_pylaunch

    def rt_pylaunch(ctx):
        s = _stream(ctx)
        return timed_amortised(functools.partial(s.launch_kernel, _nothing), NP, s.synchronize)

    def tq_pylaunch(ctx):
        w = _tq(ctx)
        return timed_amortised(functools.partial(w.q.put, _nothing), NP, w.q.join)

    rows.append(
        Row(
            "pylaunch_amortised",
            f"Python-callable launch, amortised over {NP:,}",
            {
                "runtime": rt_pylaunch,
                "numpy": _na(NO_STREAMS_NUMPY),
                "pyopencl": _na("OpenCL queues run only OpenCL kernels"),
                "torch": _na(TORCH_NO_QUEUES),
                "stdlib": tq_pylaunch,
            },
            reps=cfg.loop_reps,
            note="stream.launch_kernel(f) with f() doing nothing | q.put(f); (N launches + 1 sync) / N",
        )
    )

    # 9 graph replay ----------------------------------------------------------------------
    G = cfg.graph_nodes

    def rt_launches(ctx):
        s = _stream(ctx)
        launch, sync, noop = s.launch_kernel, s.synchronize, rt.kernels.noop

        def call():
            for _ in range(G):
                launch(noop)
            sync()

        return timed_calls(call, 1)

    def cl_launches(ctx):
        p = ctx.peers
        q = p.cl.CommandQueue(p.cl_ctx, p.cl_dev)
        enq, knl = p.cl.enqueue_nd_range_kernel, p.cl_noop

        def call():
            for _ in range(G):
                enq(q, knl, (1,), None)
            q.finish()

        return timed_calls(call, 1)

    def tq_launches(ctx):
        w = _tq(ctx)
        put = w.q.put

        def call():
            for _ in range(G):
                put(_nothing)
            w.q.join()

        return timed_calls(call, 1)

    def rt_graph(ctx):
        s = _stream(ctx)
        s.begin_capture()
        for _ in range(G):
            s.launch_kernel(rt.kernels.noop)
        g = s.end_capture()
        if len(g) != G:
            raise RuntimeError(f"captured {len(g)} nodes, expected {G}")

        def call():
            g.launch(s)
            s.synchronize()

        return timed_calls(call, 1)

    def tq_graph(ctx):
        w = _tq(ctx)
        fs = [_nothing] * G

        def batch():
            for f in fs:
                f()

        def call():
            w.q.put(batch)
            w.q.join()

        return timed_calls(call, 1)

    rows.append(
        Row(
            "launch_100_sync",
            f"{G} no-op launches + synchronize",
            {
                "runtime": rt_launches,
                "numpy": _na(NO_STREAMS_NUMPY),
                "pyopencl": cl_launches,
                "torch": _na(TORCH_NO_QUEUES),
                "stdlib": tq_launches,
            },
            note="the baseline for graph replay",
        )
    )
    rows.append(
        Row(
            "graph_replay_sync",
            f"graph replay ({G} no-ops) + synchronize",
            {
                "runtime": rt_graph,
                "numpy": _na(NO_STREAMS_NUMPY),
                "pyopencl": _na("PyOpenCL exposes no command buffers / graphs"),
                "torch": _na(TORCH_NO_QUEUES),
                "stdlib": tq_graph,
            },
            note="capture 100 launches once (begin_capture/end_capture), replay with Graph.launch | put one callable that calls 100 no-ops",
        )
    )

    R = cfg.graph_replays

    def rt_graph_amortised(ctx):
        s = _stream(ctx)
        s.begin_capture()
        for _ in range(G):
            s.launch_kernel(rt.kernels.noop)
        g = s.end_capture()
        return timed_amortised(functools.partial(g.launch, s), R, s.synchronize)

    def tq_graph_amortised(ctx):
        w = _tq(ctx)
        fs = [_nothing] * G

        def batch():
            for f in fs:
                f()

        return timed_amortised(functools.partial(w.q.put, batch), R, w.q.join)

    rows.append(
        Row(
            "graph_replay_amortised",
            f"graph replay ({G} no-ops), amortised over {R}",
            {
                "runtime": rt_graph_amortised,
                "numpy": _na(NO_STREAMS_NUMPY),
                "pyopencl": _na("PyOpenCL exposes no command buffers / graphs"),
                "torch": _na(TORCH_NO_QUEUES),
                "stdlib": tq_graph_amortised,
            },
            reps=cfg.loop_reps * 2,
            note=f"({R} replays + 1 synchronize) / {R}; compare with {G} x the amortised no-op launch",
        )
    )

    # 10 pipeline ----------------------------------------------------------------------------
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

    # 11 multi-stream scaling -------------------------------------------------------------------
    for n in range(1, cfg.mm_streams + 1):
        rows.append(
            Row(
                f"matmul_streams_{n}",
                f"matmul {cfg.mm_n}^2 f32 x{cfg.mm_per_stream}/stream, {n} stream{'s' if n > 1 else ''}",
                {
                    "runtime": functools.partial(_rt_matmul, n=n),
                    "numpy": _na("see the stdlib column (numpy matmul in worker threads)"),
                    "pyopencl": _na("not measured: no BLAS in PyOpenCL"),
                    "torch": _na("not measured: torch CPU matmul is intra-op threaded"),
                    "stdlib": functools.partial(_tq_matmul, n=n),
                },
                reps=cfg.mm_reps,
                group="scaling",
                note="wall time / (streams x matmuls): weak scaling; stdlib = np.matmul in n worker threads (OpenBLAS default threading)",
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
                mm(c[i], a[i], b[i], stream=streams[i])
        for s in streams:
            s.synchronize()
        return (_now() - t0) / (n * M)

    fn()
    for i, (x, y) in enumerate(ins):
        if not np.allclose(c[i].copy_to_host(), x @ y, rtol=1e-4, atol=1e-3):
            raise RuntimeError("runtime matmul result differs from numpy")
    return fn


def _tq_matmul(ctx, n):
    cfg = ctx.cfg
    ws = [_tq(ctx) for _ in range(n)]
    ins = _mm_inputs(cfg, n)
    c = [np.empty((cfg.mm_n, cfg.mm_n), np.float32) for _ in range(n)]
    calls = [functools.partial(np.matmul, x, y, out=c[i]) for i, (x, y) in enumerate(ins)]
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


# --------------------------------------------------------------------------------------
# running


class Progress:
    """One line rewritten with ``\\r`` on a terminal; plain lines otherwise."""

    def __init__(self, total, out=sys.stderr, enabled=True):
        self.total = total
        self.out = out
        self.enabled = enabled
        self.tty = enabled and hasattr(out, "isatty") and out.isatty()
        self.i = 0
        self.label = ""
        self._last = 0.0
        self._width = 0

    def start(self, label):
        self.i += 1
        self.label = f"[{self.i}/{self.total}] {label}"
        self._emit(f"{self.label} ...", force=True)

    def tick(self, done, reps):
        if self.tty:
            self._emit(f"{self.label}: {done}/{reps}")

    def finish(self, text):
        if not self.enabled:
            return
        if self.tty:
            self._emit(f"{self.label}: {text}", force=True)
        else:
            print(f"{self.label}: {text}", file=self.out, flush=True)

    def close(self):
        if self.tty and self._width:
            self.out.write("\r" + " " * self._width + "\r")
            self.out.flush()

    def _emit(self, text, force=False):
        if not self.tty:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.05:
            return
        self._last = now
        cols = 120
        text = text[: cols - 1]
        pad = max(0, self._width - len(text))
        self.out.write("\r" + text + " " * pad)
        self.out.flush()
        self._width = len(text)


def run_cell(fn, reps, warmup, cfg: Config, progress: Progress, budget=True) -> dict:
    deadline = time.monotonic() + cfg.budget_s
    for _ in range(warmup):
        fn()
        if budget and time.monotonic() > deadline:
            break
    vals = []
    extra: dict[str, list] = {}
    gc.collect()
    gc.disable()
    try:
        deadline = time.monotonic() + cfg.budget_s
        for i in range(reps):
            v = fn()
            if isinstance(v, dict):
                for key, x in v.items():
                    if key != "t":
                        extra.setdefault(key, []).append(x)
                v = v["t"]
            vals.append(v)
            progress.tick(i + 1, reps)
            if budget and i + 1 >= cfg.min_reps and time.monotonic() > deadline:
                break
    finally:
        gc.enable()
    med, p90 = _stats(vals)
    cell = {
        "status": "ok",
        "median_us": med / 1e3,
        "p90_us": p90 / 1e3,
        "n": len(vals),
        "samples_us": [round(v / 1e3, 4) for v in vals],
    }
    for key, xs in extra.items():
        m, p = _stats(xs)
        cell[f"{key}_median_us"] = m / 1e3
        cell[f"{key}_p90_us"] = p / 1e3
    return cell


def run_rows(rows, systems, cfg, peers, progress) -> list[dict]:
    out = []
    for row in rows:
        res: dict[str, dict] = {}
        for sysname in systems:
            impl = row.impls.get(sysname)
            if impl is None:
                continue
            if sysname in peers.missing:
                res[sysname] = {"status": "missing", "reason": peers.missing[sysname]}
                continue
            progress.start(f"{row.title} / {sysname}")
            t_cell = time.monotonic()
            ctx = Ctx(cfg, peers)
            try:
                fn = impl(ctx)
                reps = row.reps or cfg.reps
                warm = cfg.warmup if row.reps is None else max(1, min(cfg.warmup, reps // 3))
                res[sysname] = run_cell(fn, reps, warm, cfg, progress, budget=row.reps is None)
                c = res[sysname]
                progress.finish(f"{fmt_us(c['median_us'])} / {fmt_us(c['p90_us'])} us (n={c['n']})")
            except NotApplicable as e:
                res[sysname] = {"status": "n/a", "reason": str(e)}
                progress.finish(f"n/a ({e})")
            except Exception as e:
                res[sysname] = {"status": "error", "reason": f"{type(e).__name__}: {e}"}
                progress.finish(f"ERROR {type(e).__name__}: {e}")
            finally:
                ctx.close()
                if res.get(sysname, {}).get("status") in ("ok", "error"):
                    settle(sysname)
            if sysname in res and "status" in res[sysname]:
                res[sysname]["elapsed_s"] = round(time.monotonic() - t_cell, 3)
        out.append(summarise_row(row, res))
    add_group_ratios(out)
    return out


def settle(sysname):
    """Between cells: let background work end so it does not leak into the next cell.

    After a runtime cell, ``empty_cache()`` drops the freed blocks still waiting for the
    allocator's background scrubber (otherwise it zeroes them while the next cell runs).
    """
    if sysname == "runtime":
        try:
            rt.empty_cache()
        except Exception:
            pass
    time.sleep(0.005)


def summarise_row(row: Row, res: dict) -> dict:
    d = {
        "key": row.key,
        "title": row.title,
        "unit": "us per op (lower is better)",
        "note": row.note,
        "seed_us": row.seed_us,
        "nbytes": row.nbytes,
        "results": res,
    }
    r = res.get("runtime", {})
    if r.get("status") == "ok":
        if row.seed_us:
            d["ratio_seed"] = r["median_us"] / row.seed_us
        peers = [
            (c["median_us"], p)
            for p, c in res.items()
            if p != "runtime" and c.get("status") == "ok"
        ]
        if peers:
            best, name = min(peers)
            d["best_peer"] = name
            d["ratio_best_peer"] = r["median_us"] / best
    if row.nbytes:
        for c in res.values():
            if c.get("status") == "ok":
                c["gbps_median"] = row.nbytes / (c["median_us"] * 1e3)
                c["gbps_p90"] = row.nbytes / (c["p90_us"] * 1e3)
    return d


def add_group_ratios(rows: list[dict]):
    """Speed-up over 1 stream for the scaling rows; pipelining on/off ratio."""
    base = next((r for r in rows if r["key"] == "matmul_streams_1"), None)
    for r in rows:
        if base and r["key"].startswith("matmul_streams_"):
            for sysname, c in r["results"].items():
                b = base["results"].get(sysname, {})
                if c.get("status") == "ok" and b.get("status") == "ok":
                    c["speedup_vs_1_stream"] = b["median_us"] / c["median_us"]
    on = next((r for r in rows if r["key"] == "pipeline_on"), None)
    off = next((r for r in rows if r["key"] == "pipeline_off"), None)
    if on and off:
        a, b = on["results"].get("runtime", {}), off["results"].get("runtime", {})
        if a.get("status") == "ok" and b.get("status") == "ok":
            off["pipelining_speedup"] = b["median_us"] / a["median_us"]


# --------------------------------------------------------------------------------------
# targets


def _med(rows, key, system):
    for r in rows:
        if r["key"] == key:
            c = r["results"].get(system, {})
            return c.get("median_us") if c.get("status") == "ok" else None
    return None


def _row(rows, key):
    return next((r for r in rows if r["key"] == key), None)


def check_targets(rows, cfg: Config, peers: Peers) -> list[dict]:
    out = []

    def add(name, status, detail):
        out.append({"target": name, "status": status, "detail": detail})

    def compare(name, key, peer, factor, peer_key=None, peer_label=None):
        """runtime median of ``key`` <= factor x peer median of ``peer_key``."""
        r = _med(rows, key, "runtime")
        p = _med(rows, peer_key or key, peer)
        label = peer_label or peer
        if _row(rows, key) is None:
            return add(name, "SKIP", "row not run")
        if r is None:
            return add(name, "SKIP", "runtime not measured")
        if p is None:
            why = peers.missing.get(peer, "not measured")
            return add(name, "SKIP", f"{label} missing: {why}")
        ok = r <= factor * p
        detail = f"runtime {fmt_us(r)} us vs {label} {fmt_us(p)} us: ratio {r / p:.3g} (needs <= {factor:g})"
        if not ok and r <= factor * p * 1.05:
            detail += "; within 5%, inside this host's noise"
        add(name, "PASS" if ok else "MISS", detail)

    compare("alloc 1 MiB zeroed <= 0.5x numpy np.zeros", "alloc_1m", "numpy", 0.5)
    compare("free <= PyOpenCL buffer release", "free_1m", "pyopencl", 1.0)
    copy_peer = "torch" if peers.torch is not None else "numpy"
    copy_call = "torch copy_" if copy_peer == "torch" else "numpy np.copyto (torch missing)"
    big = cfg.big // MiB
    for d in ("h2d", "d2h", "d2d"):
        compare(
            f"1 MiB {d.upper()} copy no slower than {copy_call}",
            f"copy_{d}_1m",
            copy_peer,
            1.0,
        )
    for d in ("h2d", "d2h", "d2d"):
        # bandwidth >= peer bandwidth  <=>  time <= peer time
        compare(
            f"{big} MiB {d.upper()} copy bandwidth >= {copy_call}",
            f"copy_{d}_{big}m",
            copy_peer,
            1.0,
        )
    compare("event record <= 0.35x PyOpenCL marker", "event_record", "pyopencl", 0.35)
    compare("idle synchronize <= PyOpenCL finish", "sync_idle", "pyopencl", 1.0)
    compare("stream create <= OpenCL queue create", "stream_create", "pyopencl", 1.0)
    compare(
        "native no-op launch, amortised <= 0.2x PyOpenCL enqueue",
        "launch_amortised",
        "pyopencl",
        0.2,
    )
    compare("launch + sync <= 0.2x PyOpenCL enqueue + finish", "launch_sync", "pyopencl", 0.2)
    compare(
        "Python-callable launch <= stdlib thread + queue",
        "pylaunch_amortised",
        "stdlib",
        1.0,
    )
    # graph replay >= 5x cheaper than 100 individual launches (both + synchronize)
    a = _med(rows, "launch_100_sync", "runtime")
    g = _med(rows, "graph_replay_sync", "runtime")
    name = f"graph replay of {cfg.graph_nodes} no-ops >= 5x cheaper than {cfg.graph_nodes} launches"
    if a is None or g is None:
        add(name, "SKIP", "rows not run")
    else:
        detail = f"{cfg.graph_nodes} launches + sync {fmt_us(a)} us vs replay + sync {fmt_us(g)} us: {a / g:.3g}x"
        la = _med(rows, "launch_amortised", "runtime")
        ga = _med(rows, "graph_replay_amortised", "runtime")
        if la is not None and ga is not None:
            detail += f" (amortised: {cfg.graph_nodes} x {fmt_us(la)} us vs {fmt_us(ga)} us per replay: {cfg.graph_nodes * la / ga:.3g}x)"
        add(name, "PASS" if a / g >= 5 else "MISS", detail + " (needs >= 5x)")
    # 2 streams >= 1.7x one stream
    r2 = _row(rows, "matmul_streams_2")
    name = "2 streams of compute-bound kernels >= 1.7x one stream"
    c = r2["results"].get("runtime", {}) if r2 else {}
    if "speedup_vs_1_stream" not in c:
        add(name, "SKIP", "rows not run")
    else:
        s = c["speedup_vs_1_stream"]
        add(
            name,
            "PASS" if s >= 1.7 else "MISS",
            f"throughput 2 streams / 1 stream = {s:.3g}x (needs >= 1.7; host has {os.cpu_count()} cores)",
        )
    return out


# --------------------------------------------------------------------------------------
# output


def fmt_us(v):
    if v is None:
        return "-"
    if v >= 1000:
        return f"{v:,.0f}"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    if v >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def _cell_text(c):
    st = c.get("status")
    if st == "ok":
        return f"{fmt_us(c['median_us'])} / {fmt_us(c['p90_us'])}"
    if st == "missing":
        return "missing"
    if st == "error":
        return "ERROR"
    return "n/a"


def _gbps_text(c):
    if c.get("status") != "ok" or "gbps_median" not in c:
        return ""
    return f"{c['gbps_median']:.1f} / {c['gbps_p90']:.1f}"


def _enqueue_text(c):
    if "enqueue_median_us" not in c:
        return ""
    return f"{fmt_us(c['enqueue_median_us'])} / {fmt_us(c['final_sync_median_us'])}"


def _speedup_text(c):
    if "speedup_vs_1_stream" not in c:
        return ""
    return f"x{c['speedup_vs_1_stream']:.2f}"


def render_table(rows, systems, machine) -> str:
    shown = [
        s
        for s in systems
        if any(r["results"].get(s, {}).get("status") not in (None, "missing") for r in rows)
    ]
    missing = [s for s in systems if s not in shown]
    w0 = max(34, *(len(r["title"]) for r in rows)) + 2
    wc = 19
    lines = []
    lines.append(
        f"runtime {machine['runtime']} on {machine['cpu']} ({machine['cores']} cores), Python {machine['python']}"
    )
    lines.append("Each cell: microseconds per operation, median / p90 (lower is better).")
    lines.append(
        "x seed = runtime median / seed figure; x best peer = runtime median / fastest peer median."
    )
    lines.append("Both ratios: < 1 means runtime is faster, > 1 means runtime is slower.")
    head = (
        f"{'operation':<{w0}}"
        + "".join(f"{s:>{wc}}" for s in shown)
        + f"{'x seed':>9}  {'x best peer':<20}"
    )
    lines.append("")
    lines.append(head)
    lines.append("-" * len(head))
    for r in rows:
        cells = "".join(
            f"{_cell_text(r['results'].get(s, {'status': 'n/a'})):>{wc}}" for s in shown
        )
        xs = f"{r['ratio_seed']:.3g}" if "ratio_seed" in r else "-"
        xb = f"{r['ratio_best_peer']:.3g} ({r['best_peer']})" if "ratio_best_peer" in r else "-"
        lines.append(f"{r['title']:<{w0}}{cells}{xs:>9}  {xb:<20}")
        res = r["results"]
        subs = [
            ("  GB/s (at median / at p90)", _gbps_text),
            ("  enqueue-only / final sync (us)", _enqueue_text),
            ("  throughput vs 1 stream (>1 better)", _speedup_text),
        ]
        for label, f in subs:
            texts = [f(res.get(s, {})) for s in shown]
            if any(texts):
                lines.append(f"{label:<{w0}}" + "".join(f"{t:>{wc}}" for t in texts))
        if "pipelining_speedup" in r:
            lines.append(
                f"{'  pipelining on vs off (>1: on faster)':<{w0}}{'x' + format(r['pipelining_speedup'], '.2f'):>{wc}}"
            )
    notes = []
    for r in rows:
        for s, c in r["results"].items():
            if c.get("status") == "error":
                notes.append(f"  ERROR {r['title']} / {s}: {c['reason']}")
    if notes:
        lines.append("")
        lines.append("errors:")
        lines.extend(notes)
    if missing:
        lines.append("")
        lines.append("missing peers:")
        for s in missing:
            reason = next(
                (
                    r["results"][s]["reason"]
                    for r in rows
                    if r["results"].get(s, {}).get("status") == "missing"
                ),
                "not selected",
            )
            lines.append(f"  {s}: {reason}")
    return "\n".join(lines)


def render_targets(targets) -> str:
    lines = ["targets (median vs median; reported, not asserted):"]
    for t in targets:
        lines.append(f"  {t['status']:<4}  {t['target']}: {t['detail']}")
    counts = {s: sum(t["status"] == s for t in targets) for s in ("PASS", "MISS", "SKIP")}
    lines.append(f"  -> {counts['PASS']} PASS, {counts['MISS']} MISS, {counts['SKIP']} SKIP")
    return "\n".join(lines)


def _md_cell(c):
    st = c.get("status")
    if st == "ok":
        return f"{fmt_us(c['median_us'])} / {fmt_us(c['p90_us'])}"
    return {"missing": "missing", "error": "ERROR"}.get(st, "n/a")


def render_markdown(doc) -> str:
    """The result table and the targets as GitHub markdown (from a run's JSON document)."""
    rows = doc["rows"]
    shown = [
        s
        for s in SYSTEMS
        if any(r["results"].get(s, {}).get("status") not in (None, "missing") for r in rows)
    ]
    out = [
        "| operation (us per op: median / p90) | "
        + " | ".join(shown)
        + " | x seed (<1: faster) | x best peer (<1: faster) |",
        "|---" * (len(shown) + 3) + "|",
    ]
    for r in rows:
        res = r["results"]
        xs = f"{r['ratio_seed']:.3g}" if "ratio_seed" in r else ""
        xb = f"{r['ratio_best_peer']:.3g} ({r['best_peer']})" if "ratio_best_peer" in r else ""
        cells = [_md_cell(res.get(s, {})) for s in shown]
        out.append(f"| {r['title']} | " + " | ".join(cells) + f" | {xs} | {xb} |")
        for label, f in (
            ("GB/s (at median / at p90)", _gbps_text),
            ("enqueue-only / final sync (us)", _enqueue_text),
            ("throughput vs 1 stream (>1: better)", _speedup_text),
        ):
            texts = [f(res.get(s, {})) for s in shown]
            if any(texts):
                out.append(f"| &nbsp;&nbsp;└ {label} | " + " | ".join(texts) + " | | |")
        if "pipelining_speedup" in r:
            pad = " | ".join([""] * (len(shown) - 1))
            out.append(
                f"| &nbsp;&nbsp;└ pipelining on vs off (>1: on faster) | x{r['pipelining_speedup']:.2f} | {pad} | | |"
            )
    out.append("")
    out.append("| target | status | measured |")
    out.append("|---|---|---|")
    for t in doc["targets"]:
        out.append(f"| {t['target']} | **{t['status']}** | {t['detail']} |")
    return "\n".join(out)


def write_plot(path, rows, machine) -> str | None:
    """PNG bar chart of runtime / best peer per row (log scale). Returns an error or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:
        return f"matplotlib is not installed ({type(e).__name__}: {e}); no plot written"
    data = [
        (r["title"], r["ratio_best_peer"], r["best_peer"]) for r in rows if "ratio_best_peer" in r
    ]
    if not data:
        return "no row has both runtime and a peer; no plot written"
    data.reverse()
    fig, ax = plt.subplots(figsize=(10, 0.38 * len(data) + 1.6))
    ys = range(len(data))
    vals = [d[1] for d in data]
    colors = ["#2e7d32" if v <= 1 else "#c62828" for v in vals]
    ax.barh(list(ys), vals, color=colors)
    ax.set_xscale("log")
    ax.set_xlim(min(vals) / 2, max(max(vals), 1.0) * 4)
    ax.axvline(1.0, color="black", lw=1)
    ax.set_yticks(list(ys))
    ax.set_yticklabels(
        [f"{t}  [{p}]" for t, p, _ in [(d[0], d[2], None) for d in data]], fontsize=8
    )
    for y, v in zip(ys, vals):
        ax.text(v, y, f" {v:.2g}x", va="center", fontsize=7)
    ax.set_xlabel("runtime median / best peer median (log scale; < 1: runtime faster, green)")
    ax.set_title(
        f"runtime {machine['runtime']} vs fastest installed peer ({machine['cpu']}, {machine['cores']} cores)",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


# --------------------------------------------------------------------------------------
# entry point


def _parser():
    ap = argparse.ArgumentParser(
        prog="python -m runtime bench",
        description=(
            "Measure the runtime's seed table (stream create, event record, alloc 1 MiB, free, "
            "memcpy H2D/D2H/D2D at 1 MiB and 64 MiB, idle synchronize) and executor rows (no-op "
            "launch amortised and round trip, Python-callable launch, graph replay, a 2-stream "
            "copy->compute->copy pipeline with enablePipelining on/off, matmul scaling over 1..4 "
            "streams) beside the installed peers (numpy, PyOpenCL on PoCL, torch CPU, a stdlib "
            "thread+queue executor), in this process. Cells are microseconds per operation, "
            "median / p90; ratios are runtime / other (< 1: runtime faster). The issues' targets "
            "are printed as PASS/MISS lines. Missing peers are reported, never faked."
        ),
    )
    ap.add_argument("--json", metavar="PATH", help="write results + machine info as JSON")
    ap.add_argument(
        "--plot",
        metavar="PATH",
        help="write a PNG bar chart of runtime / best peer (needs matplotlib)",
    )
    ap.add_argument(
        "--quick", action="store_true", help="smoke run (< 30 s): fewer repetitions, smaller sizes"
    )
    ap.add_argument(
        "--rows",
        metavar="SUBSTR[,SUBSTR]",
        help="only rows whose title or key contains one of these (case-insensitive)",
    )
    ap.add_argument(
        "--peers",
        metavar="LIST",
        default=",".join(PEERS),
        help=f"comma-separated peers to run (default: {','.join(PEERS)}; 'none' for runtime only)",
    )
    ap.add_argument(
        "--reps",
        type=int,
        default=None,
        help="repetitions of the latency rows (default 300, quick 20)",
    )
    ap.add_argument("--no-progress", action="store_true", help="no progress display on stderr")
    ap.add_argument(
        "--from-json",
        metavar="PATH",
        help="measure nothing: re-render a saved run (table, targets; --plot works too)",
    )
    ap.add_argument(
        "--markdown", action="store_true", help="print the table and targets as markdown"
    )
    ap.add_argument("--list", action="store_true", help="list the rows and exit")
    return ap


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    if a.from_json:
        with open(a.from_json) as f:
            doc = json.load(f)
        if a.markdown:
            print(render_markdown(doc))
        else:
            print(render_table(doc["rows"], list(SYSTEMS), doc["machine"]))
            print()
            print(render_targets(doc["targets"]))
        if a.plot:
            err = write_plot(a.plot, doc["rows"], doc["machine"])
            print(f"plot: {err}" if err else f"wrote {a.plot}")
        return 0
    cfg = Config(a.quick, a.reps)
    wanted = (
        [] if a.peers.strip() == "none" else [p.strip() for p in a.peers.split(",") if p.strip()]
    )
    bad = [p for p in wanted if p not in PEERS]
    if bad:
        print(f"bench: unknown peer(s) {bad}; choose from {', '.join(PEERS)}", file=sys.stderr)
        return 2
    rows = rows_for(cfg)
    if a.rows:
        subs = [s.strip().lower() for s in a.rows.split(",") if s.strip()]
        rows = [
            r
            for r in rows
            if any(s in r.title.lower() or s.replace(" ", "_") in r.key for s in subs)
        ]
    if a.list:
        for r in rows:
            print(f"{r.key:<24} {r.title}")
        return 0
    if not rows:
        print("bench: no row matches --rows", file=sys.stderr)
        return 2

    started_here = not rt.is_initialized()
    if started_here:
        rt.init()
    t_start = time.monotonic()
    try:
        peers = Peers(wanted)
        systems = ["runtime"] + [p for p in PEERS if p in wanted]
        for p in PEERS:
            if p not in wanted:
                peers.missing.setdefault(p, "not selected (--peers)")
        machine = machine_info(peers)
        # Park everything alive now (torch alone is ~10^5 objects) outside the collector, so
        # the full collection before each cell is cheap.
        gc.collect()
        gc.freeze()
        floor = timer_floor_ns()
        total = sum(1 for r in rows for s in systems if s in r.impls)
        progress = Progress(total, enabled=not a.no_progress)
        try:
            results = run_rows(rows, systems, cfg, peers, progress)
        finally:
            progress.close()
        targets = check_targets(results, cfg, peers)
    finally:
        if started_here:
            rt.shutdown()
    elapsed = time.monotonic() - t_start
    machine["loadavg_end"] = _loadavg()

    print(render_table(results, systems, machine))
    print()
    print(
        f"timer: perf_counter_ns pair {floor['perf_counter_ns_pair']:.0f} ns, empty loop iteration "
        f"{floor['empty_loop_iteration']:.1f} ns (included in every cell alike); seed: stream create "
        "10 us, event record 1 us, alloc 1 MB 100 us, memcpy 500 us per MiB, idle sync 1 us"
    )
    print(
        f"ran in {elapsed:.1f} s ({'quick' if cfg.quick else 'full'}); load average "
        f"{machine['loadavg_start']} at start, {machine['loadavg_end']} at end (other processes "
        "on this host add noise: compare p90 with median)"
    )
    print()
    print(render_targets(targets))

    rc = 0
    if any(r["results"].get("runtime", {}).get("status") == "error" for r in results):
        rc = 1
    if a.json:
        doc = {
            "machine": machine,
            "mode": "quick" if cfg.quick else "full",
            "elapsed_s": round(elapsed, 2),
            "timer_floor_ns": floor,
            "config": {k: v for k, v in vars(cfg).items()},
            "seed_us": SEED_US,
            "missing_peers": {p: why for p, why in peers.missing.items()},
            "rows": results,
            "targets": targets,
        }
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"\nwrote {a.json}")
    if a.plot:
        err = write_plot(a.plot, results, machine)
        print(f"plot: {err}" if err else f"wrote {a.plot}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
