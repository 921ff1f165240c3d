"""Tables, target checks and plots of the sweeps; matplotlib is imported only to plot."""

from __future__ import annotations

from .sweeps import Curve, Plan

KiB = 1 << 10


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1e6:
        return f"{v:.3g}"
    if abs(v) >= 100:
        return f"{v:.0f}"
    return f"{v:.3g}"


def _fmt_x(c: Curve, x: float) -> str:
    if c.x_label == "bytes":
        for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", KiB)):
            if x >= scale:
                return f"{x / scale:g} {unit}"
        return f"{x:g} B"
    return f"{x:g}"


def render_curve(c: Curve) -> str:
    """A text table: one row per x, one column per series."""
    xs = sorted({x for pts in c.series.values() for x, _ in pts})
    names = list(c.series)
    head = [f"{c.title} ({c.y_label}; {'higher' if c.higher_is_better else 'lower'} is better)"]
    head.append("  " + f"{c.x_label:>16}" + "".join(f"  {n[:26]:>26}" for n in names))
    for x in xs:
        cells = []
        for n in names:
            ys = [y for xx, y in c.series[n] if xx == x]
            cells.append(f"  {_fmt(ys[0]) if ys else '-':>26}")
        head.append("  " + f"{_fmt_x(c, x):>16}" + "".join(cells))
    for name, v in c.lines.items():
        head.append(f"  line: {name} = {_fmt(v)} {c.y_label}")
    for k, v in c.notes.items():
        head.append(f"  note: {k}: {v}")
    head.append(f"  design: {c.complexity}")
    return "\n".join(head)


def _series(curves: list[Curve], key: str, name: str) -> list[tuple[float, float]]:
    for c in curves:
        if c.key == key:
            return sorted(c.series.get(name, []))
    return []


def _spread(points) -> float | None:
    ys = [y for _, y in points if y > 0]
    return max(ys) / min(ys) if len(ys) >= 2 else None


def check_curves(curves: list[Curve], plan: Plan) -> list[dict]:
    """The targets: PASS / MISS / SKIP with the measured figures (reported, never asserted)."""
    out: list[dict] = []

    def add(target, ok, detail):
        out.append(
            {
                "target": target,
                "status": "SKIP" if ok is None else ("PASS" if ok else "MISS"),
                "detail": detail,
            }
        )

    flat = [
        ("launch_streams", "runtime"),
        ("alloc_live", "runtime"),
        ("events_streams", "runtime: event record"),
        ("events_streams", "runtime: event query"),
        ("events_streams", "runtime: stream synchronize"),
        ("events_depth", "runtime: event query (pending)"),
        ("events_depth", "runtime: stream query (pending)"),
    ]
    for key, name in flat:
        pts = _series(curves, key, name)
        s = _spread(pts)
        add(
            f"{key} / {name}: flat (max/min <= 2)",
            None if s is None else s <= 2.0,
            "not measured"
            if s is None
            else f"max/min {s:.2f} over x = {pts[0][0]:g} .. {pts[-1][0]:g}",
        )
    bar = _series(curves, "events_streams", "runtime: all-streams barrier")
    if bar:
        x, y = bar[-1]
        add(
            "all-streams barrier <= 1 us with 10^4 idle streams",
            (y <= 1.0) if x >= 10_000 else None,
            f"{y:.3g} us with {x:g} streams (1 stream: {bar[0][1]:.3g} us)",
        )
    th = _series(curves, "launch_threads", "runtime")
    if len(th) >= 2:
        loss = 1 - th[-1][1] / th[0][1]
        add(
            f"launch throughput loses <= 20% from 1 to {th[-1][0]:g} threads",
            loss <= 0.20,
            f"{th[0][1]:.3g} -> {th[-1][1]:.3g} launches/s ({loss:+.0%} loss)",
        )
    for d in ("h2d", "d2h", "d2d"):
        r = dict(_series(curves, f"copy_{d}", "runtime"))
        t = dict(_series(curves, f"copy_{d}", "torch"))
        xs = [x for x in r if x >= 64 * KiB and x in t]
        if not xs:
            add(f"copy {d.upper()} >= torch copy_ from 64 KiB", None, "torch not measured")
            continue
        worst = min(xs, key=lambda x: r[x] / t[x])
        add(
            f"copy {d.upper()} >= torch copy_ from 64 KiB",
            all(r[x] >= t[x] for x in xs),
            f"worst at {worst / KiB:g} KiB: runtime {r[worst]:.3g} GB/s vs torch {t[worst]:.3g} GB/s",
        )
    ob = {x: y for x, y in _series(curves, "object_bytes", "runtime")}
    cl = {x: y for x, y in _series(curves, "object_bytes", "pyopencl")}
    if ob:
        per_stream = max(ob.get(0, 0), ob.get(1, 0))
        add("<= 1 KB per stream (idle and used)", per_stream <= 1000, f"{per_stream:.0f} B")
        if cl:
            worse = [x for x in ob if x in cl and ob[x] > cl[x]]
            add(
                "no more bytes per object than PyOpenCL",
                not worse,
                "; ".join(f"x={x:g}: {ob[x]:.0f} vs {cl[x]:.0f} B" for x in sorted(ob) if x in cl),
            )
    return out


def render_checks(checks: list[dict]) -> str:
    lines = ["targets:"]
    for c in checks:
        lines.append(f"  {c['status']:<4}  {c['target']}: {c['detail']}")
    return "\n".join(lines)


def plot_curve(c: Curve, path: str, machine: dict) -> str | None:
    """One PNG per sweep, log axes (bars for the per-object sweep). Returns an error or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:
        return f"matplotlib is not installed ({type(e).__name__}: {e}); no plots written"
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    if c.categorical:
        names = list(c.series)
        width = 0.8 / max(1, len(names))
        for i, n in enumerate(names):
            pts = sorted(c.series[n])
            ax.bar([x + i * width for x, _ in pts], [y for _, y in pts], width, label=n)
        labels = dict(
            (int(v), k)
            for k, v in (p.split("=")[::-1] for p in c.notes.get("x", "").split(", ") if "=" in p)
        )
        ticks = sorted(labels)
        ax.set_xticks([t + 0.4 - width / 2 for t in ticks])
        ax.set_xticklabels([labels[t] for t in ticks], fontsize=8)
        ax.set_yscale("log")
    else:
        for n, pts in c.series.items():
            pts = sorted(pts)
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", ms=3, label=n)
        for name, v in c.lines.items():
            ax.axhline(v, ls="--", lw=1, color="gray")
            ax.text(ax.get_xlim()[0], v, f" {name}", fontsize=7, va="bottom", color="gray")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(c.x_label)
    ax.set_ylabel(c.y_label)
    ax.set_title(f"{c.title}\n({machine['cpu']}, {machine['cores']} cores)", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return None
