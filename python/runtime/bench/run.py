"""Running the rows: each (row, system) cell is set up, warmed, timed and cleaned up.

``run_rows`` walks the rows a group at a time (a row and its systems, or the rows that share a
``group`` and are compared with each other), turns a missing peer, ``NotApplicable`` or an
exception into that cell's status, warms every cell up outside the timed samples, then samples
the group's cells interleaved, round by round, with the collector off (systems a row sets
``apart`` in a stretch of their own after the others), and lets background
work settle between groups. While a group is sampled, the host's cross-core latency is probed
between rounds (``_probe_host``) and kept with each of its rows. ``run_cell`` times one sample
function alone; ``Progress`` is the stderr progress line.
"""

from __future__ import annotations

import gc
import sys
import time

import runtime as rt
from runtime import _runtime

from .config import Config, NotApplicable
from .report import add_group_ratios, fmt_us, summarise_row
from .rows import Ctx
from .timing import _stats


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

    def note(self, text):
        """A finished cell's figures (plain lines only; a terminal shows the running line)."""
        if self.enabled and not self.tty:
            print(f"  {text}", file=self.out, flush=True)

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


class _Cell:
    """One (row, system) being measured: its sample function, the samples so far, its cleanups."""

    def __init__(self, row, sysname, ctx, fn, reps, budget):
        self.row, self.sysname, self.ctx, self.fn = row, sysname, ctx, fn
        self.reps, self.budget = reps, budget
        self.vals: list = []
        self.extra: dict[str, list] = {}
        self.t_setup = 0.0
        self.error: Exception | None = None

    def sample(self):
        v = self.fn()
        if isinstance(v, dict):
            for key, x in v.items():
                if key != "t":
                    self.extra.setdefault(key, []).append(x)
            v = v["t"]
        self.vals.append(v)

    def result(self) -> dict:
        med, p90 = _stats(self.vals)
        cell = {
            "status": "ok",
            "median_us": med / 1e3,
            "p90_us": p90 / 1e3,
            "n": len(self.vals),
            "samples_us": [round(v / 1e3, 4) for v in self.vals],
        }
        for key, xs in self.extra.items():
            m, p = _stats(xs)
            cell[f"{key}_median_us"] = m / 1e3
            cell[f"{key}_p90_us"] = p / 1e3
        return cell


def run_cell(fn, reps, warmup, cfg: Config, progress: Progress, budget=True) -> dict:
    """Time one sample function alone: ``warmup`` untimed calls, then up to ``reps`` samples
    (fewer once the time budget is spent, never fewer than ``cfg.min_reps``)."""
    cell = _Cell(None, "", None, fn, reps, budget)
    for _ in range(warmup):
        fn()
    _interleave([cell], cfg, progress)
    if cell.error is not None:
        raise cell.error
    return cell.result()


#: Seconds between two probes of the host's cross-core latency while a group is sampled.
PROBE_EVERY_S = 0.25


def _probe_host() -> float | None:
    """One-way ns of a cache line between two busy threads now (the quickest of bursts of 64
    round trips, 1,000 in all, at most 5 ms; a burst in which another busy thread took one
    of the two cores does not count): what every hand-off between a launching thread and a
    worker costs at least.
    On a VM it changes with where the host puts the vCPUs (BENCHMARKS.md), and with it every
    small launch's time. None on a single-CPU host."""
    return _runtime._cross_core_ns(1000, 0.005)


def _probe_into(probes: list) -> None:
    ns = _probe_host()
    if ns is not None:
        probes.append(ns)


