"""Running the rows: each (row, system) cell is set up, warmed, timed and cleaned up.

``run_rows`` walks the rows, turns a missing peer, ``NotApplicable`` or an exception into that
cell's status, and lets background work settle between cells; ``run_cell`` times one cell under
the repetition budget with the collector off; ``Progress`` is the stderr progress line.
"""

from __future__ import annotations

import gc
import sys
import time

import runtime as rt

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
