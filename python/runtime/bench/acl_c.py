"""The ACL C library's per-call cost (``libascendcl.so`` from C) beside the same operations
from Python (``runtime.acl``, pyACL's face, and the native ``runtime`` API) and the Ascend 910
reference table.

``python -m runtime.bench.acl_c [--rounds N] [--batch K] [--json PATH]``

The C side is ``acl_c_bench.c`` (beside this file), compiled with ``cc -O2`` against the
installed library (``python -m runtime.acl --cflags --libs``) and run as its own process (a
plain C program: the library's own runtime). Rounds alternate: one round of the C program (K
calls per operation; the copy and callback rows K/10; each run of the program first does an
unrecorded warm-up round), then one round of each Python form in this process, N times, so
every form sees the same machine load; each row reports the median microseconds per call and
the median of the per-round ratios to C.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
from time import perf_counter_ns as _now

from .. import _cli

PROG = "python -m runtime.bench.acl_c"
MiB = 1 << 20
SOURCE = pathlib.Path(__file__).with_name("acl_c_bench.c")

#: operation -> (what it measures, the Ascend 910 reference figure in us or None)
OPS = {
    "malloc_free_1MiB": ("aclrtMalloc + aclrtFree, 1 MiB", 100.0),
    "create_stream": ("aclrtCreateStream", 10.0),
    "record_event": ("aclrtRecordEvent (idle stream)", 1.0),
    "memcpy_async_1MiB_sync": ("aclrtMemcpyAsync 1 MiB H2D + aclrtSynchronizeStream", 500.0),
    "callback_round_trip": ("aclrtLaunchCallback (block) + aclrtSynchronizeStream", None),
}
SEED_NOTE = {
    "malloc_free_1MiB": "allocate 1 MB (zeroed): 100 us",
    "create_stream": "stream create: 10 us",
    "record_event": "event record: 1 us",
    "memcpy_async_1MiB_sync": "memcpy: 500 us per MB",
    "callback_round_trip": "(not in the table)",
}


def _median(v: list[float]) -> float:
    s = sorted(v)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def build(out_dir: str) -> str:
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise _cli.UsageError("no C compiler (cc, gcc or clang) on PATH")
    from ..acl import clib

    try:
        flags = [*clib.cflags().split(), *clib.libs().split()]
    except OSError as e:
        raise _cli.UsageError(str(e)) from e
    exe = os.path.join(out_dir, "acl_c_bench")
    cmd = [cc, "-std=c11", "-O2", str(SOURCE), *flags, "-lpthread", "-o", exe]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        raise _cli.UsageError(f"compiling {SOURCE.name} failed: {out.stderr.strip()}")
    return exe


def c_round(exe: str, batch: int) -> dict[str, float]:
    out = subprocess.run([exe, "1", str(batch)], capture_output=True, text=True, timeout=600)
    if out.returncode:
        raise RuntimeError(f"{exe} failed: {out.stderr.strip()}")
    res = {}
    for line in out.stdout.split("\n"):
        if line.strip():
            name, ns = line.split()
            res[name] = float(ns) / 1e3
    return res


class PythonForms:
    """The same operations through ``runtime.acl`` and through the native ``runtime`` API."""

    def __init__(self) -> None:
        import runtime
        import runtime.acl as acl

        self.rt, self.acl = runtime, acl
        assert acl.init() == 0 and acl.rt.set_device(0) == 0
        self.s, _ = acl.rt.create_stream()
        self.ev, _ = acl.rt.create_event()
        self.h, _ = acl.rt.malloc_host(MiB)
        self.d, _ = acl.rt.malloc(MiB, 0)
        self.calls = 0
        self.stop = False
        ready = threading.Event()

        def serve() -> None:
            acl.rt.subscribe_report(threading.get_ident(), self.s)
            ready.set()
            while not self.stop:
                acl.rt.process_report(50)

        self.reporter = threading.Thread(target=serve, daemon=True)
        self.reporter.start()
        ready.wait()
        self.nstream = runtime.Stream(0)
        self.nev = runtime.Event()
        self.nbuf = runtime.device_malloc(0, MiB)
        self.nhost = runtime.malloc_host(MiB)

    def _cb(self, _data=None) -> None:
        self.calls += 1

    def acl_round(self, k: int) -> dict[str, float]:
        acl, ok, res = self.acl, 0, {}
        t = _now()
        for _ in range(k):
            p, ret = acl.rt.malloc(MiB, 0)
            assert ret == ok and acl.rt.free(p) == ok
        res["malloc_free_1MiB"] = (_now() - t) / k / 1e3
        made = []
        t = _now()
        for _ in range(k):
            made.append(acl.rt.create_stream())
        res["create_stream"] = (_now() - t) / k / 1e3
        for h, ret in made:
            assert ret == ok and acl.rt.destroy_stream(h) == ok
        t = _now()
        for _ in range(k):
            acl.rt.record_event(self.ev, self.s)
        res["record_event"] = (_now() - t) / k / 1e3
        assert acl.rt.synchronize_stream(self.s) == ok
        n = max(1, k // 10)
        t = _now()
        for _ in range(n):
            acl.rt.memcpy_async(self.d, MiB, self.h, MiB, 1, self.s)
            acl.rt.synchronize_stream(self.s)
        res["memcpy_async_1MiB_sync"] = (_now() - t) / n / 1e3
        t = _now()
        for _ in range(n):
            acl.rt.launch_callback(self._cb, None, 1, self.s)
            acl.rt.synchronize_stream(self.s)
        res["callback_round_trip"] = (_now() - t) / n / 1e3
        return res

    def native_round(self, k: int) -> dict[str, float]:
        rt, res = self.rt, {}
        t = _now()
        for _ in range(k):
            rt.device_free(rt.device_malloc(0, MiB))
        res["malloc_free_1MiB"] = (_now() - t) / k / 1e3
        made = []
        t = _now()
        for _ in range(k):
            made.append(rt.Stream(0))
        res["create_stream"] = (_now() - t) / k / 1e3
        for s in made:
            s.destroy()
        t = _now()
        for _ in range(k):
            self.nev.record(self.nstream)
        res["record_event"] = (_now() - t) / k / 1e3
        self.nstream.synchronize()
        n = max(1, k // 10)
        t = _now()
        for _ in range(n):
            rt.memcpy_host_to_device(self.nbuf, self.nhost, self.nstream)
            self.nstream.synchronize()
        res["memcpy_async_1MiB_sync"] = (_now() - t) / n / 1e3
        t = _now()
        for _ in range(n):
            self.nstream.launch_host_func(self._cb)
            self.nstream.synchronize()
        res["callback_round_trip"] = (_now() - t) / n / 1e3
        return res

    def close(self) -> None:
        self.stop = True
        self.reporter.join()
        self.nstream.destroy()
        assert self.acl.finalize() == 0


def measure(rounds: int, batch: int, progress=None) -> list[dict]:
    samples: dict[str, dict[str, list[float]]] = {
        op: {"c": [], "acl": [], "native": []} for op in OPS
    }
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(tmp)
        forms = PythonForms()
        try:
            # Warm-up, not recorded (the C program warms itself up the same way).
            forms.acl_round(max(1, batch // 10))
            forms.native_round(max(1, batch // 10))
            for r in range(rounds):
                for form, res in (
                    ("c", c_round(exe, batch)),
                    ("acl", forms.acl_round(batch)),
                    ("native", forms.native_round(batch)),
                ):
                    for op, us in res.items():
                        samples[op][form].append(us)
                if progress:
                    progress(r + 1, rounds)
        finally:
            forms.close()
    rows = []
    for op, s in samples.items():
        what, reference = OPS[op]
        rows.append(
            {
                "op": op,
                "what": what,
                "c_us": _median(s["c"]),
                "acl_us": _median(s["acl"]),
                "native_us": _median(s["native"]),
                "acl_over_c": _median([a / c for a, c in zip(s["acl"], s["c"])]),
                "native_over_c": _median([a / c for a, c in zip(s["native"], s["c"])]),
                "reference_us": reference,
                "samples": s,
            }
        )
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        "| operation | C (us/call) | runtime.acl (us) | x C | runtime API (us) | x C | Ascend 910 reference | C / reference |",
        "|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        ref = r["reference_us"]
        vs = f"{r['c_us'] / ref:.3f}" if ref else "-"
        lines.append(
            f"| {r['what']} | {r['c_us']:.2f} | {r['acl_us']:.2f} | {r['acl_over_c']:.2f} "
            f"| {r['native_us']:.2f} | {r['native_over_c']:.2f} | {SEED_NOTE[r['op']]} | {vs} |"
        )
    return "\n".join(lines)


def _main(argv: list[str] | None) -> int:
    ap = _cli.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=11, help="alternating C/Python rounds")
    ap.add_argument("--batch", type=int, default=200, help="calls per operation and round")
    ap.add_argument("--json", default=None, help="also write every sample to this file")
    a = ap.parse_args(argv)
    if a.rounds < 1 or a.batch < 1:
        raise _cli.UsageError("--rounds and --batch must be >= 1")
    if a.json:
        _cli.check_writable(a.json, "--json")

    def progress(done: int, total: int) -> None:
        print(f"\rround {done}/{total}", end="", file=sys.stderr, flush=True)

    rows = measure(a.rounds, a.batch, progress)
    print(file=sys.stderr)
    print(table(rows))
    if a.json:
        try:
            with open(a.json, "w") as f:
                json.dump({"rounds": a.rounds, "batch": a.batch, "rows": rows}, f, indent=1)
        except OSError as e:
            _cli.fail_write(a.json, "--json", e)
    return 0


def main(argv: list[str] | None = None) -> int:
    return _cli.guard(PROG, _main, argv)


if __name__ == "__main__":
    sys.exit(main())
