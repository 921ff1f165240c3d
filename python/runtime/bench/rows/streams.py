"""Stream and event lifecycle rows: stream create, event record, synchronize an idle stream."""

from __future__ import annotations

import functools
import threading
from time import perf_counter_ns as _now

import runtime as rt

from ..config import ASCEND910_US, Config
from ..peers import ThreadQueueStream
from ..timing import timed_calls, timed_create
from .base import NO_STREAMS_NUMPY, TORCH_NO_EVENTS, TORCH_NO_QUEUES, Row, _na, _stream, _tq


def stream_event_rows(cfg: Config) -> list[Row]:
    """Rows 1 and 2 of the Ascend 910 reference table: stream create, event record."""
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
            ascend910_us=ASCEND910_US["stream create"],
            # Starting and joining threads leaves work behind (stacks unmapped, other cores'
            # TLBs flushed) that slowed the next cell's sample, the runtime's: 0.32-0.48 us
            # beside it, 0.20-0.27 us without.
            apart=("stdlib",),
            note="runtime.Stream() | cl.CommandQueue(ctx, dev) | start a worker thread with a "
            "queue.Queue (sampled after the others: its threads' start and exit)",
        )
    )

    # 2 event record --------------------------------------------------------------
    # One record on each of k idle streams per sample: every record finds its stream idle
    # (the reference table's case), and the timer's own cost is spread over k records.
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
            ascend910_us=ASCEND910_US["event record"],
            note="one record on each of 8 idle streams: Event.record(stream), timing enabled | cl.enqueue_marker(q) | q.put(event.set)",
        )
    )
    return rows


def sync_idle_rows(cfg: Config) -> list[Row]:
    """Row 5 of the Ascend 910 reference table: synchronize an idle stream."""
    k = cfg.batch
    rows: list[Row] = []

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
            ascend910_us=ASCEND910_US["sync idle"],
            note="Stream.synchronize() | CommandQueue.finish() | Queue.join(), all on an idle queue",
        )
    )
    return rows
