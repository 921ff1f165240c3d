"""Command line: ``python -m runtime`` shows the devices (an npu-smi-like table).

Sub-commands: ``bench`` (the seed's performance table beside the peers), ``trace-plot``.
Bad input on any of them is one ``python -m runtime...: error: ...`` line on stderr and exit
code 2 (``runtime._cli``).
"""

from __future__ import annotations

import json
import sys

import runtime

from . import _cli


def _gib(n: float) -> str:
    return f"{n / 1024**3:.1f}"


def device_rows() -> list[dict]:
    rows = []
    for i in range(runtime.get_device_count()):
        p = runtime.get_device_properties(i)
        m = runtime.get_device_memory_info(i)
        rows.append({**p.to_dict(), "memory_used": m.used, "memory_reserved": m.reserved})
    return rows


def table(rows: list[dict]) -> str:
    head = f"| {'Dev':>3} | {'Name':<34} | {'Memory used / total (GiB)':>26} | {'Clock MHz':>9} | {'Cores':>5} | {'Peak TFLOPS':>11} | {'BW GB/s':>8} |"
    sep = "+" + "+".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "+"
    out = [
        sep,
        f"| runtime {runtime.__version__}: {len(rows)} virtual devices (host-backed)".ljust(
            len(head) - 1
        )
        + "|",
        sep,
        head,
        sep,
    ]
    for r in rows:
        mem = f"{_gib(r['memory_used'])} / {_gib(r['total_memory'])}"
        out.append(
            f"| {r['index']:>3} | {r['name'][:34]:<34} | {mem:>26} | {r['clock_rate'] / 1000:>9.0f} | {r['cores']:>5} | {r['fpeak'] / 1e12:>11.1f} | {r['memory_bandwidth'] / 1e9:>8.0f} |"
        )
    out.append(sep)
    return "\n".join(out)


PROG = "python -m runtime"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":
        from . import bench

        return bench.main(argv[1:])
    if argv and argv[0] == "trace-plot":
        from . import trace

        return trace.plot_main(argv[1:])
    return _cli.guard(PROG, _show_devices, argv)


def _show_devices(argv: list[str] | None) -> int:
    ap = _cli.ArgumentParser(
        prog=PROG,
        description="Show the runtime's virtual devices. Sub-commands: 'bench' (performance "
        "table beside the peers; see 'python -m runtime bench --help'), 'trace-plot TRACE.json OUT.png'.",
    )
    ap.add_argument("--json", action="store_true", help="print the device list as JSON")
    ap.add_argument("--version", action="store_true", help="print the version and exit")
    ap.add_argument(
        "--device-count", type=int, default=None, help="number of devices (default: env or 8)"
    )
    ap.add_argument("--memory", default=None, help='memory per device, e.g. "16GiB"')
    ap.add_argument("--profile", default=None, help="device profile: ascend910 or host")
    a = ap.parse_args(argv)
    if a.version:
        print(f"runtime {runtime.__version__}")
        return 0
    _cli.init(device_count=a.device_count, memory=a.memory, profile=a.profile)
    try:
        rows = device_rows()
        print(json.dumps(rows, indent=2) if a.json else table(rows))
    finally:
        runtime.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
