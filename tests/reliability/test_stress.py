"""Stress: 16 Python threads run seeded random work on shared and private streams of four
devices and verify every byte they wrote.

Each thread owns its buffers (a numpy model of each) and works in rounds: a round queues a
random sequence of operations (h2d, d2h, d2d within and across devices, memset, native
fill/add kernels on typed views, Python kernels, event record + wait_event to move to another
stream) on one stream, which is either one of the shared streams (other threads queue on it
at the same time) or the thread's private stream, then synchronises and checks every
device-to-host result against the model. Between rounds threads allocate and free buffers,
read whole buffers back with blocking copies (sometimes inside ``with stream:``), run device
and global barriers, recreate their private stream, and inject a failing Python kernel on it
(the error must surface, and the stream must keep working).

A watchdog (``faulthandler.dump_traceback_later(..., exit=True)``) ends the process with every
thread's traceback if the run deadlocks; the join is bounded as well.

CI runs about 10 s; ``RUNTIME_STRESS_SECONDS=300`` runs the long version. The operation counts
are printed (``pytest -s``) and quoted in RELIABILITY.md.
"""

from __future__ import annotations

import collections
import faulthandler
import os
import sys
import threading
import time

import numpy as np
import pytest

import runtime
from runtime import kernels

DEVICES = 4
THREADS = 16
SHARED_STREAMS = 6
SECONDS = float(os.environ.get("RUNTIME_STRESS_SECONDS", "10"))
SEED = int(os.environ.get("RUNTIME_STRESS_SEED", "20240601"))
MARK = "stress-injected failure"


@pytest.fixture(scope="module", autouse=True)
def _runtime():
    runtime.shutdown()
    runtime.init(device_count=DEVICES, memory="512MiB")
    yield
    runtime.shutdown()


class Buf:
    def __init__(self, obj, device: int, nbytes: int):
        self.obj = obj
        self.device = device
        self.model = np.zeros(nbytes, np.uint8)


