"""The ACL face's cost: the Ascend 910 reference table's operations through ``runtime.acl`` beside the native
API, measured in the same process, interleaved.

``python -m runtime.bench.acl_face [--rounds N] [--batch K] [--json PATH]``

Each row times ``K`` calls of the native form and ``K`` calls of the pyACL form, alternating,
``N`` rounds; it reports the median nanoseconds per call of each and the median of the
per-round differences (what the ACL face adds per call: handle lookups, pointer-table bisects,
argument checks, the return-code wrapper). Setup and teardown (destroying streams, freeing
blocks) stay outside the timing.
"""

from __future__ import annotations

import gc
import json
import sys
from time import perf_counter_ns as _now

import numpy as np

import runtime as rt

from .. import _cli

MiB = 1 << 20


def _median(v: list[float]) -> float:
    s = sorted(v)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def _rows(acl, k: int):
    """(name, reference-table row, native sample fn, acl sample fn, cleanup); each fn returns ns/call."""
    ok = acl.ACL_SUCCESS

    # stream create (destroy outside the timing)
    def st_native():
        out = [None] * k
        t0 = _now()
        for i in range(k):
            out[i] = rt.Stream(0)
        t = _now() - t0
        for s in out:
            s.destroy()
        return t / k

    def st_acl():
        out = [(0, 0)] * k
        t0 = _now()
        for i in range(k):
            out[i] = acl.rt.create_stream()
        t = _now() - t0
        for h, ret in out:
            assert ret == ok and acl.rt.destroy_stream(h) == ok
        return t / k

    yield "stream create", "stream create", st_native, st_acl, None

    # event record, one per idle stream
    streams = [rt.Stream(0) for _ in range(k)]
    events = [rt.Event() for _ in range(k)]
    hs = [acl.rt.create_stream()[0] for _ in range(k)]
    he = [acl.rt.create_event()[0] for _ in range(k)]
    pairs_n = list(zip(events, streams))
    pairs_a = list(zip(he, hs))
    rec = acl.rt.record_event

    def ev_native():
        t0 = _now()
        for e, s in pairs_n:
            e.record(s)
        t = _now() - t0
        for s in streams:
            s.synchronize()
        return t / k

    def ev_acl():
        ret = 0
        t0 = _now()
        for e, s in pairs_a:
            ret |= rec(e, s)
        t = _now() - t0
        assert ret == ok
        for s in hs:
            acl.rt.synchronize_stream(s)
        return t / k

    def ev_cleanup():
        for s in streams:
            s.destroy()
        for h in hs:
            acl.rt.destroy_stream(h)
        for h in he:
            acl.rt.destroy_event(h)

    yield "event record", "event record", ev_native, ev_acl, ev_cleanup

    # sync idle stream
    s0 = rt.Stream(0)
    h0 = acl.rt.create_stream()[0]
    sync = acl.rt.synchronize_stream

    def sy_native():
        t0 = _now()
        for _ in range(k):
            s0.synchronize()
        return (_now() - t0) / k

    def sy_acl():
        ret = 0
        t0 = _now()
        for _ in range(k):
            ret |= sync(h0)
        t = _now() - t0
        assert ret == ok
        return t / k

    def sy_cleanup():
        s0.destroy()
        acl.rt.destroy_stream(h0)

    yield "sync idle stream", "sync idle", sy_native, sy_acl, sy_cleanup

    # alloc 1 MiB (free outside the timing)
    def al_native():
        out = [None] * k
        t0 = _now()
        for i in range(k):
            out[i] = rt.device_malloc(0, MiB)
        t = _now() - t0
        for b in out:
            rt.device_free(b)
        return t / k

    malloc = acl.rt.malloc

    def al_acl():
        out = [(0, 0)] * k
        t0 = _now()
        for i in range(k):
            out[i] = malloc(MiB, 0)
        t = _now() - t0
        for p, ret in out:
            assert ret == ok and acl.rt.free(p) == ok
        return t / k

    yield "alloc 1 MiB", "alloc 1 MiB", al_native, al_acl, None

    # memcpy host -> device, 1 MiB and 64 B (the small one shows the per-call cost alone)
    for n, label, seed in (
        (MiB, "memcpy H2D 1 MiB", "memcpy per MiB"),
        (64, "memcpy H2D 64 B", None),
    ):
        dbuf = rt.device_malloc(0, n)
        dptr = acl.rt.malloc(n, 0)[0]
        hptr = acl.rt.malloc_host(n)[0]
        host = acl._state.mem.by_start[hptr].arr  # both forms copy from the same host bytes
        host[:] = 1
        cp = acl.rt.memcpy
        h2d = rt.memcpy_host_to_device

        def cp_native(dbuf=dbuf, host=host, h2d=h2d):
            t0 = _now()
            for _ in range(k):
                h2d(dbuf, host)
            return (_now() - t0) / k

        def cp_acl(dptr=dptr, hptr=hptr, n=n, cp=cp):
            ret = 0
            t0 = _now()
            for _ in range(k):
                ret |= cp(dptr, n, hptr, n, 1)
            t = _now() - t0
            assert ret == ok
            return t / k

        def cp_cleanup(dbuf=dbuf, dptr=dptr, hptr=hptr):
            rt.device_free(dbuf)
            acl.rt.free(dptr)
            acl.rt.free_host(hptr)

        yield label, seed, cp_native, cp_acl, cp_cleanup

    # a single-operator launch: Add of two 256-element float32 vectors on a stream
    m = 256
    a = rt.to_device(np.ones(m, np.float32))
    b = rt.to_device(np.ones(m, np.float32))
    c = rt.empty(m, np.float32)
    sl = rt.Stream(0)
    add = rt.kernels.add
    desc = acl.create_tensor_desc(acl.ACL_FLOAT, [m], acl.ACL_FORMAT_ND)
    ptrs = [acl.rt.malloc(4 * m, 0)[0] for _ in range(3)]
    bufs = [acl.create_data_buffer(p, 4 * m) for p in ptrs]
    hl = acl.rt.create_stream()[0]
    attr = acl.op.create_attr()
    ex = acl.op.execute_v2
    ins, outs, descs2, descs1 = bufs[:2], bufs[2:], [desc, desc], [desc]

    def op_native():
        t0 = _now()
        for _ in range(k):
            sl.launch_kernel(add, (c, a, b))
        t = _now() - t0
        sl.synchronize()
        return t / k

    def op_acl():
        ret = 0
        t0 = _now()
        for _ in range(k):
            ret |= ex("Add", descs2, ins, descs1, outs, attr, hl)
        t = _now() - t0
        assert ret == ok
        acl.rt.synchronize_stream(hl)
        return t / k

    def op_cleanup():
        sl.destroy()
        acl.rt.destroy_stream(hl)
        for bh, p in zip(bufs, ptrs):
            acl.destroy_data_buffer(bh)
            acl.rt.free(p)
        acl.destroy_tensor_desc(desc)
        acl.op.destroy_attr(attr)

    yield "op launch Add (256 float32)", None, op_native, op_acl, op_cleanup


