"""Results into words: row summaries and ratios, the targets' PASS / MISS lines, the text
table and the markdown table.

Everything here works on the JSON-shaped dicts a run produces (or ``--from-json`` loads), so a
saved run renders exactly like a live one.
"""

from __future__ import annotations

import os

from .config import SYSTEMS, Config, MiB
from .peers import Peers
from .rows import Row


def summarise_row(row: Row, res: dict) -> dict:
    d = {
        "key": row.key,
        "title": row.title,
        "unit": "us per op (lower is better)",
        "note": row.note,
        "ascend910_us": row.ascend910_us,
        "nbytes": row.nbytes,
        "results": res,
    }
    r = res.get("runtime", {})
    if r.get("status") == "ok":
        if row.ascend910_us:
            d["ratio_ascend910"] = r["median_us"] / row.ascend910_us
        peers = [
            (c["median_us"], p)
            for p, c in res.items()
            if p != "runtime" and c.get("status") == "ok"
        ]
        if peers:
            best, name = min(peers)
            d["best_peer"] = name
            d["ratio_best_peer"] = r["median_us"] / best
    if row.nbytes:
        for c in res.values():
            if c.get("status") == "ok":
                c["gbps_median"] = row.nbytes / (c["median_us"] * 1e3)
                c["gbps_p90"] = row.nbytes / (c["p90_us"] * 1e3)
    return d


def add_group_ratios(rows: list[dict]):
    """Speed-up over 1 stream for the scaling rows; pipelining on/off ratio."""
    base = next((r for r in rows if r["key"] == "matmul_streams_1"), None)
    for r in rows:
        if base and r["key"].startswith("matmul_streams_"):
            for sysname, c in r["results"].items():
                b = base["results"].get(sysname, {})
                if c.get("status") == "ok" and b.get("status") == "ok":
                    c["speedup_vs_1_stream"] = b["median_us"] / c["median_us"]
    on = next((r for r in rows if r["key"] == "pipeline_on"), None)
    off = next((r for r in rows if r["key"] == "pipeline_off"), None)
    if on and off:
        a, b = on["results"].get("runtime", {}), off["results"].get("runtime", {})
        if a.get("status") == "ok" and b.get("status") == "ok":
            off["pipelining_speedup"] = b["median_us"] / a["median_us"]


# --------------------------------------------------------------------------------------
# targets


def _med(rows, key, system):
    for r in rows:
        if r["key"] == key:
            c = r["results"].get(system, {})
            return c.get("median_us") if c.get("status") == "ok" else None
    return None


def _row(rows, key):
    return next((r for r in rows if r["key"] == key), None)


