"""The sweeps: how each cost grows with the work, for the runtime and its peers.

Each ``sweep_*`` function takes a ``Plan`` and ``Peers`` and returns a ``Curve``: a set of
series (system -> [(x, y)]) over one axis, with the unit and the complexity the design
claims. Every point is the median of several samples (``measure``); nothing is asserted here.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import threading
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

import runtime as rt

from ..peers import Peers, ThreadQueueStream

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


@dataclass
class Plan:
    """How far each sweep goes; ``quick`` keeps a smoke run under half a minute."""

    quick: bool
    copy_sizes: list[int] = field(default_factory=list)
    stream_counts: list[int] = field(default_factory=list)
    thread_counts: list[int] = field(default_factory=list)
    live_counts: list[int] = field(default_factory=list)
    event_stream_counts: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    n_launch: int = 0
    objects: int = 0
    budget_s: float = 0.0

    @classmethod
    def make(cls, quick: bool) -> Plan:
        if quick:
            return cls(
                quick=True,
                copy_sizes=[4 * KiB, 64 * KiB, MiB],
                stream_counts=[1, 8, 64],
                thread_counts=[1, 2],
                live_counts=[10, 100, 1000],
                event_stream_counts=[1, 10, 100],
                depths=[0, 16, 128],
                n_launch=2000,
                objects=500,
                budget_s=0.05,
            )
        return cls(
            quick=False,
            copy_sizes=[4 * KiB << (2 * i) for i in range(9)] + [GiB],  # 4 KiB .. 256 MiB, 1 GiB
            stream_counts=[1, 4, 16, 64, 256, 1024],
            thread_counts=[1, 2, 4, 8],
            live_counts=[10, 100, 1000, 10_000, 100_000, 1_000_000],
            event_stream_counts=[1, 10, 100, 1000, 10_000],
            depths=[0, 4, 16, 64, 256, 600],  # + gate + 300 records < MAX_QUEUED
            n_launch=20_000,
            objects=10_000,
            budget_s=0.3,
        )


@dataclass
class Curve:
    """One sweep's result: ``series[system] = [(x, y), ...]``."""

    key: str
    title: str
    x_label: str
    y_label: str
    higher_is_better: bool
    complexity: str
    series: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    lines: dict[str, float] = field(default_factory=dict)  # horizontal reference lines
    notes: dict[str, str] = field(default_factory=dict)  # system -> why it is absent
    categorical: bool = False

    def add(self, system: str, x: float, y: float) -> None:
        self.series.setdefault(system, []).append((x, y))

    def to_dict(self) -> dict:
        return {
            "key": self.key,
            "title": self.title,
            "x_label": self.x_label,
            "y_label": self.y_label,
            "higher_is_better": self.higher_is_better,
            "complexity": self.complexity,
            "series": {k: [list(p) for p in v] for k, v in self.series.items()},
            "lines": self.lines,
            "notes": self.notes,
            "categorical": self.categorical,
        }


