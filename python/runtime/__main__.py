"""Command line: ``python -m runtime`` shows the devices (an npu-smi-like table).

Installed as ``runtime-smi`` too. Sub-commands: ``bench`` (the Ascend 910 reference table
beside the peers), ``trace-plot`` (a trace as a timeline picture; needs matplotlib).
Bad input on any of them is one ``python -m runtime...: error: ...`` line on stderr and exit
code 2 (``runtime._cli``).
"""

from __future__ import annotations

import json
import sys

import runtime

from . import _cli
from ._units import binary_size

#: Footnote for the columns that are figures of the device profile, not of this machine.
MODELLED_NOTE = (
    "* modelled: the profile's figures (the virtual device runs on host threads and memory)"
)


def device_rows() -> list[dict]:
    rows = []
    for i in range(runtime.get_device_count()):
        p = runtime.get_device_properties(i)
        m = runtime.get_device_memory_info(i)
        rows.append({**p.to_dict(), "memory_used": m.used, "memory_reserved": m.reserved})
    return rows


def table(rows: list[dict]) -> str:
    head = f"| {'Dev':>3} | {'Name':<34} | {'Memory used / total':>24} | {'Clock MHz*':>10} | {'Cores*':>6} | {'Peak TFLOPS*':>12} | {'BW GB/s*':>8} |"
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
        mem = f"{binary_size(r['memory_used'])} / {binary_size(r['total_memory'])}"
        out.append(
            f"| {r['index']:>3} | {r['name'][:34]:<34} | {mem:>24} | {r['clock_rate'] / 1000:>10.0f} | {r['cores']:>6} | {r['fpeak'] / 1e12:>12.1f} | {r['memory_bandwidth'] / 1e9:>8.0f} |"
        )
    out.append(sep)
    out.append(MODELLED_NOTE)
    return "\n".join(out)


PROG = "python -m runtime"


def _prog() -> str:
    """The name the user typed: ``runtime-smi`` when run through that entry point."""
    return "runtime-smi" if sys.argv and sys.argv[0].endswith("runtime-smi") else PROG


def main(argv: list[str] | None = None) -> int:
    as_program = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":
        from . import bench

        if as_program:
            bench.cli.exec_with_quiet_blas("runtime", argv)
        return bench.main(argv[1:])
    if argv and argv[0] == "trace-plot":
        from . import trace

        return trace.plot_main(argv[1:])
    return _cli.guard(_prog(), _show_devices, argv)


def _show_devices(argv: list[str] | None) -> int:
    prog = _prog()
    pad = " " * len("usage: ")
    ap = _cli.ArgumentParser(
        prog=prog,
        usage=(
            f"{prog} [--json] [--version] [--device-count N] [--memory SIZE] [--profile NAME]\n"
            f"{pad}{prog} bench [--quick] [...]          (see '{prog} bench --help')\n"
            f"{pad}{prog} trace-plot TRACE.json OUT.png  (needs matplotlib: the 'plot' extra)"
        ),
        description="Show the runtime's virtual devices (memory in use, capacity and the "
        "profile's modelled figures). Sub-commands: 'bench' measures the runtime beside its "
        "peers; 'trace-plot' draws a trace written by runtime.profile().",
    )
    ap.add_argument("--json", action="store_true", help="print the device list as JSON")
    ap.add_argument("--version", action="store_true", help="print the version and exit")
    ap.add_argument(
        "--device-count",
        type=_cli.integer("--device-count"),
        default=None,
        metavar="N",
        help="number of devices, 1 to 64 (default: RUNTIME_DEVICE_COUNT or 8)",
    )
    ap.add_argument(
        "--memory",
        default=None,
        metavar="SIZE",
        help='memory per device, e.g. "16GiB" (KiB/MiB/GiB are powers of 1024; KB/MB/GB powers of 1000)',
    )
    ap.add_argument(
        "--profile", default=None, metavar="NAME", help="device profile: ascend910 or host"
    )
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
