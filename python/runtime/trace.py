"""Timeline profiling: ``with runtime.profile("trace.json"):`` records every command's enqueue,
start and end per stream and device, every event record, and every allocation and free, and
writes a Chrome / Perfetto trace-event file (open it in ui.perfetto.dev or chrome://tracing).

``python -m runtime trace-plot trace.json out.png`` draws the timeline, one lane per stream.
"""

from __future__ import annotations

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
        elif phase == "advise":  # mem_advise on managed memory: an instant on the memory lane
            events.append(
                {
                    **base,
                    "tid": 0,
                    "ph": "i",
                    "s": "p",
                    "cat": "memory",
                    "args": {"bytes": r["bytes"]},
                }
            )
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
    # The path is checked before tracing starts: ``open`` also takes an int (a file
    # descriptor), and other wrong types would fail only after the traced work had run.
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


class TraceFileError(ValueError):
    """A trace file that cannot be read, is not JSON, or holds no command spans to draw."""


def load_spans(trace_path: str) -> list[dict[str, Any]]:
    """The command spans (``"ph": "X"``) of a Chrome trace file, checked for what ``plot`` uses."""
    try:
        with open(trace_path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise TraceFileError(f"{trace_path}: cannot read: {e.strerror or e}") from e
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise TraceFileError(f"{trace_path}: not valid JSON ({e})") from e
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise TraceFileError(
            f"{trace_path}: not a trace (no 'traceEvents' list, as runtime.profile() writes)"
        )
    spans = [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]

    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    for span in spans:
        if not (
            isinstance(span.get("name"), str)
            and number(span.get("ts"))
            and number(span.get("dur"))
            and isinstance(span.get("pid"), int)
            and isinstance(span.get("tid"), int)
        ):
            raise TraceFileError(
                f"{trace_path}: not a runtime trace (a command span lacks a name, ts, dur, "
                "pid or tid)"
            )
    if not spans:
        raise TraceFileError(f"{trace_path}: no command spans to draw")
    return spans


def plot(trace_path: str, out_path: str) -> None:
    """Draw a trace file's command spans as a timeline picture, one lane per stream.

    Raises ``TraceFileError`` for a file that holds no such spans, ``ImportError`` without
    matplotlib.
    """
    _draw(load_spans(trace_path), os.path.basename(trace_path), out_path)


def _draw(spans: list[dict[str, Any]], title: str, out_path: str) -> None:
    import matplotlib.pyplot as plt

    fig = timeline_figure(spans, title)
    try:
        fig.savefig(out_path, dpi=110)
    finally:
        plt.close(fig)


def timeline_figure(spans: list[dict[str, Any]], title: str):
    """The matplotlib figure ``plot`` saves: one lane per (device, stream), one colour per
    command name, the legend outside the axes. The caller closes it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    # The legend sits right of the axes, never over the spans (the last ones end at the right).
    ax.legend(
        handles=[plt.Rectangle((0, 0), 1, 1, color=colors[n]) for n in names],
        labels=names,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        borderaxespad=0.0,
        fontsize="small",
    )
    ax.set_title(title)
    fig.tight_layout()
    return fig


def picture_formats() -> list[str]:
    """The file extensions matplotlib's Agg canvas writes (png, pdf, svg, ...), sorted."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    return sorted(FigureCanvasAgg(Figure()).get_supported_filetypes())


def plot_main(argv: list[str] | None) -> int:
    from . import _cli

    return _cli.guard("python -m runtime trace-plot", _plot_main, argv)


def _plot_main(argv: list[str] | None) -> int:
    from . import _cli

    ap = _cli.ArgumentParser(
        prog="python -m runtime trace-plot",
        description="Draw a runtime trace (Chrome JSON) as a timeline PNG, one lane per stream.",
    )
    ap.add_argument("trace", help="trace file written by runtime.profile()")
    ap.add_argument("out", help="output PNG path")
    a = ap.parse_args(argv)
    try:
        spans = load_spans(a.trace)
    except TraceFileError as e:
        raise _cli.UsageError(str(e)) from e
    _cli.check_writable(a.out, "")
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        raise _cli.UsageError(
            "drawing a trace needs matplotlib, which is not installed: pip install matplotlib "
            "(the package's 'plot' extra)"
        ) from e
    formats = picture_formats()
    ext = os.path.splitext(a.out)[1].lstrip(".").lower()
    if ext not in formats:
        what = f"a .{ext} file" if ext else "a file without an extension"
        raise _cli.UsageError(
            f"{a.out}: matplotlib cannot write {what}; name the picture with one of "
            f"{', '.join('.' + f for f in formats)}"
        )
    try:
        _draw(spans, os.path.basename(a.trace), a.out)
    except OSError as e:
        _cli.fail_write(a.out, "", e)
    print(f"wrote {a.out}")
    return 0