def measure(sample: Callable[[], float], budget_s: float, min_n: int = 3, max_n: int = 50) -> float:
    """Median of ``sample()`` results, repeated until ``budget_s`` is spent (at least ``min_n``)."""
    vals: list[float] = []
    t_end = time.monotonic() + budget_s
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        while len(vals) < min_n or (time.monotonic() < t_end and len(vals) < max_n):
            vals.append(sample())
    finally:
        if was:
            gc.enable()
    vals.sort()
    return vals[len(vals) // 2]


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# ----------------------------------------------------------------------------- copies


def _memcpy_bandwidth(nbytes: int, threads: int, budget_s: float) -> float:
    """GB/s of ``np.copyto`` over ``nbytes`` split across ``threads`` (numpy drops the GIL)."""
    src = np.ones(nbytes, np.uint8)
    dst = np.zeros(nbytes, np.uint8)
    parts = np.array_split(np.arange(nbytes), threads)
    bounds = [(int(p[0]), int(p[-1]) + 1) for p in parts if len(p)]

    def one():
        if threads == 1:
            return _timed(lambda: np.copyto(dst, src))
        ts = [threading.Thread(target=np.copyto, args=(dst[a:b], src[a:b])) for a, b in bounds]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return time.perf_counter() - t0

    return nbytes / measure(one, budget_s) / 1e9


def sweep_copies(plan: Plan, peers: Peers) -> list[Curve]:
    """Blocking copies H2D / D2H / D2D against size, as GB/s, beside numpy, torch, PyOpenCL."""
    curves = {
        d: Curve(
            f"copy_{d.lower()}",
            f"memcpy {d} bandwidth against size",
            "bytes",
            "GB/s",
            True,
            "linear in bytes: bandwidth rises with size until the per-call cost is amortised",
        )
        for d in ("H2D", "D2H", "D2D")
    }
    line_size = 64 * MiB  # large enough that thread start-up is noise
    for c in curves.values():
        c.lines["memcpy, 1 thread"] = _memcpy_bandwidth(line_size, 1, plan.budget_s)
        c.lines["memcpy, 2 threads"] = _memcpy_bandwidth(line_size, 2, plan.budget_s)
    for n in plan.copy_sizes:
        budget = plan.budget_s if n < 256 * MiB else max(plan.budget_s, 1.0)
        for (direction, system), gbs in _copy_point(n, budget, peers).items():
            targets = curves.values() if direction == "*" else [curves[direction]]
            for c in targets:
                c.add(system, n, gbs)
    for c in curves.values():
        _note_missing(c, peers, ("torch", "pyopencl"))
    return list(curves.values())


def measure_paired(
    samples: dict[str, Callable[[], float]], budget_s: float, max_n: int = 20_000
) -> dict[str, float]:
    """Median of each ``samples[k]()``, sampled in two blocks per entry, in the order given
    and then reversed (A B C C B A), ``budget_s`` per entry in all: a drift in the machine's
    memory bandwidth over the run lands on every entry alike. Each block runs for its whole
    share of the budget (up to ``max_n`` samples), so what the previous library left running
    (torch's OpenMP threads and PoCL's workers spin for milliseconds after a call, and on two
    cores take the core another library's helper thread needs) touches only the first few
    samples; blocks of a few dozen samples were tried and measured 256 KiB copies 30 %
    slower for whoever followed torch."""
    vals: dict[str, list[float]] = {k: [] for k in samples}
    order = list(samples.items())
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        for k, f in order + order[::-1]:
            t_end = time.monotonic() + budget_s / 2
            n = 0
            while n < 2 or (time.monotonic() < t_end and n < max_n // 2):
                vals[k].append(f())
                n += 1
    finally:
        if was:
            gc.enable()
    return {k: sorted(v)[len(v) // 2] for k, v in vals.items()}


def _copy_point(n: int, budget: float, peers: Peers) -> dict[tuple[str, str], float]:
    """GB/s of one blocking copy of ``n`` bytes: ``(direction, system) -> GB/s``; host-only
    peers (numpy, torch CPU) have one figure for every direction (``"*"``). The runtime's,
    numpy's and torch's copies are timed in turns (``measure_paired``), PyOpenCL's after."""
    host = np.ones(n, np.uint8)
    back = np.zeros(n, np.uint8)
    ops: dict[tuple[str, str], Callable[[], object]] = {}
    a, b = rt.device_malloc(0, n), rt.device_malloc(0, n)
    ops["H2D", "runtime"] = lambda: rt.memcpy_host_to_device(a, host)
    ops["D2H", "runtime"] = lambda: rt.memcpy_device_to_host(back, a)
    ops["D2D", "runtime"] = lambda: rt.memcpy_d2d(b, a)
    ops["*", "numpy"] = lambda: np.copyto(back, host)
    torch, cl = peers.torch, peers.cl
    if torch is not None:
        ts, td = torch.from_numpy(host), torch.empty(n, dtype=torch.uint8)
        ops["*", "torch"] = lambda: td.copy_(ts)
    try:
        secs = _paired_secs(ops, budget)
    finally:
        rt.device_free(a)
        rt.device_free(b)
    if cl is not None:
        # Timed apart, after the others: PoCL's worker threads keep spinning after a call
        # and slowed whatever ran next on this 2-core machine (1 MiB copies by 3-15x).
        q, rw = peers.cl_q, cl.mem_flags.READ_WRITE
        ba, bb = cl.Buffer(peers.cl_ctx, rw, n), cl.Buffer(peers.cl_ctx, rw, n)
        cl_ops: dict[tuple[str, str], Callable[[], object]] = {
            ("H2D", "pyopencl"): lambda: cl.enqueue_copy(q, ba, host, is_blocking=True),
            ("D2H", "pyopencl"): lambda: cl.enqueue_copy(q, back, ba, is_blocking=True),
            ("D2D", "pyopencl"): lambda: (cl.enqueue_copy(q, bb, ba), q.finish()),
        }
        try:
            secs.update(_paired_secs(cl_ops, budget))
        finally:
            ba.release()
            bb.release()
        ops.update(cl_ops)
    return {k: n / secs[k] / 1e9 for k in ops}


def _paired_secs(ops: dict, budget: float) -> dict:
    keys = list(ops)
    secs = measure_paired(
        {str(i): functools.partial(_timed, ops[k]) for i, k in enumerate(keys)}, budget
    )
    return {k: secs[str(i)] for i, k in enumerate(keys)}


def _note_missing(c: Curve, peers: Peers, names) -> None:
    for p in names:
        if p in peers.missing:
            c.notes[p] = peers.missing[p]


# ----------------------------------------------------------------------------- launches


def _noop() -> None:
    pass


def sweep_launch_streams(plan: Plan, peers: Peers) -> Curve:
    """No-op launches/s spread round-robin over 1 .. 1,024 streams (one submitting thread)."""
    c = Curve(
        "launch_streams",
        "launch throughput against the number of streams",
        "streams",
        "launches/s",
        True,
        "O(1) per launch: flat in the number of streams",
    )
    N = plan.n_launch
    for s_count in plan.stream_counts:
        streams = [rt.Stream() for _ in range(s_count)]
        noop = rt.kernels.noop
        launches = [s.launch_kernel for s in streams] * (N // s_count + 1)
        launches = launches[:N]
        pylaunches = [s.launch_host_func for s in streams] * (N // s_count + 1)
        pylaunches = pylaunches[: N // 4]

        def native(launches=launches, noop=noop):
            t0 = time.perf_counter()
            for f in launches:
                f(noop)
            rt.stream_synchronize()
            return (time.perf_counter() - t0) / len(launches)

        def python(pylaunches=pylaunches):
            t0 = time.perf_counter()
            for f in pylaunches:
                f(_noop)
            rt.stream_synchronize()
            return (time.perf_counter() - t0) / len(pylaunches)

        c.add("runtime", s_count, 1 / measure(native, plan.budget_s))
        c.add("runtime (Python no-op)", s_count, 1 / measure(python, plan.budget_s))
        for s in streams:
            s.destroy()
        if peers.cl is not None:
            cl = peers.cl
            qs = [cl.CommandQueue(peers.cl_ctx, peers.cl_dev) for _ in range(s_count)]
            k = peers.cl_noop
            order = (qs * (N // s_count + 1))[:N]

            def ocl(order=order, qs=qs, k=k, cl=cl):
                t0 = time.perf_counter()
                for q in order:
                    cl.enqueue_nd_range_kernel(q, k, (1,), None)
                for q in qs:
                    q.finish()
                return (time.perf_counter() - t0) / len(order)

            c.add("pyopencl", s_count, 1 / measure(ocl, plan.budget_s))
            del qs, order
    _note_missing(c, peers, ("pyopencl",))
    return c


def _threaded(n_threads: int, make_work: Callable[[int], Callable[[], None]]) -> float:
    """Seconds for ``n_threads`` threads to each run their work, started together."""
    works = [make_work(i) for i in range(n_threads)]
    barrier = threading.Barrier(n_threads + 1)

    def run(w):
        barrier.wait()
        w()

    ts = [threading.Thread(target=run, args=(w,)) for w in works]
    for t in ts:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    return time.perf_counter() - t0


def sweep_launch_threads(plan: Plan, peers: Peers) -> Curve:
    """Total no-op launches/s with 1 .. 8 submitting threads, each on its own stream/queue."""
    c = Curve(
        "launch_threads",
        "launch throughput against submitting threads",
        "threads",
        "launches/s (all threads)",
        True,
        "the GIL serialises Python callers: ideally flat; the GIL-only loop is the ceiling",
    )
    N = plan.n_launch // 2
    for n in plan.thread_counts:
        streams = [rt.Stream() for _ in range(n)]

        def native_work(i, streams=streams):
            s = streams[i]
            launch, noop = s.launch_kernel, rt.kernels.noop

            def w():
                for _ in range(N):
                    launch(noop)
                s.synchronize()

            return w

        def py_work(i, streams=streams):
            s = streams[i]
            launch = s.launch_host_func

            def w():
                for _ in range(N // 4):
                    launch(_noop)
                s.synchronize()

            return w

        def gil_work(i):
            def w():
                for _ in range(N):
                    _noop()

            return w

        def tput(make, per, n=n):
            return n * per / measure(lambda: _threaded(n, make), plan.budget_s)

        c.add("runtime", n, tput(native_work, N))
        c.add("runtime (Python no-op)", n, tput(py_work, N // 4))
        c.add("GIL-only loop", n, tput(gil_work, N))
        workers = [ThreadQueueStream() for _ in range(n)]

        def tq_work(i, workers=workers):
            q = workers[i].q

            def w():
                for _ in range(N // 4):
                    q.put(_noop)
                q.join()

            return w

        c.add("stdlib", n, tput(tq_work, N // 4))
        for worker in workers:
            worker.close()
        for s in streams:
            s.destroy()
        if peers.cl is not None:
            cl, k = peers.cl, peers.cl_noop
            qs = [cl.CommandQueue(peers.cl_ctx, peers.cl_dev) for _ in range(n)]

            def cl_work(i, qs=qs, cl=cl, k=k):
                q = qs[i]

                def w():
                    for _ in range(N // 4):
                        cl.enqueue_nd_range_kernel(q, k, (1,), None)
                    q.finish()

                return w

            c.add("pyopencl", n, tput(cl_work, N // 4))
            del qs
    _note_missing(c, peers, ("pyopencl",))
    return c


# ----------------------------------------------------------------------------- allocation

_SIZES = np.array([256, 1 * KiB, 4 * KiB, 16 * KiB, 64 * KiB])


def sweep_alloc(plan: Plan, peers: Peers) -> Curve:
    """One malloc + free pair (mixed sizes, churn) with 10 .. 10^6 live allocations."""
    c = Curve(
        "alloc_live",
        "device_malloc + device_free against live allocations",
        "live allocations",
        "us per malloc+free",
        False,
        "O(1) slab / O(log n) buddy: flat in the number of live allocations",
    )
    rng = np.random.default_rng(7)
    torch = peers.torch
    k = 64  # pairs per sample
    for live_n in plan.live_counts:
        live_sizes = rng.choice(_SIZES[:3], live_n)  # the live set: small blocks
        live = [rt.device_malloc(0, int(s)) for s in live_sizes]
        churn = [int(s) for s in rng.choice(_SIZES, k)]

        def rt_pairs(churn=churn, live=live):
            t0 = time.perf_counter()
            for i, s in enumerate(churn):
                b = rt.device_malloc(0, s)
                j = (i * 7919) % len(live)  # churn: replace a live block too
                rt.device_free(live[j])
                live[j] = b
            return (time.perf_counter() - t0) / len(churn) * 1e6

        c.add("runtime", live_n, measure(rt_pairs, plan.budget_s))
        for b in live:
            rt.device_free(b)
        del live
        np_live = [np.empty(int(s), np.uint8) for s in live_sizes]

        def np_pairs(churn=churn, np_live=np_live):
            t0 = time.perf_counter()
            for i, s in enumerate(churn):
                np_live[(i * 7919) % len(np_live)] = np.empty(s, np.uint8)
            return (time.perf_counter() - t0) / len(churn) * 1e6

        c.add("numpy", live_n, measure(np_pairs, plan.budget_s))
        del np_live
        if torch is not None:
            t_live = [torch.empty(int(s), dtype=torch.uint8) for s in live_sizes]

            def t_pairs(churn=churn, t_live=t_live):
                t0 = time.perf_counter()
                for i, s in enumerate(churn):
                    t_live[(i * 7919) % len(t_live)] = torch.empty(s, dtype=torch.uint8)
                return (time.perf_counter() - t0) / len(churn) * 1e6

            c.add("torch", live_n, measure(t_pairs, plan.budget_s))
            del t_live
        rt.empty_cache(0)
    _note_missing(c, peers, ("torch",))
    return c


# ----------------------------------------------------------------------------- events and barriers


def sweep_events_streams(plan: Plan, peers: Peers) -> Curve:
    """Event record, query, stream synchronize and the all-streams barrier, with 1 .. 10^4
    idle streams alive."""
    c = Curve(
        "events_streams",
        "event and barrier costs against live (idle) streams",
        "live streams",
        "us per call",
        False,
        "O(1) for record/query/synchronize; the barrier O(streams with pending work)",
    )
    k = 200
    cl = peers.cl
    for n in plan.event_stream_counts:
        streams = [rt.Stream() for _ in range(n)]
        for s in streams:  # "used" streams: each has run work once
            s.launch_kernel(rt.kernels.noop)
        rt.stream_synchronize()
        s0 = streams[0]
        ev = rt.Event(enable_timing=False)

        def per_call(f, k=k):
            def sample():
                t0 = time.perf_counter()
                for _ in range(k):
                    f()
                return (time.perf_counter() - t0) / k * 1e6

            return measure(sample, plan.budget_s)

        c.add("runtime: event record", n, per_call(lambda ev=ev, s0=s0: ev.record(s0)))
        s0.synchronize()
        c.add("runtime: event query", n, per_call(ev.query))
        c.add("runtime: stream synchronize", n, per_call(s0.synchronize))
        c.add("runtime: all-streams barrier", n, per_call(rt.stream_synchronize))
        for s in streams:
            s.destroy()
        del streams
        if cl is not None:
            qs = [cl.CommandQueue(peers.cl_ctx, peers.cl_dev) for _ in range(n)]
            q0 = qs[0]
            c.add("pyopencl: marker", n, per_call(lambda q0=q0: cl.enqueue_marker(q0)))
            m = cl.enqueue_marker(q0)
            q0.finish()
            c.add(
                "pyopencl: event status",
                n,
                per_call(lambda m=m: m.get_info(cl.event_info.COMMAND_EXECUTION_STATUS)),
            )
            c.add("pyopencl: queue finish", n, per_call(q0.finish))
            del qs, q0, m
    _note_missing(c, peers, ("pyopencl",))
    return c


def sweep_events_depth(plan: Plan, peers: Peers) -> Curve:
    """Record and query with 0 .. 600 commands queued (held behind a host-function gate).

    The deepest point stays below ``runtime.MAX_QUEUED`` (1,024) with the gate and the
    records this sweep adds: a full queue makes the next launch wait for the gate, which
    this thread would only open afterwards."""
    c = Curve(
        "events_depth",
        "event record / query against queue depth",
        "queued commands",
        "us per call",
        False,
        "O(1): independent of what is queued",
    )
    k = 100
    for d in plan.depths:
        assert d + 1 + 3 * k < rt.MAX_QUEUED, "the sweep would block on its own gate"
        s = rt.Stream()
        gate = threading.Event()
        s.launch_host_func(gate.wait)
        for _ in range(d):
            s.launch_kernel(rt.kernels.noop)
        evs = [rt.Event(enable_timing=False) for _ in range(k)]

        def rec(evs=evs, s=s):
            t0 = time.perf_counter()
            for e in evs:
                e.record(s)
            return (time.perf_counter() - t0) / len(evs) * 1e6

        def query(evs=evs):
            t0 = time.perf_counter()
            for e in evs:
                e.query()
            return (time.perf_counter() - t0) / len(evs) * 1e6

        def squery(s=s):
            t0 = time.perf_counter()
            for _ in range(k):
                s.query()
            return (time.perf_counter() - t0) / k * 1e6

        # Each record adds a command: sample a bounded number of times so depth stays ~d.
        c.add("runtime: event record", d, measure(rec, 0.0, min_n=3, max_n=3))
        c.add("runtime: event query (pending)", d, measure(query, plan.budget_s))
        c.add("runtime: stream query (pending)", d, measure(squery, plan.budget_s))
        gate.set()
        s.synchronize()
        s.destroy()
    return c


# ----------------------------------------------------------------------------- memory per object


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
        ).split()
    ]


def _heap_bytes() -> int:
    """Bytes in use on the C heap (glibc ``mallinfo2``: Rust, numpy, OpenCL and torch
    bookkeeping) plus the Python heap (``tracemalloc``). RSS growth is no measure here:
    memory freed by earlier sweeps is reused without growing RSS."""
    try:
        f = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError) as e:
        raise NotImplementedError(f"glibc mallinfo2 is unavailable ({e})") from e
    f.restype = _MallInfo2
    m = f()
    return int(m.uordblks + m.hblkhd) + tracemalloc.get_traced_memory()[0]


def _bytes_each(make: Callable[[], object], n: int, after: Callable[[list], None] | None = None):
    gc.collect()
    before = _heap_bytes()
    objs = [make() for _ in range(n)]
    if after is not None:
        after(objs)
    gc.collect()
    used = _heap_bytes() - before
    return objs, max(used, 0) / n


def sweep_object_bytes(plan: Plan, peers: Peers) -> Curve:
    """Host bytes per idle stream, used stream, event and live 256-byte allocation (heap growth
    over ``plan.objects`` objects), beside PyOpenCL queues, events, buffers and torch tensors."""
    c = Curve(
        "object_bytes",
        "host memory per object",
        "object",
        "bytes each (heap growth / count)",
        False,
        "constant per object",
        categorical=True,
    )
    n = plan.objects
    tracemalloc.start()
    try:
        _object_bytes(c, n, peers)
    finally:
        tracemalloc.stop()
    _note_missing(c, peers, ("torch", "pyopencl"))
    return c


def _object_bytes(c: Curve, n: int, peers: Peers) -> None:
    xs = {"stream (idle)": 0, "stream (used)": 1, "event": 2, "allocation (256 B)": 3}

    def used(objs):
        for s in objs:
            s.launch_kernel(rt.kernels.noop)
        rt.stream_synchronize()

    objs, b = _bytes_each(rt.Stream, n)
    c.add("runtime", xs["stream (idle)"], b)
    for s in objs:
        s.destroy()
    objs, b = _bytes_each(rt.Stream, n, used)
    c.add("runtime", xs["stream (used)"], b)
    for s in objs:
        s.destroy()
    objs, b = _bytes_each(lambda: rt.Event(enable_timing=False), n)
    c.add("runtime", xs["event"], b)
    objs, b = _bytes_each(lambda: rt.device_malloc(0, 256), n)
    c.add("runtime", xs["allocation (256 B)"], b)
    for o in objs:
        rt.device_free(o)
    del objs
    if peers.cl is not None:
        cl = peers.cl
        ctx, dev, q = peers.cl_ctx, peers.cl_dev, peers.cl_q
        objs, b = _bytes_each(lambda: cl.CommandQueue(ctx, dev), n)
        c.add("pyopencl", xs["stream (idle)"], b)

        def cl_used(qs):
            for qq in qs:
                cl.enqueue_nd_range_kernel(qq, peers.cl_noop, (1,), None)
                qq.finish()

        objs, b = _bytes_each(lambda: cl.CommandQueue(ctx, dev), n, cl_used)
        c.add("pyopencl", xs["stream (used)"], b)
        objs, b = _bytes_each(lambda: cl.enqueue_marker(q), n)
        c.add("pyopencl", xs["event"], b)
        objs, b = _bytes_each(lambda: cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 256), n)
        c.add("pyopencl", xs["allocation (256 B)"], b)
        del objs
    if peers.torch is not None:
        torch = peers.torch
        objs, b = _bytes_each(lambda: torch.empty(256, dtype=torch.uint8), n)
        c.add("torch", xs["allocation (256 B)"], b)
        del objs
    c.notes["x"] = ", ".join(f"{v}={k}" for k, v in xs.items())
    c.notes["method"] = (
        "C heap in use (glibc mallinfo2) + Python heap (tracemalloc), growth over "
        f"{n:,} objects; device memory itself (mapped, not malloc'd) is not counted"
    )


# ----------------------------------------------------------------------------- compute scaling


def sweep_compute(plan: Plan, peers: Peers) -> Curve:
    """Matrix multiplies spread over 1 .. 8 streams: native kernels and Python kernels that
    release the GIL (numpy ``dot`` in a host function)."""
    c = Curve(
        "compute_streams",
        "compute throughput against streams",
        "streams",
        "GFLOP/s (all streams)",
        True,
        "scales with streams up to the machine's cores, then flat",
    )
    n_mm = 128 if plan.quick else 256
    per_stream = 4 if plan.quick else 16
    flops = 2 * n_mm**3
    a_h = np.random.default_rng(1).standard_normal((n_mm, n_mm)).astype(np.float32)
    for n in plan.thread_counts:
        streams = [rt.Stream() for _ in range(n)]
        bufs = [
            (rt.to_device(a_h), rt.to_device(a_h), rt.empty((n_mm, n_mm), "float32"))
            for _ in range(n)
        ]
        host = [(a_h.copy(), a_h.copy(), np.empty_like(a_h)) for _ in range(n)]

        def native(streams=streams, bufs=bufs):
            t0 = time.perf_counter()
            for _ in range(per_stream):
                for s, (a, b, o) in zip(streams, bufs):
                    s.launch_kernel(rt.kernels.matmul, (o, a, b))
            rt.stream_synchronize()
            return time.perf_counter() - t0

        def python(streams=streams, host=host):
            t0 = time.perf_counter()
            for _ in range(per_stream):
                for s, (a, b, o) in zip(streams, host):
                    s.launch_host_func(np.dot, a, b, o)
            rt.stream_synchronize()
            return time.perf_counter() - t0

        total = flops * per_stream * n
        c.add("runtime: native matmul", n, total / measure(native, plan.budget_s) / 1e9)
        c.add(
            "runtime: numpy dot in host function", n, total / measure(python, plan.budget_s) / 1e9
        )
        for s in streams:
            s.destroy()
        del bufs
    return c


ALL = {
    "copy": sweep_copies,
    "launch_streams": sweep_launch_streams,
    "launch_threads": sweep_launch_threads,
    "alloc": sweep_alloc,
    "events_streams": sweep_events_streams,
    "events_depth": sweep_events_depth,
    "object_bytes": sweep_object_bytes,
    "compute": sweep_compute,
}