def check_targets(rows, cfg: Config, peers: Peers) -> list[dict]:
    out = []

    def add(name, status, detail):
        out.append({"target": name, "status": status, "detail": detail})

    def compare(name, key, peer, factor, peer_key=None, peer_label=None):
        """runtime median of ``key`` <= factor x peer median of ``peer_key``."""
        r = _med(rows, key, "runtime")
        p = _med(rows, peer_key or key, peer)
        label = peer_label or peer
        if _row(rows, key) is None:
            return add(name, "SKIP", "row not run")
        if r is None:
            return add(name, "SKIP", "runtime not measured")
        if p is None:
            why = peers.missing.get(peer, "not measured")
            return add(name, "SKIP", f"{label} missing: {why}")
        ok = r <= factor * p
        detail = f"runtime {fmt_us(r)} us vs {label} {fmt_us(p)} us: ratio {r / p:.3g} (needs <= {factor:g})"
        if not ok and r <= factor * p * 1.05:
            detail += "; within 5%, inside this host's noise"
        add(name, "PASS" if ok else "MISS", detail)

    compare("alloc 1 MiB zeroed <= 0.5x numpy np.zeros", "alloc_1m", "numpy", 0.5)
    compare("free <= PyOpenCL buffer release", "free_1m", "pyopencl", 1.0)
    copy_peer = "torch" if peers.torch is not None else "numpy"
    copy_call = "torch copy_" if copy_peer == "torch" else "numpy np.copyto (torch missing)"
    big = cfg.big // MiB
    for d in ("h2d", "d2h", "d2d"):
        compare(
            f"1 MiB {d.upper()} copy no slower than {copy_call}",
            f"copy_{d}_1m",
            copy_peer,
            1.0,
        )
    for d in ("h2d", "d2h", "d2d"):
        # bandwidth >= peer bandwidth  <=>  time <= peer time
        compare(
            f"{big} MiB {d.upper()} copy bandwidth >= {copy_call}",
            f"copy_{d}_{big}m",
            copy_peer,
            1.0,
        )
    compare("event record <= 0.35x PyOpenCL marker", "event_record", "pyopencl", 0.35)
    compare("idle synchronize <= PyOpenCL finish", "sync_idle", "pyopencl", 1.0)
    compare("stream create <= OpenCL queue create", "stream_create", "pyopencl", 1.0)
    compare(
        "native no-op launch, amortised <= 0.2x PyOpenCL enqueue",
        "launch_amortised",
        "pyopencl",
        0.2,
    )
    compare("launch + sync <= 0.2x PyOpenCL enqueue + finish", "launch_sync", "pyopencl", 0.2)
    compare(
        "Python-callable launch <= stdlib thread + queue",
        "pylaunch_amortised",
        "stdlib",
        1.0,
    )
    # graph replay >= 5x cheaper than 100 individual launches (both + synchronize)
    a = _med(rows, "launch_100_sync", "runtime")
    g = _med(rows, "graph_replay_sync", "runtime")
    name = f"graph replay of {cfg.graph_nodes} no-ops >= 5x cheaper than {cfg.graph_nodes} launches"
    if a is None or g is None:
        add(name, "SKIP", "rows not run")
    else:
        detail = f"{cfg.graph_nodes} launches + sync {fmt_us(a)} us vs replay + sync {fmt_us(g)} us: {a / g:.3g}x"
        la = _med(rows, "launch_amortised", "runtime")
        ga = _med(rows, "graph_replay_amortised", "runtime")
        if la is not None and ga is not None:
            detail += f" (amortised: {cfg.graph_nodes} x {fmt_us(la)} us vs {fmt_us(ga)} us per replay: {cfg.graph_nodes * la / ga:.3g}x)"
        add(name, "PASS" if a / g >= 5 else "MISS", detail + " (needs >= 5x)")
    # 2 streams >= 1.7x one stream
    r2 = _row(rows, "matmul_streams_2")
    name = "2 streams of compute-bound kernels >= 1.7x one stream"
    c = r2["results"].get("runtime", {}) if r2 else {}
    if "speedup_vs_1_stream" not in c:
        add(name, "SKIP", "rows not run")
    else:
        s = c["speedup_vs_1_stream"]
        add(
            name,
            "PASS" if s >= 1.7 else "MISS",
            f"throughput 2 streams / 1 stream = {s:.3g}x (needs >= 1.7; host has {os.cpu_count()} cores)",
        )
    return out


# --------------------------------------------------------------------------------------
# output


def fmt_us(v):
    if v is None:
        return "-"
    if v >= 1000:
        return f"{v:,.0f}"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    if v >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def _cell_text(c):
    st = c.get("status")
    if st == "ok":
        return f"{fmt_us(c['median_us'])} / {fmt_us(c['p90_us'])}"
    if st == "missing":
        return "missing"
    if st == "error":
        return "ERROR"
    return "n/a"


def _gbps_text(c):
    if c.get("status") != "ok" or "gbps_median" not in c:
        return ""
    return f"{c['gbps_median']:.1f} / {c['gbps_p90']:.1f}"


def _enqueue_text(c):
    if "enqueue_median_us" not in c:
        return ""
    return f"{fmt_us(c['enqueue_median_us'])} / {fmt_us(c['final_sync_median_us'])}"


def _speedup_text(c):
    if "speedup_vs_1_stream" not in c:
        return ""
    return f"x{c['speedup_vs_1_stream']:.2f}"


