"""``python -m runtime bench``: the flags, and the run from peers to printed report.

Bad input (an unknown row or peer, an unreadable ``--from-json`` file, an output path that
cannot be written, arguments ``runtime.init`` refuses) is one ``runtime._cli.UsageError`` line
on stderr and exit code 2, checked before anything is measured where it can be.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import runtime as rt

from .._cli import ArgumentParser, UsageError, check_writable, fail_write, guard
from .._cli import init as _cli_init
from .config import ASCEND910_US, PEERS, SYSTEMS, Config
from .curves.sweeps import ALL as _ALL_SWEEPS
from .peers import Peers, _loadavg, machine_info
from .plot import write_plot
from .report import (
    check_targets,
    host_probe_summary,
    render_host_probes,
    render_markdown,
    render_table,
    render_targets,
)
from .rows import rows_for
from .run import Progress, run_rows
from .timing import timer_floor_ns

PROG = "python -m runtime bench"
CURVES = tuple(_ALL_SWEEPS)


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return n


def _parser():
    ap = ArgumentParser(
        prog=PROG,
        description=(
            "Measure the runtime's Ascend 910 reference table (stream create, event record, alloc 1 MiB, free, "
            "memcpy H2D/D2H/D2D at 1 MiB and 64 MiB, idle synchronize) and executor rows (no-op "
            "launch amortised and round trip, Python-callable launch, graph replay, a 2-stream "
            "copy->compute->copy pipeline with enablePipelining on/off, matmul scaling over 1..4 "
            "streams) beside the installed peers (numpy, PyOpenCL on PoCL, torch CPU, a stdlib "
            "thread+queue executor), in this process. Cells are microseconds per operation, "
            "median / p90; ratios are runtime / other (< 1: runtime faster). The speed targets "
            "are printed as PASS/MISS lines. Missing peers are reported, never faked."
        ),
    )
    ap.add_argument("--json", metavar="PATH", help="write results + machine info as JSON")
    ap.add_argument(
        "--plot",
        metavar="PATH",
        help="write a PNG bar chart of runtime / best peer (needs matplotlib)",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="smoke run (under 30 s; a few seconds on 2 cores): fewer repetitions, smaller "
        "sizes; its verdicts only call ratios 2x or more from a goal (NEAR otherwise)",
    )
    ap.add_argument(
        "--rows",
        metavar="SUBSTR[,SUBSTR]",
        help="only rows whose title or key contains one of these (case-insensitive)",
    )
    ap.add_argument(
        "--peers",
        metavar="LIST",
        default=",".join(PEERS),
        help=f"comma-separated peers to run (default: {','.join(PEERS)}; 'none' for runtime only)",
    )
    ap.add_argument(
        "--reps",
        type=_positive_int,
        default=None,
        help="repetitions of the latency rows (default 300, quick 20)",
    )
    ap.add_argument("--no-progress", action="store_true", help="no progress display on stderr")
    ap.add_argument(
        "--from-json",
        metavar="PATH",
        help="measure nothing: re-render a saved run (table, targets; --plot works too)",
    )
    ap.add_argument(
        "--markdown", action="store_true", help="print the table and targets as markdown"
    )
    ap.add_argument("--list", action="store_true", help="list the rows and exit")
    ap.add_argument(
        "--curves",
        metavar="DIR",
        help="measure how each cost grows (copy size, streams, threads, live allocations, "
        "queue depth, bytes per object, compute streams) instead of the table; writes "
        "DIR/curves.json and one PNG per sweep",
    )
    ap.add_argument(
        "--sweeps",
        metavar="NAME[,NAME]",
        help=f"with --curves: only these sweeps ({', '.join(CURVES)})",
    )
    ap.add_argument(
        "--mpi",
        action="store_true",
        help="instead: all_reduce over MPI beside raw mpi4py, 4 KiB..256 MiB, under mpiexec "
        "(needs mpi4py and mpiexec: pip install mpi4py mpich, the 'mpi' extra); honours --quick and --json",
    )
    ap.add_argument("--np", type=_positive_int, default=2, help="processes for --mpi (default 2)")
    return ap


#: What numpy's OpenBLAS threads spin for after each call before they sleep (2**N cycles;
#: OpenBLAS's default 2**28 is about 0.1 s, and its threads busy-spin for that long after
#: every ``np.matmul``, taking the cores from the cell measured next: the runtime's matmul
#: right after numpy's measured 2.0-2.5x numpy's time, 1.1x once those threads slept).
#: 2**4 cycles: they sleep at once, and numpy's own next call wakes them (microseconds on
#: a call of milliseconds).
OPENBLAS_THREAD_TIMEOUT = "4"

#: How many times torch's OpenMP threads (GNU libgomp) poll for the next parallel region
#: before they sleep. libgomp's default, 300,000, kept them busy into the cell measured next:
#: a 64 MiB copy right after three of torch's took 4.8-12.7 ms (5.0-5.3 once they slept),
#: and ``matmul`` 1024² read NEAR at 0.965-1.02x numpy in two runs where it read PASS at
#: 0.93-0.945 with them quiet. 10,000 polls still span the gap between torch's back-to-back
#: calls in its own cell (its 1 MiB ``copy_`` took 24.7-29.1 us with 1,000-100,000 polls
#: and 28.9 with the default; told to sleep at once, 55.9).
GOMP_SPINCOUNT = "10000"

#: The peers' thread-pool settings a benchmark run sets where the user did not: each is read
#: when its library loads, so they are set by restarting the process once.
QUIET_PEER_THREADS = {
    "OPENBLAS_THREAD_TIMEOUT": OPENBLAS_THREAD_TIMEOUT,
    "GOMP_SPINCOUNT": GOMP_SPINCOUNT,
}


def exec_with_quiet_blas(module: str, argv: list[str]) -> None:
    """For a benchmark run as a program: restart this process once with the peers' thread
    pools told not to spin after their calls into the next cell (``QUIET_PEER_THREADS``:
    numpy's OpenBLAS and torch's OpenMP, read when they load, which ``import runtime``
    already did for numpy). Returns at once when every variable is set (by the user, or by
    the restart); a value the user set is kept."""
    missing = {k: v for k, v in QUIET_PEER_THREADS.items() if k not in os.environ}
    if not missing:
        return
    os.environ.update(missing)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", module, *argv])


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--comm"]:
        # The collectives benchmark has its own flags (python -m runtime.bench.comm --help).
        from .comm import main as comm_main

        return comm_main(args[1:])
    if args[:1] == ["--shapes"]:
        # The second round's rows have their own flags (python -m runtime.bench.shapes --help).
        from .shapes import main as shapes_main

        return shapes_main(args[1:])
    return guard(PROG, _main, argv)


def _load_run(path: str) -> dict:
    """A saved run (``--json``) for ``--from-json``; anything else is a ``UsageError``."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise UsageError(f"--from-json {path}: cannot read: {e.strerror or e}") from e
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise UsageError(f"--from-json {path}: not valid JSON ({e})") from e
    want = {"rows": list, "targets": list, "machine": dict}
    if not isinstance(doc, dict) or any(not isinstance(doc.get(k), t) for k, t in want.items()):
        raise UsageError(
            f"--from-json {path}: not a benchmark result (needs 'rows', 'targets' and "
            "'machine', as written by --json)"
        )
    return doc


