"""A readable table of one device's allocator state, after torch.cuda.memory_summary."""

from __future__ import annotations

from . import _runtime
from ._units import binary_size as _fmt


def memory_summary(device=None) -> str:
    """Return (not print) a table of the allocator statistics of ``device``."""
    s = _runtime.memory_stats(device)
    rows = [
        ("Allocated (live)", _fmt(s["allocated"]), _fmt(s["peak_allocated"])),
        ("Requested", _fmt(s["requested"]), ""),
        ("Reserved", _fmt(s["reserved"]), _fmt(s["peak_reserved"])),
        ("Cached (reusable)", _fmt(s["cached"]), ""),
        ("Free", _fmt(s["free"]), ""),
        ("Total", _fmt(s["total"]), ""),
        ("Largest free block", _fmt(s["largest_free_block"]), ""),
        ("Free blocks", str(s["free_blocks"]), ""),
        ("Fragmentation", f"{s['fragmentation']:.3f}", ""),
        ("Live allocations", str(s["active_allocations"]), ""),
        ("Allocs / frees", f"{s['num_allocs']} / {s['num_frees']}", ""),
        ("Cache hits / flushes", f"{s['cache_hits']} / {s['cache_flushes']}", ""),
        ("Out-of-memory errors", str(s["num_ooms"]), ""),
    ]
    w = max(len(r[0]) for r in rows)
    line = "=" * (w + 32)
    out = [
        line,
        f" Memory summary, device {s['device']}".ljust(w + 32),
        line,
        f" {'Metric'.ljust(w)}  {'Current':>13}  {'Peak':>13}",
        "-" * (w + 32),
    ]
    out += [f" {a.ljust(w)}  {b:>13}  {c:>13}" for a, b, c in rows]
    out.append(line)
    return "\n".join(out)