def render_table(rows, systems, machine) -> str:
    shown = [
        s
        for s in systems
        if any(r["results"].get(s, {}).get("status") not in (None, "missing") for r in rows)
    ]
    missing = [s for s in systems if s not in shown]
    w0 = max(34, *(len(r["title"]) for r in rows)) + 2
    wc = 19
    lines = []
    lines.append(
        f"runtime {machine['runtime']} on {machine['cpu']} ({machine['cores']} cores), Python {machine['python']}"
    )
    lines.append("Each cell: microseconds per operation, median / p90 (lower is better).")
    lines.append(
        "x 910 = runtime median / the Ascend 910 reference figure; x best peer = runtime median / fastest peer median."
    )
    lines.append("Both ratios: < 1 means runtime is faster, > 1 means runtime is slower.")
    head = (
        f"{'operation':<{w0}}"
        + "".join(f"{s:>{wc}}" for s in shown)
        + f"{'x 910':>9}  {'x best peer':<20}"
    )
    lines.append("")
    lines.append(head)
    lines.append("-" * len(head))
    for r in rows:
        cells = "".join(
            f"{_cell_text(r['results'].get(s, {'status': 'n/a'})):>{wc}}" for s in shown
        )
        xs = f"{r['ratio_ascend910']:.3g}" if "ratio_ascend910" in r else "-"
        xb = f"{r['ratio_best_peer']:.3g} ({r['best_peer']})" if "ratio_best_peer" in r else "-"
        lines.append(f"{r['title']:<{w0}}{cells}{xs:>9}  {xb:<20}")
        res = r["results"]
        subs = [
            ("  GB/s (at median / at p90)", _gbps_text),
            ("  enqueue-only / final sync (us)", _enqueue_text),
            ("  throughput vs 1 stream (>1 better)", _speedup_text),
        ]
        for label, f in subs:
            texts = [f(res.get(s, {})) for s in shown]
            if any(texts):
                lines.append(f"{label:<{w0}}" + "".join(f"{t:>{wc}}" for t in texts))
        if "pipelining_speedup" in r:
            lines.append(
                f"{'  pipelining on vs off (>1: on faster)':<{w0}}{'x' + format(r['pipelining_speedup'], '.2f'):>{wc}}"
            )
    notes = []
    for r in rows:
        for s, c in r["results"].items():
            if c.get("status") == "error":
                notes.append(f"  ERROR {r['title']} / {s}: {c['reason']}")
    if notes:
        lines.append("")
        lines.append("errors:")
        lines.extend(notes)
    if missing:
        lines.append("")
        lines.append("missing peers:")
        for s in missing:
            reason = next(
                (
                    r["results"][s]["reason"]
                    for r in rows
                    if r["results"].get(s, {}).get("status") == "missing"
                ),
                "not selected",
            )
            lines.append(f"  {s}: {reason}")
    return "\n".join(lines)


def render_targets(targets) -> str:
    lines = ["targets (median vs median; reported, not asserted):"]
    for t in targets:
        lines.append(f"  {t['status']:<4}  {t['target']}: {t['detail']}")
    counts = {s: sum(t["status"] == s for t in targets) for s in ("PASS", "MISS", "SKIP")}
    lines.append(f"  -> {counts['PASS']} PASS, {counts['MISS']} MISS, {counts['SKIP']} SKIP")
    return "\n".join(lines)


def _md_cell(c):
    st = c.get("status")
    if st == "ok":
        return f"{fmt_us(c['median_us'])} / {fmt_us(c['p90_us'])}"
    return {"missing": "missing", "error": "ERROR"}.get(st, "n/a")


def render_markdown(doc) -> str:
    """The result table and the targets as GitHub markdown (from a run's JSON document)."""
    rows = doc["rows"]
    shown = [
        s
        for s in SYSTEMS
        if any(r["results"].get(s, {}).get("status") not in (None, "missing") for r in rows)
    ]
    out = [
        "| operation (us per op: median / p90) | "
        + " | ".join(shown)
        + " | x 910 (<1: faster) | x best peer (<1: faster) |",
        "|---" * (len(shown) + 3) + "|",
    ]
    for r in rows:
        res = r["results"]
        xs = f"{r['ratio_ascend910']:.3g}" if "ratio_ascend910" in r else ""
        xb = f"{r['ratio_best_peer']:.3g} ({r['best_peer']})" if "ratio_best_peer" in r else ""
        cells = [_md_cell(res.get(s, {})) for s in shown]
        out.append(f"| {r['title']} | " + " | ".join(cells) + f" | {xs} | {xb} |")
        for label, f in (
            ("GB/s (at median / at p90)", _gbps_text),
            ("enqueue-only / final sync (us)", _enqueue_text),
            ("throughput vs 1 stream (>1: better)", _speedup_text),
        ):
            texts = [f(res.get(s, {})) for s in shown]
            if any(texts):
                out.append(f"| &nbsp;&nbsp;└ {label} | " + " | ".join(texts) + " | | |")
        if "pipelining_speedup" in r:
            pad = " | ".join([""] * (len(shown) - 1))
            out.append(
                f"| &nbsp;&nbsp;└ pipelining on vs off (>1: on faster) | x{r['pipelining_speedup']:.2f} | {pad} | | |"
            )
    out.append("")
    out.append("| target | status | measured |")
    out.append("|---|---|---|")
    for t in doc["targets"]:
        out.append(f"| {t['target']} | **{t['status']}** | {t['detail']} |")
    return "\n".join(out)