def _render_saved(a) -> int:
    doc = _load_run(a.from_json)
    try:
        if a.markdown:
            text = render_markdown(doc)
        else:
            table = render_table(doc["rows"], list(SYSTEMS), doc["machine"])
            if any("host_one_way_ns" in r for r in doc["rows"]):
                table += "\n" + render_host_probes(host_probe_summary(doc["rows"]))
            text = f"{table}\n\n{render_targets(doc['targets'])}"
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise UsageError(
            f"--from-json {a.from_json}: not a benchmark result ({type(e).__name__}: {e})"
        ) from e
    print(text)
    if a.plot:
        _plot(a.plot, doc["rows"], doc["machine"])
    return 0


def _plot(path: str, rows: list[dict], machine: dict) -> None:
    try:
        err = write_plot(path, rows, machine)
    except OSError as e:
        fail_write(path, "--plot", e)
    print(f"plot: {err}" if err else f"wrote {path}")


def _select_rows(rows: list, spec: str) -> list:
    """The rows ``--rows`` names; a name that matches no row is a ``UsageError``."""
    subs = [s.strip() for s in spec.split(",") if s.strip()]

    def hit(r, s):
        s = s.lower()
        return s in r.title.lower() or s.replace(" ", "_") in r.key

    unmatched = [s for s in subs if not any(hit(r, s) for r in rows)]
    if unmatched or not subs:
        bad = ", ".join(repr(s) for s in unmatched or [spec])
        names = ", ".join(r.key for r in rows)
        raise UsageError(f"--rows: no row matches {bad}; rows: {names}")
    return [r for r in rows if any(hit(r, s) for s in subs)]


def _curves(a, wanted: list[str]) -> int:
    """``--curves DIR``: the sweeps instead of the table."""
    from . import curves

    if os.path.isdir(a.curves):
        check_writable(os.path.join(a.curves, "curves.json"), "--curves")
    elif os.path.exists(a.curves):
        raise UsageError(f"--curves {a.curves}: exists and is not a directory")
    else:
        check_writable(a.curves, "--curves")  # its parent must exist and be writable
    only = None
    if a.sweeps:
        only = [s.strip() for s in a.sweeps.split(",") if s.strip()]
        bad = [s for s in only if s not in CURVES]
        if bad or not only:
            raise UsageError(
                f"--sweeps: unknown sweep(s) {', '.join(repr(s) for s in bad or [a.sweeps])}; "
                f"sweeps: {', '.join(CURVES)}"
            )
    started_here = not rt.is_initialized()
    if started_here:
        _cli_init()
    try:
        return curves.run(a.curves, a.quick, wanted, only, progress=not a.no_progress)
    finally:
        if started_here:
            rt.shutdown()


