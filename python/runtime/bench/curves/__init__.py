"""How cost grows with the work: ``python -m runtime bench --curves``.

``sweeps`` measures each curve (copies against size, launches against streams and threads,
allocation against live allocations, events and barriers against streams and queue depth,
host bytes per object, compute against streams) for the runtime and the installed peers;
``report`` prints the tables, checks the targets (flat where the design says O(1), the
barrier, thread scaling, copies against torch, bytes per stream) and draws one plot per
sweep. ``run`` ties them together and writes ``curves.json`` beside the plots.
"""

from __future__ import annotations

import json
import os
import sys
import time

import runtime as rt

from ..peers import Peers, machine_info
from .report import check_curves, plot_curve, render_checks, render_curve
from .sweeps import ALL, Curve, Plan

__all__ = ["ALL", "Curve", "Plan", "check_curves", "plot_curve", "render_curve", "run"]


def run(out_dir: str, quick: bool, wanted, only=None, progress: bool = True) -> int:
    """Measure the sweeps (``only``: names from ``ALL``), print them, write JSON and plots."""
    plan = Plan.make(quick)
    peers = Peers(wanted)
    machine = machine_info(peers)
    os.makedirs(out_dir, exist_ok=True)
    curves: list[Curve] = []
    names = [n for n in ALL if only is None or n in only]
    t_start = time.monotonic()
    for i, name in enumerate(names, 1):
        if progress:
            print(f"[{i}/{len(names)}] {name} ...", flush=True, file=sys.stderr)
        t0 = time.monotonic()
        got = ALL[name](plan, peers)
        for c in got if isinstance(got, list) else [got]:
            c.notes.setdefault("elapsed_s", f"{time.monotonic() - t0:.1f}")
            curves.append(c)
    checks = check_curves(curves, plan)
    for c in curves:
        print(render_curve(c))
        print()
    print(render_checks(checks))
    doc = {
        "machine": machine,
        "quick": quick,
        "elapsed_s": round(time.monotonic() - t_start, 1),
        "curves": [c.to_dict() for c in curves],
        "checks": checks,
    }
    path = os.path.join(out_dir, "curves.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {path}")
    for c in curves:
        err = plot_curve(c, os.path.join(out_dir, f"{c.key}.png"), machine)
        if err:
            print(f"plot: {err}")
            break
    else:
        print(f"wrote {len(curves)} plots in {out_dir}")
    rt.stream_synchronize()
    return 0