def _interleave(
    cells: list[_Cell], cfg: Config, progress: Progress, probes: list | None = None
) -> None:
    """Sample the cells in turn, one sample each per round, with the collector off.

    Cells that are compared with each other (the systems of one row, the rows of one group)
    are measured over the same stretch of time, so a burst of load from other processes
    slows each of them alike instead of one cell of the pair. Each timed sample follows an
    untimed call of the same cell, so that it finds its worker threads as warm as in a run of
    back-to-back samples, and the previous cell's background work (a worker lingering, freed
    blocks being scrubbed) overlaps that untimed call rather than the timed one. A cell stops
    at its ``reps``; a budgeted cell also stops once the round's time budget is spent and it
    has ``cfg.min_reps`` samples. With ``probes``, the host's cross-core latency is appended to
    it before the first round, between rounds every ``PROBE_EVERY_S`` and after the last,
    outside the timed samples.
    """
    reps = max(c.reps for c in cells)
    budget = cfg.budget_s * len(cells)
    gc.collect()
    gc.disable()
    try:
        deadline = time.monotonic() + budget
        next_probe = 0.0
        for i in range(reps):
            live = [c for c in cells if c.error is None and len(c.vals) < c.reps]
            if not live:
                break
            if probes is not None and time.monotonic() >= next_probe:
                _probe_into(probes)
                next_probe = time.monotonic() + PROBE_EVERY_S
            if i >= cfg.min_reps and time.monotonic() > deadline:
                live = [c for c in live if not c.budget]
                if not live:
                    break
            for c in live:
                try:
                    if len(cells) > 1:
                        c.fn()  # untimed: the cell's threads are as warm as back to back
                    c.sample()
                except Exception as e:  # this cell's error; the others go on
                    c.error = e
            progress.tick(i + 1, reps)
        if probes is not None:
            _probe_into(probes)
    finally:
        gc.enable()


def _groups(rows) -> list[list]:
    """Consecutive rows sharing a ``group`` are measured together; every other row alone."""
    out: list[list] = []
    for row in rows:
        if row.group is not None and out and out[-1][0].group == row.group:
            out[-1].append(row)
        else:
            out.append([row])
    return out


def run_rows(rows, systems, cfg, peers, progress) -> list[dict]:
    """Measure every (row, system) cell: set up and warm up each cell of a group (untimed),
    then sample the group's cells interleaved (``_interleave``), then clean up."""
    results: dict[str, dict[str, dict]] = {row.key: {} for row in rows}
    probes: dict[str, tuple[int, list[float]]] = {row.key: (-1, []) for row in rows}
    for g, group in enumerate(_groups(rows)):
        cells: list[_Cell] = []
        for row in group:
            res = results[row.key]
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
                    warm = cfg.warmup if row.reps is None else max(2, min(cfg.warmup, reps // 3))
                    for _ in range(warm):  # outside the timed samples
                        fn()
                except NotApplicable as e:
                    res[sysname] = {"status": "n/a", "reason": str(e)}
                    progress.finish(f"n/a ({e})")
                    ctx.close()
                    continue
                except Exception as e:
                    res[sysname] = _error(e, t_cell)
                    progress.finish(f"ERROR {type(e).__name__}: {e}")
                    ctx.close()
                    settle(sysname)
                    continue
                cell = _Cell(row, sysname, ctx, fn, reps, budget=row.reps is None)
                cell.t_setup = t_cell
                cells.append(cell)
                progress.finish("set up and warmed")
        if cells:
            t0 = time.monotonic()
            together = [c for c in cells if c.sysname not in c.row.apart]
            apart = [c for c in cells if c.sysname in c.row.apart]
            seen: list[float] = []
            for stretch in (together, apart):
                if stretch:
                    _interleave(stretch, cfg, progress, seen)
            for row in group:
                probes[row.key] = (g, seen)
            for c in cells:
                if c.error is not None:
                    results[c.row.key][c.sysname] = _error(c.error, c.t_setup)
                    progress.note(f"{c.row.title} / {c.sysname}: ERROR {c.error!r}")
                else:
                    cell = c.result()
                    cell["elapsed_s"] = round(time.monotonic() - t0, 3)
                    results[c.row.key][c.sysname] = cell
                    progress.note(
                        f"{c.row.title} / {c.sysname}: {fmt_us(cell['median_us'])} / "
                        f"{fmt_us(cell['p90_us'])} us (n={cell['n']})"
                    )
                c.ctx.close()
            for sysname in {c.sysname for c in cells}:
                settle(sysname)
    out = [summarise_row(row, results[row.key]) for row in rows]
    for d in out:
        g, seen = probes[d["key"]]
        d["host_one_way_ns"] = [round(ns, 1) for ns in seen]
        d["host_probe_group"] = g
    add_group_ratios(out)
    return out


def _error(e: Exception, t_cell: float) -> dict:
    return {
        "status": "error",
        "reason": f"{type(e).__name__}: {e}",
        "elapsed_s": round(time.monotonic() - t_cell, 3),
    }


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