def _main(argv: list[str] | None) -> int:
    a = _parser().parse_args(argv)
    for flag, path in (("--json", a.json), ("--plot", a.plot)):
        if path and not (flag == "--json" and a.from_json):
            check_writable(path, flag)
    if a.from_json:
        return _render_saved(a)
    if a.mpi:
        from .mpi import run as run_mpi

        return run_mpi(a.np, a.quick, a.json)
    cfg = Config(a.quick, a.reps)
    wanted = (
        [] if a.peers.strip() == "none" else [p.strip() for p in a.peers.split(",") if p.strip()]
    )
    bad = [p for p in wanted if p not in PEERS]
    if bad:
        raise UsageError(
            f"--peers: unknown peer(s) {', '.join(repr(p) for p in bad)}; "
            f"choose from {', '.join(PEERS)}, or 'none'"
        )
    if a.curves:
        return _curves(a, wanted)
    rows = rows_for(cfg)
    if a.rows:
        rows = _select_rows(rows, a.rows)
    if a.list:
        for r in rows:
            print(f"{r.key:<24} {r.title}")
        return 0

    started_here = not rt.is_initialized()
    if started_here:
        _cli_init()
    t_start = time.monotonic()
    try:
        peers = Peers(wanted)
        systems = ["runtime"] + [p for p in PEERS if p in wanted]
        for p in PEERS:
            if p not in wanted:
                peers.missing.setdefault(p, "not selected (--peers)")
        machine = machine_info(peers)
        # Park everything alive now (torch alone is ~10^5 objects) outside the collector, so
        # the full collection before each cell is cheap.
        gc.collect()
        gc.freeze()
        floor = timer_floor_ns()
        # Count only the cells that will run: a peer that is not installed has none.
        total = sum(1 for r in rows for s in systems if s in r.impls and s not in peers.missing)
        progress = Progress(total, enabled=not a.no_progress)
        try:
            results = run_rows(rows, systems, cfg, peers, progress)
        finally:
            progress.close()
        targets = check_targets(results, cfg, peers)
    finally:
        if started_here:
            rt.shutdown()
    elapsed = time.monotonic() - t_start
    machine["loadavg_end"] = _loadavg()

    print(render_table(results, systems, machine))
    print()
    print(
        f"timer: perf_counter_ns pair {floor['perf_counter_ns_pair']:.0f} ns, empty loop iteration "
        f"{floor['empty_loop_iteration']:.1f} ns (included in every cell alike); Ascend 910 reference: stream create "
        "10 us, event record 1 us, alloc 1 MB 100 us, memcpy 500 us per MiB, idle sync 1 us"
    )
    print(
        f"ran in {elapsed:.1f} s ({'quick' if cfg.quick else 'full'}); load average "
        f"{machine['loadavg_start']} at start, {machine['loadavg_end']} at end (other processes "
        "on this host add noise: compare p90 with median); numpy's OpenBLAS threads: "
        + (
            f"OPENBLAS_THREAD_TIMEOUT={machine['openblas_thread_timeout']} (they sleep after "
            "each call instead of spinning into the next cell)"
            if machine.get("openblas_thread_timeout")
            else "spinning after each call (OpenBLAS's default; the cell after numpy's is slowed)"
        )
        + "; torch's OpenMP threads: "
        + (
            f"GOMP_SPINCOUNT={machine['gomp_spincount']} (they sleep soon after each call)"
            if machine.get("gomp_spincount")
            else "spinning after each call (libgomp's default; the cell after torch's is slowed)"
        )
    )
    print(render_host_probes(host_probe_summary(results)))
    print()
    print(render_targets(targets))

    rc = 0
    if any(r["results"].get("runtime", {}).get("status") == "error" for r in results):
        rc = 1
    if a.json:
        doc = {
            "machine": machine,
            "mode": "quick" if cfg.quick else "full",
            "elapsed_s": round(elapsed, 2),
            "timer_floor_ns": floor,
            "config": {k: v for k, v in vars(cfg).items()},
            "ascend910_us": ASCEND910_US,
            "missing_peers": {p: why for p, why in peers.missing.items()},
            "rows": results,
            "targets": targets,
        }
        try:
            with open(a.json, "w") as f:
                json.dump(doc, f, indent=1)
        except OSError as e:
            fail_write(a.json, "--json", e)
        print(f"\nwrote {a.json}")
    if a.plot:
        _plot(a.plot, results, machine)
    return rc