def measure(rounds: int, batch: int) -> list[dict]:
    import runtime.acl as acl

    assert acl.init() in (acl.ACL_SUCCESS, acl.ACL_ERROR_REPEAT_INITIALIZE)
    assert acl.rt.set_device(0) == acl.ACL_SUCCESS
    results = []
    try:
        for name, seed, native, face, cleanup in _rows(acl, batch):
            native()
            face()  # warm up both
            tn, ta = [], []
            gc.disable()
            try:
                for _ in range(rounds):
                    tn.append(native())
                    ta.append(face())
            finally:
                gc.enable()
            if cleanup is not None:
                cleanup()
            mn, ma = _median(tn), _median(ta)
            results.append(
                {
                    "row": name,
                    "reference_row": seed,
                    "native_ns": mn,
                    "acl_ns": ma,
                    "added_ns": _median([x - y for x, y in zip(ta, tn)]),
                    "rounds": rounds,
                    "batch": batch,
                    "native_samples": tn,
                    "acl_samples": ta,
                }
            )
    finally:
        acl.rt.reset_device(0)
        acl.finalize()
    return results


def table(results: list[dict]) -> str:
    out = [
        "| operation | native (µs/call, median) | runtime.acl (µs/call, median) | added by the ACL face (µs/call, median of paired rounds) |",
        "|---|---:|---:|---:|",
    ]
    for r in results:
        out.append(
            f"| {r['row']} | {r['native_ns'] / 1e3:.2f} | {r['acl_ns'] / 1e3:.2f} | {r['added_ns'] / 1e3:+.2f} |"
        )
    return "\n".join(out)


PROG = "python -m runtime.bench.acl_face"


def _main(argv: list[str] | None) -> int:
    ap = _cli.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=31, help="alternating native/acl samples per row")
    ap.add_argument("--batch", type=int, default=200, help="calls per sample")
    ap.add_argument("--json", default=None, help="also write every sample to this file")
    a = ap.parse_args(argv)
    if a.rounds < 1 or a.batch < 1:
        raise _cli.UsageError("--rounds and --batch must be >= 1")
    if a.json:
        _cli.check_writable(a.json, "--json")
    results = measure(a.rounds, a.batch)
    print(table(results))
    if a.json:
        try:
            with open(a.json, "w") as f:
                json.dump({"rows": results}, f, indent=1)
        except OSError as e:
            _cli.fail_write(a.json, "--json", e)
    return 0


def main(argv: list[str] | None = None) -> int:
    return _cli.guard(PROG, _main, argv)


if __name__ == "__main__":
    sys.exit(main())
