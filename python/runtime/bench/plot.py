"""The PNG bar chart of runtime / best peer per row; matplotlib is imported only here, lazily."""

from __future__ import annotations


def write_plot(path, rows, machine) -> str | None:
    """PNG bar chart of runtime / best peer per row (log scale). Returns an error or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:
        return f"matplotlib is not installed ({type(e).__name__}: {e}); no plot written"
    data = [
        (r["title"], r["ratio_best_peer"], r["best_peer"]) for r in rows if "ratio_best_peer" in r
    ]
    if not data:
        return "no row has both runtime and a peer; no plot written"
    data.reverse()
    fig, ax = plt.subplots(figsize=(10, 0.38 * len(data) + 1.6))
    ys = range(len(data))
    vals = [d[1] for d in data]
    colors = ["#2e7d32" if v <= 1 else "#c62828" for v in vals]
    ax.barh(list(ys), vals, color=colors)
    ax.set_xscale("log")
    ax.set_xlim(min(vals) / 2, max(max(vals), 1.0) * 4)
    ax.axvline(1.0, color="black", lw=1)
    ax.set_yticks(list(ys))
    ax.set_yticklabels(
        [f"{t}  [{p}]" for t, p, _ in [(d[0], d[2], None) for d in data]], fontsize=8
    )
    for y, v in zip(ys, vals):
        ax.text(v, y, f" {v:.2g}x", va="center", fontsize=7)
    ax.set_xlabel("runtime median / best peer median (log scale; < 1: runtime faster, green)")
    ax.set_title(
        f"runtime {machine['runtime']} vs fastest installed peer ({machine['cpu']}, {machine['cores']} cores)",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
