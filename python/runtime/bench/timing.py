"""Clocks and statistics: median / p90, the timer's own floor, and the sample makers.

Each ``timed_*`` helper returns a function that times one sample and returns nanoseconds per
operation (or a dict with ``"t"`` and extra parts); ``run.run_cell`` calls it repeatedly.
"""

from __future__ import annotations

import gc
import math
from time import perf_counter_ns as _now


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
