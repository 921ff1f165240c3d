"""Executor rows: no-op and Python-callable launches, launch round trips, graph replay."""

from __future__ import annotations

import functools
import threading

import runtime as rt

from ..config import Config
from ..timing import timed_amortised, timed_calls
from .base import NO_STREAMS_NUMPY, TORCH_NO_QUEUES, Row, _na, _nothing, _stream, _tq


def launch_rows(cfg: Config) -> list[Row]:
    """No-op launch amortised, launch + synchronize round trip, Python-callable launch."""
    rows: list[Row] = []

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

    # 7b launch + event record, amortised ----------------------------------------------
    def rt_launch_record(ctx):
        s = _stream(ctx)
        e = rt.Event()
        launch, record, noop = s.launch_kernel, e.record, rt.kernels.noop

        def call():
            launch(noop)
            record(s)

        return timed_amortised(call, N, s.synchronize)

    def cl_launch_marker(ctx):
        p = ctx.peers
        q = p.cl.CommandQueue(p.cl_ctx, p.cl_dev)
        enq, knl, marker = p.cl.enqueue_nd_range_kernel, p.cl_noop, p.cl.enqueue_marker

        def call():
            enq(q, knl, (1,), None)
            marker(q)

        return timed_amortised(call, N, q.finish)

    def tq_launch_record(ctx):
        w = _tq(ctx)
        ev = threading.Event()
        put = w.q.put

        def call():
            put(_nothing)
            put(ev.set)

        return timed_amortised(call, N, w.q.join)

    rows.append(
        Row(
            "launch_record_amortised",
            f"no-op launch + event record, amortised over {N:,}",
            {
                "runtime": rt_launch_record,
                "numpy": _na(NO_STREAMS_NUMPY),
                "pyopencl": cl_launch_marker,
                "torch": _na(TORCH_NO_QUEUES),
                "stdlib": tq_launch_record,
            },
            reps=cfg.loop_reps,
            note="(N x (launch + record) + 1 synchronize) / N: launch_kernel(noop) + Event.record(s) | enqueue_nd_range_kernel + enqueue_marker | q.put(noop) + q.put(event.set)",
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
    return rows


def graph_rows(cfg: Config) -> list[Row]:
    """100 launches + synchronize, graph replay of the same, and replay amortised."""
    rows: list[Row] = []

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
            group="graph",
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
            group="graph",
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
    return rows
