"""Timeline profiling: ``with runtime.profile("trace.json"):`` records every command's enqueue,
start and end per stream and device, every event record, and every allocation and free, and
writes a Chrome / Perfetto trace-event file (open it in ui.perfetto.dev or chrome://tracing).

``python -m runtime trace-plot trace.json out.png`` draws the timeline, one lane per stream.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any

from . import _runtime


def to_chrome(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Convert runtime trace records to the Chrome trace-event format (times in µs)."""
    events: list[dict[str, Any]] = []
    lanes: set[tuple[int, int]] = set()
    for r in records:
        pid, tid, ts = r["device"], r["stream"], r["ts_ns"] / 1000.0
        base = {"name": r["name"], "pid": pid, "tid": tid, "ts": ts}
        phase = r["phase"]
        if phase == "run":
            lanes.add((pid, tid))
            events.append(
                {
                    **base,
                    "ph": "X",
                    "cat": "command",
                    "dur": (r["end_ns"] - r["ts_ns"]) / 1000.0,
                    "args": {"engine": r["engine"]},
                }
            )
        elif phase == "enqueue":
            lanes.add((pid, tid))
            events.append(
                {**base, "ph": "i", "s": "t", "cat": "enqueue", "name": f"enqueue {r['name']}"}
            )
        elif phase == "record":
            lanes.add((pid, tid))
            events.append({**base, "ph": "i", "s": "t", "cat": "event"})
        else:  # alloc / free: an instant on the memory lane and a counter of allocated bytes
            events.append(
                {
                    **base,
                    "tid": 0,
                    "ph": "i",
                    "s": "p",
                    "cat": "memory",
                    "name": f"{phase} {r['bytes']} B",
                    "args": {"bytes": r["bytes"]},
                }
            )
            events.append(
                {
                    "name": "allocated bytes",
                    "ph": "C",
                    "pid": pid,
                    "ts": ts,
                    "args": {"allocated": r["allocated"]},
                }
            )
    for pid in sorted({p for p, _ in lanes} | {e["pid"] for e in events}):
        events.append(
            {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"device {pid}"}}
        )
    for pid, tid in sorted(lanes):
        events.append(
            {
                "name": "thread_name",
                "ph": "M",
                "pid": pid,
                "tid": tid,
                "args": {"name": f"stream {tid}"},
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ms"}


@contextlib.contextmanager
def profile(path: str | os.PathLike[str] | None = None) -> Iterator[list[dict[str, Any]]]:
    """Record a timeline while the block runs; write it to ``path`` (Chrome trace JSON).

    Yields a list that holds the raw records once the block has ended.
    """
    # Fix: check the path before tracing starts. ``open`` also takes an int (a file
    # descriptor), so ``profile(1)`` wrote the trace to stdout and then closed fd 1; other
    # wrong types failed only at the end of the block, after the traced work had run.
    if path is not None and not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(
            f"path must be a str, bytes, os.PathLike or None, got {type(path).__name__}"
        )
    records: list[dict[str, Any]] = []
    _runtime.trace_start()
    try:
        yield records
    finally:
        records.extend(_runtime.trace_stop())
        if path is not None:
            with open(path, "w", encoding="utf-8") as f:
                json.dump(to_chrome(records), f)


def plot(trace_path: str, out_path: str) -> None:
    """Draw a trace file's command spans as a timeline picture, one lane per stream."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(trace_path, encoding="utf-8") as f:
        events = json.load(f)["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X"]
    if not spans:
        raise SystemExit(f"{trace_path}: no command spans to draw")
    t0 = min(e["ts"] for e in spans)
    lanes = sorted({(e["pid"], e["tid"]) for e in spans})
    names = sorted({e["name"] for e in spans})
    colors = {n: plt.get_cmap("tab10")(i % 10) for i, n in enumerate(names)}
    fig, ax = plt.subplots(figsize=(12, 1 + 0.6 * len(lanes)))
    for y, lane in enumerate(lanes):
        for e in (e for e in spans if (e["pid"], e["tid"]) == lane):
            ax.broken_barh(
                [((e["ts"] - t0) / 1000.0, max(e["dur"], 1.0) / 1000.0)],
                (y - 0.4, 0.8),
                color=colors[e["name"]],
            )
    ax.set_yticks(range(len(lanes)), [f"device {p} / stream {t}" for p, t in lanes])
    ax.set_xlabel("time (ms)")
    ax.legend(
        handles=[plt.Rectangle((0, 0), 1, 1, color=colors[n]) for n in names],
        labels=names,
        loc="upper right",
        fontsize="small",
    )
    ax.set_title(os.path.basename(trace_path))
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)


def plot_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m runtime trace-plot",
        description="Draw a runtime trace (Chrome JSON) as a timeline PNG, one lane per stream.",
    )
    ap.add_argument("trace", help="trace file written by runtime.profile()")
    ap.add_argument("out", help="output PNG path")
    a = ap.parse_args(argv)
    plot(a.trace, a.out)
    print(f"wrote {a.out}")
    return 0