class Worker:
    def __init__(self, idx: int, shared: list, stop: threading.Event):
        self.idx = idx
        self.rng = np.random.default_rng(SEED + idx)
        self.shared = shared
        self.stop = stop
        self.bufs: list[Buf] = []
        self.private = runtime.Stream(idx % DEVICES)
        self.ops: collections.Counter[str] = collections.Counter()
        self.error: BaseException | None = None

    # -------------------------------------------------------------- helpers

    def r(self, n: int) -> int:
        return int(self.rng.integers(0, n)) if n > 0 else 0

    def size(self) -> int:
        kind = self.r(10)
        if kind < 5:
            return self.r(600) + 1
        if kind < 9:
            return self.r(40_000) + 1
        return self.r(300_000) + 1

    def span(self, n: int) -> tuple[int, int]:
        off = self.r(n + 1)
        return off, self.r(n - off + 1)

    def alloc(self) -> None:
        dev = self.r(DEVICES)
        n = self.size()
        b = Buf(runtime.device_malloc(dev, n), dev, n)
        self.ops["malloc"] += 1
        if self.r(4) == 0:  # fresh memory is zeroed, checked through a numpy view
            assert not np.asarray(b.obj).any(), "allocation handed out dirty"
        self.bufs.append(b)

    def free(self) -> None:
        b = self.bufs.pop(self.r(len(self.bufs)))
        runtime.device_free(b.obj)
        self.ops["free"] += 1

    def verify(self, b: Buf, stream=None) -> None:
        host = np.empty(b.model.nbytes, np.uint8)
        if stream is None:
            runtime.memcpy_device_to_host(host, b.obj)
        else:
            with stream:  # blocking copy ordered on the thread's current stream
                runtime.memcpy_device_to_host(host, b.obj)
        self.ops["verify_blocking"] += 1
        if not np.array_equal(host, b.model):
            bad = np.flatnonzero(host != b.model)
            raise AssertionError(
                f"thread {self.idx}: {b.obj!r} differs from the model at {bad.size} bytes, "
                f"first {bad[:8].tolist()}"
            )

    # -------------------------------------------------------------- one round

    def round(self) -> None:
        if not self.bufs:
            return
        s = self.private if self.r(2) else self.shared[self.r(len(self.shared))]
        checks: list[tuple[np.ndarray, np.ndarray]] = []
        for _ in range(self.r(12) + 1):
            op = self.r(9)
            b = self.bufs[self.r(len(self.bufs))]
            n = b.model.nbytes
            if op == 0:
                off, cnt = self.span(n)
                data = self.rng.integers(0, 256, cnt, dtype=np.uint8)
                runtime.memcpy_host_to_device(b.obj, data, s, count=cnt, dst_offset=off)
                b.model[off : off + cnt] = data
                self.ops["h2d"] += 1
            elif op == 1:
                off, cnt = self.span(n)
                host = np.full(cnt, 0xEE, np.uint8)
                runtime.memcpy_device_to_host(host, b.obj, s, src_offset=off)
                checks.append((host, b.model[off : off + cnt].copy()))
                self.ops["d2h"] += 1
            elif op == 2:
                src = self.bufs[self.r(len(self.bufs))]
                so, cnt = self.span(src.model.nbytes)
                cnt = min(cnt, n)
                do = self.r(n - cnt + 1)
                runtime.memcpy_d2d(b.obj, src.obj, s, count=cnt, dst_offset=do, src_offset=so)
                b.model[do : do + cnt] = src.model[so : so + cnt].copy()
                self.ops["d2d" if src.device == b.device else "d2d_peer"] += 1
            elif op == 3:
                off, cnt = self.span(n)
                v = self.r(256)
                runtime.memset(b.obj, v, cnt, offset=off, stream=s)
                b.model[off : off + cnt] = v
                self.ops["memset"] += 1
            elif op in (4, 5) and b.device == s.device.index and n >= 4:
                # typed int32 views: fill, or add of two disjoint views of equal length
                words = n // 4
                if op == 4 or words < 2:
                    k0 = self.r(words)
                    cnt = self.r(words - k0) + 1
                    v = int(self.rng.integers(-(2**31), 2**31))
                    s.launch_kernel(kernels.fill, (b.obj.view("int32", (cnt,), 4 * k0), v))
                    b.model[4 * k0 : 4 * (k0 + cnt)] = np.full(cnt, v, np.int32).view(np.uint8)
                    self.ops["kernel_fill"] += 1
                else:
                    half = words // 2
                    cnt = self.r(half) + 1
                    out = b.obj.view("int32", (cnt,), 0)
                    x = b.obj.view("int32", (cnt,), 4 * half)
                    s.launch_kernel(kernels.add, (out, out, x))
                    m_out = b.model[: 4 * cnt].view(np.int32)
                    m_x = b.model[4 * half : 4 * (half + cnt)].view(np.int32)
                    b.model[: 4 * cnt] = (m_out + m_x).view(np.uint8)
                    self.ops["kernel_add"] += 1
            elif op == 6:
                c = self.r(255) + 1

                def xor(view, c=c):
                    view ^= np.uint8(c)

                s.launch_kernel(xor, (b.obj,))
                b.model ^= np.uint8(c)
                self.ops["python_kernel"] += 1
            elif op == 7:
                # move to another stream, ordered after everything queued so far
                s2 = (
                    self.private if s is not self.private else self.shared[self.r(len(self.shared))]
                )
                e = runtime.Event(enable_timing=False)
                e.record(s)
                s2.wait_event(e)
                s = s2
                self.ops["event_record_wait"] += 1
            else:
                self.ops["query"] += 1
                s.query()
        s.synchronize(timeout=120)
        self.ops["stream_synchronize"] += 1
        for host, want in checks:
            if not np.array_equal(host, want):
                raise AssertionError(
                    f"thread {self.idx}: an async d2h result differs from the model"
                )

    def between(self) -> None:
        k = self.r(40)
        if k < 8 and len(self.bufs) < 8:
            self.alloc()
        elif k < 12 and self.bufs:
            self.free()
        elif k < 16 and self.bufs:
            b = self.bufs[self.r(len(self.bufs))]
            self.verify(b, self.private if self.r(2) else None)
        elif k == 16:
            try:
                runtime.stream_synchronize(timeout=120)
            except runtime.KernelError as e:  # another thread's injected failure
                assert MARK in str(e), e
            self.ops["global_barrier"] += 1
        elif k == 17:
            try:
                runtime.Device(self.r(DEVICES)).synchronize(timeout=120)
            except runtime.KernelError as e:
                assert MARK in str(e), e
            self.ops["device_barrier"] += 1
        elif k == 18:
            self.private.destroy()
            self.private = runtime.Stream(self.r(DEVICES), -self.r(3))
            self.ops["stream_recreate"] += 1
        elif k == 19:

            def boom():
                raise RuntimeError(MARK)

            self.private.launch_kernel(boom)
            try:
                self.private.synchronize(timeout=120)
            except runtime.KernelError as e:
                assert MARK in str(e), e
            # (a concurrent barrier may have reported it instead)
            self.ops["injected_kernel_failure"] += 1
            log = []
            self.private.launch_kernel(log.append, (1,))
            self.private.synchronize(timeout=120)
            assert log == [1], "the stream did not recover after a kernel error"

    def run(self) -> None:
        try:
            for _ in range(3):
                self.alloc()
            while not self.stop.is_set():
                self.round()
                self.between()
            for b in self.bufs:
                self.verify(b)
            while self.bufs:
                self.free()
            self.private.destroy()
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            self.error = e
            self.stop.set()


def test_stress_threads_shared_and_private_streams():
    shared = [runtime.Stream(i % DEVICES, -(i % 3)) for i in range(SHARED_STREAMS)]
    stop = threading.Event()
    workers = [Worker(i, shared, stop) for i in range(THREADS)]
    threads = [threading.Thread(target=w.run, name=f"stress-{i}") for i, w in enumerate(workers)]
    watchdog = SECONDS + 180
    faulthandler.dump_traceback_later(watchdog, exit=True, file=sys.stderr)
    t0 = time.monotonic()
    try:
        for t in threads:
            t.start()
        stop.wait(SECONDS)
        stop.set()
        for t in threads:
            t.join(timeout=max(1.0, t0 + watchdog - 10 - time.monotonic()))
        hung = [t.name for t in threads if t.is_alive()]
        assert not hung, f"threads still running (deadlock?): {hung}"
    finally:
        faulthandler.cancel_dump_traceback_later()
    elapsed = time.monotonic() - t0
    for w in workers:
        if w.error is not None:
            raise w.error
    for s in shared:
        s.synchronize(timeout=60)
        s.destroy()
    runtime.stream_synchronize(timeout=60)
    total: collections.Counter[str] = collections.Counter()
    for w in workers:
        total.update(w.ops)
    for d in range(DEVICES):
        st = runtime.memory_stats(d)
        assert st["active_allocations"] == 0 and st["allocated"] == 0, st
        runtime.empty_cache(d)
    n = sum(total.values())
    print(
        f"\nstress: {THREADS} threads, {elapsed:.1f} s, {n} operations executed and verified "
        f"(seed {SEED}):"
    )
    for k, v in sorted(total.items()):
        print(f"  {k:24s} {v}")
    assert n > 1000
