"""Model-based stateful test of the public API (Hypothesis ``RuleBasedStateMachine``).

A simple Python model shadows the runtime: one ``bytearray`` per live allocation, the handles
(raw buffers and typed views) that reach it, numpy views that keep it alive, streams (with
the "poisoned" state a failed kernel leaves until the next synchronisation), events and the
options. The machine drives every public memory operation (``device_malloc``, ``empty``,
``to_device``, ``device_free``; h2d / d2h / d2d with and without ``stream=``, with counts and
offsets; ``memset``; ``buf.view``; ``np.asarray``), native kernels (fill / copy / scale / add
on typed views), Python kernels (good and raising), events (record, wait_event, query,
synchronize, destroy), stream / device / global synchronisation, stream destroy, option
changes and shutdown + init, over three devices and up to four user streams.

Issue 11 added: stream capture with fork / join (``capture_graph``: captured ops replayed
1-3 times, applied by the model in issue order per replay; blocking copies, synchronize and
barriers refused during the capture; an unjoined fork fails ``end_capture``), ``with
stream:`` across devices (``with_stream``: the current device and streams inside and after
the block, blocking calls on the frame's stream after its queued work), callbacks that call
back into the runtime from the worker thread (``callback_calls_runtime``: allowed calls take
effect, waits on the callback's own stream raise ``InvalidOperationError`` inside it), and
``fork()`` (``fork_process``, rare: the child's inherited handles fail, ``init`` and a round
trip work there; the parent goes on unchanged).

Ordering: work on one allocation from several streams is ordered the way a user must order
it, with ``Event.record`` + ``Stream.wait_event`` (inserted by the model whenever an
allocation moves to another stream). Contents are compared byte for byte after
synchronisation; asynchronous device-to-host copies are checked when their stream has been
synchronised.

Invariants: contents match the model; freed / destroyed / pre-shutdown handles raise
``InvalidHandleError``; ``active_allocations`` equals the model's live allocations (live
handles plus numpy views held) once everything is synchronised, and is never below it;
``allocated`` and ``reserved`` never exceed ``total``.

Profiles (tests/conftest.py): ``ci`` (default, 200 examples), ``slow``
(``HYPOTHESIS_PROFILE=slow``, 5000 examples). ``stateful_step_count`` bounds each example.
"""

from __future__ import annotations

import faulthandler
import gc
import os
import signal
import subprocess
import time

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import runtime
from runtime import kernels

DEVICES = 3
MEMORY = "64MiB"
MAX_BUFFERS = 10
MAX_STREAMS = 4
MAX_EVENTS = 4
MAX_NP_VIEWS = 4
STEPS = int(os.environ.get("RELIABILITY_STATEFUL_STEPS", "80"))
# The fork rule forks in one draw of this many (lower it to hunt fork problems).
FORK_ONE_IN = int(os.environ.get("RELIABILITY_STATEFUL_FORK_ONE_IN", "16"))
OPTIONS = ("enableMemoryReuse", "enablePipelining", "enableAsync")

# Counters reported by the summary test at the end of the module (RELIABILITY.md).
COUNTS = {
    "examples": 0,
    "steps": 0,
    "shutdowns": 0,
    "ops_applied": 0,
    "ops_skipped": 0,
    "kernel_errors": 0,
    "invalid_handles": 0,
    "captures": 0,
    "graph_launches": 0,
    "capture_refusals": 0,
    "unjoined_forks": 0,
    "with_blocks": 0,
    "with_blocking_ops": 0,
    "callbacks": 0,
    "callback_calls_allowed": 0,
    "callback_calls_refused": 0,
    "forks": 0,
    "user_events": 0,
}


SAVED_OPTIONS = {o: runtime.get_option(o) for o in OPTIONS}


@pytest.fixture(scope="module", autouse=True)
def _runtime():
    runtime.shutdown()
    runtime.init(device_count=DEVICES, memory=MEMORY)
    runtime._runtime._register_test_kernels()
    yield
    for o, v in SAVED_OPTIONS.items():
        runtime.set_option(o, v)
    runtime.shutdown()


sizes = st.one_of(
    st.integers(0, 300),
    st.sampled_from([4095, 4096, 4097, 32767, 32768, 32769, 65536, 100_000]),
    st.integers(0, 70_000),
)
pick = st.integers(0, 1 << 16)
dtypes = st.sampled_from(["uint8", "int32", "int64", "float32", "float64"])
num_dtypes = ("int32", "int64", "float32", "float64")


def pattern(n: int, seed: int) -> bytes:
    return (
        ((np.arange(n, dtype=np.uint64) * 131 + seed * 7919 + 1) % 251).astype(np.uint8).tobytes()
    )


# What a callback does from the worker thread, in this order (copies come before the launch
# on the other stream, so no call races with another).
CALLBACK_ACTIONS = (
    "d2h",
    "h2d",
    "query",
    "launch_other",
    "record_other",
    "sync_own",
    "barrier",
    "device_own",
    "shutdown",
    "destroy_own",
)


def partial_overlap(p, q) -> bool:
    """Two views of one allocation that overlap without being the same range."""
    return (
        p.alloc is q.alloc
        and p.offset < q.offset + q.nbytes
        and q.offset < p.offset + p.nbytes
        and (p.offset, p.nbytes) != (q.offset, q.nbytes)
    )


def fork_child(buf, stream, event, graph, seed: int) -> str:
    """Run in a forked child: returns "ok" or what went wrong. Inherited buffers, streams and
    graphs raise InvalidHandleError; inherited events and global calls raise
    NotInitializedError until ``init``, and events InvalidHandleError after it."""
    problems = []

    def expect(err, name, call):
        try:
            call()
        except err:
            return
        except BaseException as e:
            problems.append(f"{name}: {type(e).__name__}: {e}")
            return
        problems.append(f"{name}: no error")

    handle_calls = [
        ("stream.launch_kernel", lambda: stream.launch_kernel(kernels.noop)),
        ("stream.synchronize", lambda: stream.synchronize(timeout=5)),
        ("stream.query", stream.query),
        ("graph.launch", lambda: graph.launch(stream)),
        ("with stream", stream.__enter__),
        # the inherited stream is checked first: the parent's runtime, InvalidHandleError
        ("event.record", lambda: event.record(stream)),
    ]
    if buf is not None:
        handle_calls += [
            ("d2h", lambda: runtime.memcpy_device_to_host(bytearray(buf.nbytes), buf)),
            ("view", lambda: buf.view("uint8")),
            ("asarray", lambda: np.asarray(buf)),
            ("device_free", lambda: runtime.device_free(buf)),
        ]
    event_calls = [
        ("event.query", event.query),
        ("event.synchronize", lambda: event.synchronize(timeout=5)),
    ]
    if runtime.is_initialized():
        problems.append("the child starts initialised")
    for name, call in handle_calls:
        expect(runtime.InvalidHandleError, name, call)
    for name, call in event_calls:
        expect(runtime.NotInitializedError, name, call)
    expect(runtime.NotInitializedError, "stream_synchronize", runtime.stream_synchronize)
    expect(runtime.NotInitializedError, "device_malloc", lambda: runtime.device_malloc(0, 8))
    runtime.init(device_count=DEVICES, memory=MEMORY)
    for name, call in handle_calls + event_calls:
        expect(runtime.InvalidHandleError, f"{name} after init", call)
    # a small round trip on the child's own runtime
    d = seed % DEVICES
    x = runtime.to_device(np.arange(64, dtype=np.int32) * seed, device=d)
    y = runtime.empty((64,), "int32", device=d)
    s = runtime.Stream(d)
    s.launch_kernel(kernels.add, (y, x, x))
    e = runtime.Event()
    e.record(s)
    out = np.empty(64, np.int32)
    pinned = runtime.pinned_empty(64, "int32")
    runtime.memcpy_device_to_host(pinned, y, s)  # queued (pinned): read after the sync
    runtime.memcpy_device_to_host(out, y, s)  # pageable: complete on return
    s.synchronize(timeout=10)
    if pinned.tolist() != out.tolist():
        problems.append(f"pinned round trip: {pinned.tolist()}")
    if not e.query() or out.tolist() != [2 * seed * v for v in range(64)]:
        problems.append(f"round trip: {out.tolist()}")
    return "; ".join(problems) or "ok"


def native_stacks(pid: int) -> str:
    """Every thread's native stack of process `pid` (gdb, when installed), for a hang report."""
    try:
        r = subprocess.run(
            ["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return r.stdout[-20000:]
    except (OSError, subprocess.SubprocessError) as e:
        return f"(no native stacks: {e})"


def kernel_error_seen() -> None:
    """Count an expected KernelError, then collect garbage: the error sits in a reference
    cycle (the first error carries all in ``.errors``) whose traceback frames keep the
    caller's locals, numpy views of device memory among them, alive until the cycle is
    collected (RELIABILITY.md, "Seen and left alone"); without this, ``active_allocations``
    reads one too many after such a view was dropped."""
    COUNTS["kernel_errors"] += 1
    gc.collect()


class Alloc:
    """One device allocation: its model bytes and what keeps it alive."""

    def __init__(self, device: int, nbytes: int):
        self.device = device
        self.data = bytearray(nbytes)
        self.handles = 0  # live DeviceBuffer handles (raw or views)
        self.np_views = 0  # numpy arrays held by the model
        self.owner = None  # SModel that last queued work on it (not known complete)

    @property
    def alive(self) -> bool:
        return self.handles > 0 or self.np_views > 0


class Handle:
    def __init__(self, obj, alloc: Alloc, offset: int, nbytes: int, dtype: str):
        self.obj = obj
        self.alloc = alloc
        self.offset = offset  # absolute offset in the allocation
        self.nbytes = nbytes
        self.dtype = dtype
        self.live = True

    def model(self) -> bytearray:
        return self.alloc.data[self.offset : self.offset + self.nbytes]

    def write(self, rel: int, data: bytes) -> None:
        a = self.offset + rel
        self.alloc.data[a : a + len(data)] = data


class SModel:
    def __init__(self, obj, device: int, default: bool = False):
        self.obj = obj
        self.device = device
        self.default = default
        self.poisoned = False  # a failed kernel is pending: later work is skipped
        self.live = True


class Machine(RuleBasedStateMachine):
    @initialize()
    def setup(self):
        COUNTS["examples"] += 1
        self.handles: list[Handle] = []
        self.freed: list[Handle] = []
        self.stale: list = []  # DeviceBuffer / Stream handles from before a shutdown
        self.streams: list[SModel] = []
        self.destroyed: list[SModel] = []
        self.events: list = []
        self.dead_events: list = []
        self.np_views: list[tuple[np.ndarray, Alloc, int]] = []
        self.pending: list[tuple[SModel, object, bytes]] = []  # async d2h checks
        self.defaults = [SModel(runtime.default_stream(d), d, default=True) for d in range(DEVICES)]
        self.async_mode = runtime.get_option("enableAsync")

    # ------------------------------------------------------------------ model helpers

    def allocs(self) -> list[Alloc]:
        seen: dict[int, Alloc] = {}
        for h in self.handles:
            seen[id(h.alloc)] = h.alloc
        for _, a, _ in self.np_views:
            seen[id(a)] = a
        return list(seen.values())

    def all_streams(self) -> list[SModel]:
        return self.defaults + self.streams

    def order_on(self, s: SModel, allocs) -> None:
        """Order later work on ``s`` after work already queued on these allocations."""
        for a in allocs:
            if a.owner is not None and a.owner is not s:
                ev = runtime.Event(enable_timing=False)
                ev.record(a.owner.obj)
                s.obj.wait_event(ev)
            a.owner = s

    def synced(self, s: SModel) -> None:
        """``s`` has run everything queued: its allocations and pending copies are done."""
        for a in self.allocs():
            if a.owner is s:
                a.owner = None
        keep = []
        for ps, host, want in self.pending:
            if ps is s:
                assert bytes(memoryview(host).cast("B")) == want, "async d2h result differs"
            else:
                keep.append((ps, host, want))
        self.pending = keep

    def expect_sync(self, s: SModel, call) -> None:
        """Run a call that synchronises ``s``: KernelError iff the model says it is poisoned."""
        if s.poisoned:
            with pytest.raises(runtime.KernelError):
                call()
            kernel_error_seen()
            s.poisoned = False
        else:
            call()
        self.synced(s)

    def after_async(self, s: SModel) -> None:
        """In synchronous mode every stream operation waits (and reports errors) at once."""
        if not self.async_mode:
            if s.poisoned:
                raise AssertionError("unreachable: handled by run_on")
            self.synced(s)

    def run_on(self, s: SModel, allocs, call, apply, completes: bool = False) -> bool:
        """Queue ``call`` on stream ``s`` touching ``allocs``; ``apply`` updates the model.
        ``completes``: the call returns once the stream ran it, reporting the stream's error
        (a non-empty copy into pageable host memory, CUDA's rule), as in synchronous mode.

        Returns whether the operation ran (False: skipped behind a pending kernel error).
        """
        self.order_on(s, allocs)
        if s.poisoned:
            COUNTS["ops_skipped"] += 1
            if self.async_mode and not completes:
                call()  # queued, then skipped behind the unreported error
                return False
            with pytest.raises(runtime.KernelError):
                call()
            kernel_error_seen()
            s.poisoned = False
            self.synced(s)
            return False
        call()
        apply()
        COUNTS["ops_applied"] += 1
        if not self.async_mode or completes:
            self.synced(s)
        return True

    def blocking(self, device: int, allocs, call) -> None:
        """A copy without ``stream=``: ordered on the device's current (default) stream."""
        s = self.defaults[device]
        self.order_on(s, allocs)
        call()
        self.synced(s)

    def blocking_on(self, s: SModel, allocs, call, apply) -> bool:
        """A blocking call queued on ``s`` (the current stream inside ``with``) and waited for:
        it runs after ``s``'s queued work, or raises the pending KernelError and is skipped."""
        self.order_on(s, allocs)
        if s.poisoned:
            with pytest.raises(runtime.KernelError):
                call()
            kernel_error_seen()
            COUNTS["ops_skipped"] += 1
            s.poisoned = False
            self.synced(s)
            return False
        call()
        apply()
        self.synced(s)
        return True

    def live_handles(self, pred=lambda h: True) -> list[Handle]:
        return [h for h in self.handles if pred(h)]

    def stream_for(self, i: int, device: int | None = None) -> SModel:
        cands = [s for s in self.all_streams() if device is None or s.device == device]
        return cands[i % len(cands)]

    def drop_handle(self, h: Handle) -> None:
        self.handles.remove(h)
        h.live = False
        h.alloc.handles -= 1

    def add_handle(self, obj, alloc: Alloc, offset: int, nbytes: int, dtype: str) -> Handle:
        h = Handle(obj, alloc, offset, nbytes, dtype)
        alloc.handles += 1
        self.handles.append(h)
        return h

    def read(self, h: Handle) -> bytes:
        out = bytearray(h.nbytes)
        self.blocking(h.alloc.device, [h.alloc], lambda: runtime.memcpy_device_to_host(out, h.obj))
        return bytes(out)

    def model_live_count(self, device: int) -> int:
        return sum(1 for a in self.allocs() if a.device == device and a.alive)

    # ------------------------------------------------------------------ allocation

    @precondition(lambda self: len(self.handles) < MAX_BUFFERS)
    @rule(device=st.integers(0, DEVICES - 1), size=sizes)
    def malloc(self, device, size):
        b = runtime.device_malloc(device, size)
        assert b.nbytes == size and int(b.device) == device
        self.add_handle(b, Alloc(device, size), 0, size, "uint8")

    @precondition(lambda self: len(self.handles) < MAX_BUFFERS)
    @rule(
        device=st.integers(0, DEVICES - 1),
        n=st.integers(0, 3000),
        dtype=dtypes,
        stream=st.none() | pick,
        seed=st.integers(0, 255),
    )
    def to_device_or_empty(self, device, n, dtype, stream, seed):
        item = np.dtype(dtype).itemsize
        if seed % 3 == 0:
            b = runtime.empty((n,), dtype, device=device)
            self.add_handle(b, Alloc(device, n * item), 0, n * item, dtype)
            return
        host = np.frombuffer(pattern(n * item, seed), dtype=dtype).copy()
        alloc = Alloc(device, n * item)
        if stream is None:
            b = runtime.to_device(host, device=device)
            alloc.data[:] = host.tobytes()
        else:
            s = self.stream_for(stream)
            if s.poisoned:
                return  # the copy would be skipped; covered by the copy rules
            b = runtime.to_device(host, device=device, stream=s.obj)
            alloc.owner = s
            alloc.data[:] = host.tobytes()
            self.after_async(s)
        assert b.dtype == np.dtype(dtype) and b.shape == (n,)
        self.add_handle(b, alloc, 0, n * item, dtype)

    @precondition(lambda self: self.handles)
    @rule(i=pick)
    def free(self, i):
        h = self.handles[i % len(self.handles)]
        runtime.device_free(h.obj)
        assert h.obj.freed
        self.drop_handle(h)
        self.freed.append(h)
        del self.freed[:-8]

    @precondition(lambda self: self.freed or self.stale)
    @rule(i=pick, use=st.integers(0, 8))
    def use_invalid_handle(self, i, use):
        olds = [h.obj for h in self.freed] + [
            o for o in self.stale if isinstance(o, runtime.DeviceBuffer)
        ]
        if not olds:
            return
        b = olds[i % len(olds)]
        ok = runtime.device_malloc(0, 8)
        host = bytearray(8)
        calls = [
            lambda: runtime.device_free(b),
            lambda: runtime.memcpy_host_to_device(b, bytes(1)),
            lambda: runtime.memcpy_device_to_host(host, b, count=0),
            lambda: runtime.memcpy_d2d(ok, b, count=0),
            lambda: runtime.memset(b, 1, stream=self.defaults[0].obj),
            lambda: b.view("uint8"),
            lambda: np.asarray(b),
            lambda: b.copy_to_host(),
            lambda: self.defaults[0].obj.launch_kernel(lambda x: None, (b,)),
        ]
        with pytest.raises(runtime.InvalidHandleError):
            calls[use]()
        COUNTS["invalid_handles"] += 1
        assert host == bytearray(8)
        assert not np.asarray(ok).any()
        runtime.device_free(ok)

    # ------------------------------------------------------------------ copies

    @precondition(lambda self: self.handles)
    @rule(
        i=pick,
        stream=st.none() | pick,
        seed=st.integers(0, 255),
        cut=st.integers(0, 3),
        a=pick,
        b=pick,
    )
    def h2d(self, i, stream, seed, cut, a, b):
        h = self.handles[i % len(self.handles)]
        n = h.nbytes
        # cut: 0 whole buffer (no count), 1 explicit count + offsets, 2 host smaller, 3 too big
        if cut == 0:
            src, kw, dst_off, data = pattern(n, seed), {}, 0, pattern(n, seed)
        elif cut == 1:
            dst_off = a % (n + 1)
            count = b % (n - dst_off + 1)
            src_off = (a ^ b) % 17
            src = pattern(count + src_off, seed)
            kw = {"count": count, "dst_offset": dst_off, "src_offset": src_off}
            data = src[src_off : src_off + count]
        elif cut == 2:
            m = a % (n + 1)
            dst_off = b % (n - m + 1)
            src, kw, data = (
                np.frombuffer(pattern(m, seed), np.uint8),
                {"dst_offset": dst_off},
                pattern(m, seed),
            )
        else:
            src = bytearray(pattern(n + 1 + a % 5, seed))
            with pytest.raises(ValueError, match="dst"):
                runtime.memcpy_host_to_device(h.obj, src)
            return
        if stream is None:
            self.blocking(
                h.alloc.device, [h.alloc], lambda: runtime.memcpy_host_to_device(h.obj, src, **kw)
            )
            h.write(dst_off, data)
        else:
            s = self.stream_for(stream)
            self.run_on(
                s,
                [h.alloc],
                lambda: runtime.memcpy_host_to_device(h.obj, src, s.obj, **kw),
                lambda: h.write(dst_off, data),
            )

    @precondition(lambda self: self.handles)
    @rule(i=pick, stream=st.none() | pick, explicit=st.booleans(), a=pick, b=pick)
    def d2h(self, i, stream, explicit, a, b):
        h = self.handles[i % len(self.handles)]
        n = h.nbytes
        extra = a % 9
        host = np.full(n + extra, 0xEE, np.uint8)
        if explicit:
            src_off = a % (n + 1)
            count = b % (n - src_off + 1)
            dst_off = b % (extra + 1)
            kw = {"count": count, "dst_offset": dst_off, "src_offset": src_off}
        else:
            src_off, dst_off = 0, extra
            count = n
            kw = {"dst_offset": dst_off}
        expect = bytearray(host.tobytes())
        if stream is None:
            self.blocking(
                h.alloc.device, [h.alloc], lambda: runtime.memcpy_device_to_host(host, h.obj, **kw)
            )
            m = h.model()
            expect[dst_off : dst_off + count] = m[src_off : src_off + count]
            assert host.tobytes() == bytes(expect), "blocking d2h result differs from the model"
            return
        s = self.stream_for(stream)
        snapshot = {}

        def apply():
            m = h.model()
            expect[dst_off : dst_off + count] = m[src_off : src_off + count]
            snapshot["ran"] = True

        # Into pageable memory (this numpy array) a non-empty copy is complete on return.
        completes = count > 0
        self.run_on(
            s,
            [h.alloc],
            lambda: runtime.memcpy_device_to_host(host, h.obj, s.obj, **kw),
            apply,
            completes=completes,
        )
        if self.async_mode and not completes:
            self.pending.append((s, host, bytes(expect)))
        else:
            assert host.tobytes() == bytes(expect), "d2h into pageable memory not complete"

    @precondition(lambda self: self.handles)
    @rule(i=pick, j=pick, stream=st.none() | pick, explicit=st.booleans(), a=pick, b=pick)
    def d2d(self, i, j, stream, explicit, a, b):
        dst = self.handles[i % len(self.handles)]
        src = self.handles[j % len(self.handles)]
        if explicit:
            src_off = a % (src.nbytes + 1)
            dst_off = b % (dst.nbytes + 1)
            count = (a ^ b) % (min(src.nbytes - src_off, dst.nbytes - dst_off) + 1)
            kw = {"count": count, "dst_offset": dst_off, "src_offset": src_off}
        else:
            src_off, count = 0, src.nbytes
            if count > dst.nbytes:
                with pytest.raises(ValueError, match="dst"):
                    runtime.memcpy_d2d(dst.obj, src.obj)
                return
            dst_off = b % (dst.nbytes - count + 1)
            kw = {"dst_offset": dst_off}

        def apply():
            chunk = bytes(src.model()[src_off : src_off + count])
            dst.write(dst_off, chunk)

        allocs = [dst.alloc] if dst.alloc is src.alloc else [dst.alloc, src.alloc]
        if stream is None:
            self.blocking(
                dst.alloc.device, allocs, lambda: runtime.memcpy_d2d(dst.obj, src.obj, **kw)
            )
            apply()
        else:
            s = self.stream_for(stream)
            self.run_on(s, allocs, lambda: runtime.memcpy_d2d(dst.obj, src.obj, s.obj, **kw), apply)

    @precondition(lambda self: self.handles)
    @rule(
        i=pick,
        stream=st.none() | pick,
        value=st.integers(0, 255),
        a=pick,
        b=pick,
        whole=st.booleans(),
    )
    def memset(self, i, stream, value, a, b, whole):
        h = self.handles[i % len(self.handles)]
        off = 0 if whole else a % (h.nbytes + 1)
        count = h.nbytes - off if whole else b % (h.nbytes - off + 1)
        kw = {} if whole else {"offset": off}
        args = () if whole else (count,)

        def apply():
            h.write(off, bytes([value]) * count)

        if stream is None:
            self.blocking(
                h.alloc.device, [h.alloc], lambda: runtime.memset(h.obj, value, *args, **kw)
            )
            apply()
        else:
            s = self.stream_for(stream)
            self.run_on(
                s, [h.alloc], lambda: runtime.memset(h.obj, value, *args, stream=s.obj, **kw), apply
            )

    # ------------------------------------------------------------------ views

    @precondition(lambda self: self.handles and len(self.handles) < MAX_BUFFERS)
    @rule(i=pick, dtype=dtypes, k=pick, n=pick, shaped=st.booleans())
    def typed_view(self, i, dtype, k, n, shaped):
        h = self.handles[i % len(self.handles)]
        item = np.dtype(dtype).itemsize
        first = (-h.offset) % item  # relative offset of the first aligned byte
        if first > h.nbytes:
            with pytest.raises(ValueError):
                h.obj.view(dtype, None, h.nbytes + 1)
            return
        slots = (h.nbytes - first) // item
        rel = first + item * (k % (slots + 1))
        room = (h.nbytes - rel) // item
        count = n % (room + 1)
        if shaped and count % 2 == 0 and count:
            shape: tuple[int, ...] | None = (2, count // 2)
        elif shaped:
            shape = (count,)
        else:
            shape, count = None, room
        v = h.obj.view(dtype, shape, rel)
        assert v.nbytes == count * item and v.dtype == np.dtype(dtype)
        assert v.offset == h.offset + rel
        self.add_handle(v, h.alloc, h.offset + rel, count * item, dtype)

    @precondition(lambda self: self.handles)
    @rule(i=pick, dtype=dtypes)
    def misaligned_view_refused(self, i, dtype):
        h = self.handles[i % len(self.handles)]
        item = np.dtype(dtype).itemsize
        if item == 1:
            with pytest.raises(ValueError, match="shape"):
                h.obj.view(dtype, (h.nbytes + 1,))
            return
        rel = ((-h.offset) % item) + 1
        if rel > h.nbytes:
            return
        with pytest.raises(ValueError, match="offset"):
            h.obj.view(dtype, (0,), rel)

    @precondition(lambda self: self.handles and len(self.np_views) < MAX_NP_VIEWS)
    @rule(i=pick)
    def take_numpy_view(self, i):
        h = self.handles[i % len(self.handles)]
        arr = np.asarray(h.obj)
        assert arr.dtype == np.dtype(h.dtype) and arr.nbytes == h.nbytes
        h.alloc.np_views += 1
        self.np_views.append((arr, h.alloc, h.offset))

    def settle(self, alloc: Alloc) -> None:
        """Host access: wait for the stream that last queued work on ``alloc``."""
        if alloc.owner is not None:
            s = alloc.owner
            self.expect_sync(s, lambda: s.obj.synchronize(timeout=30))

    @precondition(lambda self: self.np_views)
    @rule(i=pick, pos=pick, value=st.integers(0, 255))
    def write_through_numpy(self, i, pos, value):
        arr, alloc, off = self.np_views[i % len(self.np_views)]
        flat = arr.reshape(-1).view(np.uint8)
        self.settle(alloc)
        assert flat.tobytes() == bytes(alloc.data[off : off + flat.nbytes])
        if flat.nbytes:
            p = pos % flat.nbytes
            flat[p] = value
            alloc.data[off + p] = value

    @precondition(lambda self: self.np_views)
    @rule(i=pick)
    def drop_numpy_view(self, i):
        arr, alloc, off = self.np_views.pop(i % len(self.np_views))
        alloc.np_views -= 1
        del arr

    # ------------------------------------------------------------------ kernels

    @precondition(lambda self: self.handles)
    @rule(
        stream=pick,
        op=st.sampled_from(["fill", "copy", "scale", "add"]),
        i=pick,
        j=pick,
        k=pick,
        v=st.integers(-50, 50),
        fv=st.sampled_from([0.0, 1.5, -2.25, 1e30, -0.0, float("inf")]),
    )
    def native_kernel(self, stream, op, i, j, k, v, fv):
        s = self.stream_for(stream)
        typed = [h for h in self.handles if h.dtype in num_dtypes and h.alloc.device == s.device]
        if not typed:
            return
        out = typed[i % len(typed)]
        dt = np.dtype(out.dtype)
        same = [h for h in typed if h.dtype == out.dtype and h.nbytes == out.nbytes]
        x = same[j % len(same)]
        y = same[k % len(same)]

        def overlaps(p, q):
            return (
                p.alloc is q.alloc
                and p.offset < q.offset + q.nbytes
                and q.offset < p.offset + p.nbytes
                and (p.offset, p.nbytes) != (q.offset, q.nbytes)
            )

        def arr(h):
            return np.frombuffer(bytes(h.model()), dtype=dt)

        if op == "fill":
            value = v if dt.kind == "i" else fv
            args, touched = (out.obj, value), [out]

            def result():
                return np.full(out.nbytes // dt.itemsize, value, dtype=dt).tobytes()

        elif op == "copy":
            src = [
                h
                for h in self.handles
                if h.alloc.device == s.device and h.nbytes == out.nbytes and h.dtype in num_dtypes
            ]
            x = src[j % len(src)]
            args, touched = (out.obj, x.obj), [out, x]

            def result():
                return bytes(x.model())

        else:
            if dt.kind == "f" and (np.isnan(arr(x)).any() or np.isnan(arr(y)).any()):
                return  # NaN payloads are not compared bit for bit
            alpha = v if dt.kind == "i" else fv
            if op == "scale":
                args, touched = (out.obj, x.obj, alpha), [out, x]

                def result():
                    with np.errstate(all="ignore"):
                        return (np.asarray(alpha, dtype=dt) * arr(x)).astype(dt).tobytes()

            else:
                args, touched = (out.obj, x.obj, y.obj), [out, x, y]

                def result():
                    with np.errstate(all="ignore"):
                        return (arr(x) + arr(y)).astype(dt).tobytes()

        if any(overlaps(out, t) for t in touched[1:]):
            with pytest.raises(ValueError, match="overlap"):
                s.obj.launch_kernel(getattr(kernels, op), args)
            return
        allocs = list({id(t.alloc): t.alloc for t in touched}.values())
        self.run_on(
            s,
            allocs,
            lambda: s.obj.launch_kernel(getattr(kernels, op), args),
            lambda: out.write(0, result()),
        )

    @precondition(lambda self: self.handles)
    @rule(stream=pick, i=pick)
    def native_kernel_wrong_device(self, stream, i):
        s = self.stream_for(stream)
        others = [h for h in self.handles if h.alloc.device != s.device and h.dtype in num_dtypes]
        if not others:
            return
        h = others[i % len(others)]
        with pytest.raises(ValueError, match="device"):
            s.obj.launch_kernel(kernels.fill, (h.obj, 1))

    @precondition(lambda self: self.handles)
    @rule(
        stream=pick,
        i=pick,
        j=pick,
        kind=st.sampled_from(["xor", "reverse", "copy_prefix"]),
        c=st.integers(1, 255),
    )
    def python_kernel(self, stream, i, j, kind, c):
        s = self.stream_for(stream)
        a = self.handles[i % len(self.handles)]
        b = self.handles[j % len(self.handles)]
        if kind == "xor":

            def k(x, c=c):
                f = x.reshape(-1).view(np.uint8)
                f ^= c

            args, touched = (a.obj,), [a]

            def apply():
                a.write(0, (np.frombuffer(bytes(a.model()), np.uint8) ^ c).tobytes())

        elif kind == "reverse":

            def k(x):
                f = x.reshape(-1).view(np.uint8)
                f[:] = f[::-1].copy()

            args, touched = (a.obj,), [a]

            def apply():
                a.write(0, bytes(a.model()[::-1]))

        else:

            def k(dst, src):
                d, s_ = dst.reshape(-1).view(np.uint8), src.reshape(-1).view(np.uint8)
                n = min(d.nbytes, s_.nbytes)
                d[:n] = s_[:n]

            args, touched = (a.obj, b.obj), [a, b]

            def apply():
                n = min(a.nbytes, b.nbytes)
                a.write(0, bytes(b.model()[:n]))

        allocs = list({id(t.alloc): t.alloc for t in touched}.values())
        self.run_on(s, allocs, lambda: s.obj.launch_kernel(k, args), apply)

    @precondition(lambda self: self.streams)
    @rule(stream=pick, native=st.sampled_from(["python", "test_error", "test_panic"]))
    def failing_kernel(self, stream, native):
        s = self.streams[stream % len(self.streams)]

        def boom():
            raise ValueError("injected by the state machine")

        k = boom if native == "python" else native
        if self.async_mode:
            s.obj.launch_kernel(k)
            s.poisoned = True
        else:
            with pytest.raises(runtime.KernelError):
                s.obj.launch_kernel(k)
            s.poisoned = False
            self.synced(s)

    # ------------------------------------------------------------------ streams and events

    @precondition(lambda self: len(self.streams) < MAX_STREAMS)
    @rule(device=st.integers(0, DEVICES - 1), priority=st.sampled_from([None, 0, -1, -2]))
    def create_stream(self, device, priority):
        s = runtime.Stream(device) if priority is None else runtime.Stream(device, priority)
        self.streams.append(SModel(s, device))

    @precondition(lambda self: self.streams)
    @rule(i=pick)
    def destroy_stream(self, i):
        s = self.streams.pop(i % len(self.streams))
        self.expect_sync(s, s.obj.destroy)
        s.live = False
        self.destroyed.append(s)
        del self.destroyed[:-4]

    @precondition(
        lambda self: self.destroyed or any(isinstance(o, runtime.Stream) for o in self.stale)
    )
    @rule(i=pick, use=st.integers(0, 5))
    def use_destroyed_stream(self, i, use):
        olds = [s.obj for s in self.destroyed] + [
            o for o in self.stale if isinstance(o, runtime.Stream)
        ]
        s = olds[i % len(olds)]
        buf = runtime.device_malloc(0, 4)
        try:
            calls = [
                lambda: s.launch_kernel(kernels.noop),
                lambda: s.synchronize(),
                lambda: s.query(),
                lambda: runtime.memset(buf, 7, stream=s),
                lambda: runtime.Event().record(s),
                lambda: s.destroy(),
            ]
            with pytest.raises(runtime.InvalidHandleError):
                calls[use]()
            COUNTS["invalid_handles"] += 1
            assert not np.asarray(buf).any()
        finally:
            runtime.device_free(buf)

    @precondition(lambda self: len(self.events) < MAX_EVENTS)
    @rule(timing=st.booleans())
    def create_event(self, timing):
        self.events.append(runtime.Event(enable_timing=timing))

    @precondition(lambda self: self.events)
    @rule(i=pick, stream=pick)
    def record_event(self, i, stream):
        self.events[i % len(self.events)].record(self.stream_for(stream).obj)

    @precondition(lambda self: self.events)
    @rule(i=pick, stream=pick)
    def wait_event(self, i, stream):
        self.stream_for(stream).obj.wait_event(self.events[i % len(self.events)])

    @rule(stream=pick, fail=st.booleans())
    def user_event_gate(self, stream, fail):
        """A stream waits on a user event: held until the host sets it; a failed one poisons
        the stream like a failed kernel."""
        # Only user streams fail: the model keeps the default streams clean (failing_kernel).
        fail = fail and self.async_mode and bool(self.streams)
        s = self.streams[stream % len(self.streams)] if fail else self.stream_for(stream)
        ev = runtime.UserEvent()
        s.obj.wait_event(ev)
        held = s.obj.record_event(enable_timing=False)
        assert not held.query()  # nothing passes an unset user event
        if fail:
            ev.set_status("injected by the state machine")
            s.poisoned = True
        else:
            ev.set()
            held.synchronize(timeout=30)
        assert held.query() or s.poisoned
        COUNTS["user_events"] += 1

    @precondition(lambda self: self.events)
    @rule(i=pick)
    def event_synchronize(self, i):
        e = self.events[i % len(self.events)]
        e.synchronize(timeout=30)
        assert e.query()

    @precondition(lambda self: self.events)
    @rule(i=pick)
    def destroy_event(self, i):
        e = self.events.pop(i % len(self.events))
        e.destroy()
        self.dead_events.append(e)
        del self.dead_events[:-4]
        with pytest.raises(runtime.InvalidHandleError):
            e.query()

    @precondition(lambda self: self.dead_events)
    @rule(i=pick, stream=pick, use=st.integers(0, 2))
    def use_destroyed_event(self, i, stream, use):
        e = self.dead_events[i % len(self.dead_events)]
        s = self.stream_for(stream).obj
        calls = [lambda: e.record(s), lambda: s.wait_event(e), lambda: e.synchronize()]
        with pytest.raises(runtime.InvalidHandleError):
            calls[use]()

    @rule(i=pick)
    def synchronize_stream(self, i):
        s = self.stream_for(i)
        self.expect_sync(s, lambda: s.obj.synchronize(timeout=30))

    @rule(device=st.integers(0, DEVICES - 1))
    def synchronize_device(self, device):
        ss = [s for s in self.all_streams() if s.device == device]
        if any(s.poisoned for s in ss):
            with pytest.raises(runtime.KernelError):
                runtime.Device(device).synchronize(timeout=30)
            kernel_error_seen()
        else:
            runtime.Device(device).synchronize(timeout=30)
        for s in ss:
            s.poisoned = False
            self.synced(s)

    def sync_all(self) -> None:
        if any(s.poisoned for s in self.all_streams()):
            with pytest.raises(runtime.KernelError):
                runtime.stream_synchronize(timeout=30)
            kernel_error_seen()
        else:
            runtime.stream_synchronize(timeout=30)
        for s in self.all_streams():
            s.poisoned = False
            self.synced(s)
        assert not self.pending

    @rule()
    def check_everything(self):
        """Global barrier, then every live handle and numpy view against the model, and the
        allocator statistics against the model's live allocations."""
        self.sync_all()
        for h in self.handles:
            assert self.read(h) == bytes(h.model()), f"contents of {h.obj!r} differ from the model"
        for arr, alloc, off in self.np_views:
            assert arr.reshape(-1).view(np.uint8).tobytes() == bytes(
                alloc.data[off : off + arr.nbytes]
            )
        self.check_stats()

    def check_stats(self) -> None:
        for d in range(DEVICES):
            s = runtime.memory_stats(d)
            assert s["active_allocations"] == self.model_live_count(d), (d, s)
            assert s["allocated"] <= s["reserved"] <= s["total"]

    @invariant()
    def stats_bounds(self):
        if not hasattr(self, "handles"):
            return
        COUNTS["steps"] += 1
        for d in range(DEVICES):
            s = runtime.memory_stats(d)
            assert s["allocated"] <= s["total"] and s["reserved"] <= s["total"]
            # queued operations may still hold freed allocations: never fewer than the model
            assert s["active_allocations"] >= self.model_live_count(d)

    # ------------------------------------------------------------------ capture and graphs

    def captured_op(self, kind: str, device: int, i: int, j: int, c: int):
        """One operation for a capture on ``device``: ``(issue(stream), allocs, apply)``, or
        None when no handle fits. ``apply`` updates the model from its state at replay time,
        so repeated launches compound (xor twice cancels, scale multiplies again)."""
        on_d = [h for h in self.handles if h.alloc.device == device]
        if kind == "fill":
            nums = [h for h in on_d if h.dtype in num_dtypes]
            if not nums:
                return None
            out = nums[i % len(nums)]
            dt = np.dtype(out.dtype)
            value = c if dt.kind == "i" else c / 4

            def apply():
                out.write(0, np.full(out.nbytes // dt.itemsize, value, dtype=dt).tobytes())

            return (lambda so: so.launch_kernel(kernels.fill, (out.obj, value))), [out], apply
        if kind in ("scale", "add"):  # integer views only: float NaN payloads are not modelled
            ints = [h for h in on_d if h.dtype in ("int32", "int64")]
            if not ints:
                return None
            out = ints[i % len(ints)]
            dt = np.dtype(out.dtype)
            same = [h for h in ints if h.dtype == out.dtype and h.nbytes == out.nbytes]
            x, y = same[j % len(same)], same[(i + j) % len(same)]
            ins = [x] if kind == "scale" else [x, y]
            if any(partial_overlap(out, p) for p in ins):
                return None  # refused at launch (covered by native_kernel)

            def arr(h):
                return np.frombuffer(bytes(h.model()), dtype=dt)

            if kind == "scale":
                alpha = c % 7 - 3
                args = (out.obj, x.obj, alpha)

                def apply():
                    out.write(0, (np.asarray(alpha, dtype=dt) * arr(x)).astype(dt).tobytes())

            else:
                args = (out.obj, x.obj, y.obj)

                def apply():
                    out.write(0, (arr(x) + arr(y)).astype(dt).tobytes())

            return (lambda so: so.launch_kernel(getattr(kernels, kind), args)), [out, *ins], apply
        if kind == "memset":
            if not on_d:
                return None
            h = on_d[i % len(on_d)]

            def apply():
                h.write(0, bytes([c]) * h.nbytes)

            return (lambda so: runtime.memset(h.obj, c, stream=so)), [h], apply
        # Python kernels, on a buffer of any device
        h = self.handles[i % len(self.handles)]
        if kind == "xor":

            def k(v, c=c):
                f = v.reshape(-1).view(np.uint8)
                f ^= c

            def apply():
                h.write(0, (np.frombuffer(bytes(h.model()), np.uint8) ^ c).tobytes())

        else:

            def k(v):
                f = v.reshape(-1).view(np.uint8)
                f[:] = f[::-1].copy()

            def apply():
                h.write(0, bytes(h.model()[::-1]))

        return (lambda so: so.launch_kernel(k, (h.obj,))), [h], apply

    def refuse_during_capture(self, how: str, s: SModel) -> None:
        """Anything that would wait for the capturing stream raises InvalidOperationError and
        changes nothing (a barrier refuses before it takes any stream's pending error)."""
        on_d = [h for h in self.handles if h.alloc.device == s.device]
        if how.startswith("blocking") and not on_d:
            how = "synchronize"
        if how == "blocking_d2h":
            h = on_d[0]
            host = np.full(h.nbytes, 0xEE, np.uint8)
            with pytest.raises(runtime.InvalidOperationError, match="capturing"), s.obj:
                runtime.memcpy_device_to_host(host, h.obj)  # on s: the current stream
            assert (host == 0xEE).all()
        elif how == "blocking_h2d":
            h = on_d[-1]
            with pytest.raises(runtime.InvalidOperationError, match="capturing"), s.obj:
                runtime.memcpy_host_to_device(h.obj, bytes([0x5A]) * h.nbytes)
        elif how == "synchronize":
            with pytest.raises(runtime.InvalidOperationError, match="capturing"):
                s.obj.synchronize(timeout=30)
        elif how == "barrier":
            with pytest.raises(runtime.InvalidOperationError, match="capturing"):
                runtime.stream_synchronize(timeout=30)
        else:
            with pytest.raises(runtime.InvalidOperationError, match="capturing"):
                runtime.Device(s.device).synchronize(timeout=30)
        COUNTS["capture_refusals"] += 1

    @precondition(lambda self: self.handles)
    @rule(
        stream=pick,
        other=pick,
        launch_on=pick,
        plan=st.lists(
            st.tuples(
                st.sampled_from(["fill", "scale", "add", "memset", "xor", "reverse"]),
                pick,
                pick,
                st.integers(1, 255),
            ),
            max_size=6,
        ),
        shape=st.sampled_from(["join", "join", "unjoined", "linear"]),
        cut=pick,
        refuse=st.sampled_from(
            [None, None, "blocking_d2h", "blocking_h2d", "synchronize", "barrier", "device"]
        ),
        launches=st.integers(1, 3),
    )
    def capture_graph(self, stream, other, launch_on, plan, shape, cut, refuse, launches):
        """Capture on ``s`` (fork: an event recorded on ``s`` that another stream waits on makes
        it join; join: ``s`` waits on the event that stream recorded last), then replay the
        graph 1-3 times on a stream of the device: each replay applies the captured
        operations in issue order. Nothing runs during the capture."""
        s = self.stream_for(stream)
        d = s.device
        ops = [op for op in (self.captured_op(k, d, i, j, c) for k, i, j, c in plan) if op]
        n = len(ops)
        a = cut % (n + 1)
        b = a + (cut >> 4) % (n - a + 1)
        temp = None
        t = None
        if shape != "linear":
            peers = [x.obj for x in self.all_streams() if x.device == d and x is not s]
            t = peers[other % len(peers)] if peers else None
            if t is None:
                t = temp = runtime.Stream(d)
        fork_ev = runtime.Event(enable_timing=False)
        join_ev = runtime.Event(enable_timing=False)
        s.obj.begin_capture()
        try:
            assert s.obj.is_capturing
            if shape == "linear":
                for issue, _, _ in ops:
                    issue(s.obj)
                nodes = n
            else:
                for issue, _, _ in ops[:a]:
                    issue(s.obj)
                fork_ev.record(s.obj)
                t.wait_event(fork_ev)  # fork: t joins the capture
                assert t.is_capturing
                for k, (issue, _, _) in enumerate(ops[a:b]):
                    issue(t if k % 2 == 0 else s.obj)  # both branches, interleaved
                nodes = n + 2
                if shape == "join":
                    join_ev.record(t)
                    s.obj.wait_event(join_ev)  # join
                    nodes += 2
                for issue, _, _ in ops[b:]:
                    issue(s.obj)
            if refuse is not None:
                self.refuse_during_capture(refuse, s)
                assert s.obj.is_capturing
        except BaseException:
            if s.obj.is_capturing:
                try:
                    s.obj.end_capture()
                except runtime.InvalidOperationError:
                    pass
            raise
        if shape == "unjoined":
            with pytest.raises(runtime.InvalidOperationError, match="not joined back"):
                s.obj.end_capture()
            assert not s.obj.is_capturing and not t.is_capturing
            COUNTS["unjoined_forks"] += 1
            if temp is not None:
                temp.destroy()
            return
        g = s.obj.end_capture()
        assert not s.obj.is_capturing and (t is None or not t.is_capturing)
        assert len(g) == nodes, g.nodes
        if temp is not None:
            temp.destroy()
        COUNTS["captures"] += 1
        cands = [x for x in self.all_streams() if x.device == d]
        launch = cands[launch_on % len(cands)]
        allocs = list({id(h.alloc): h.alloc for _, hs, _ in ops for h in hs}.values())

        def apply_all():
            for _, _, apply in ops:
                apply()

        for _ in range(launches):
            self.run_on(launch, allocs, lambda: g.launch(launch.obj), apply_all)
            COUNTS["graph_launches"] += 1

    # ------------------------------------------------------------------ with stream

    @precondition(lambda self: self.handles)
    @rule(
        stream=pick,
        nest=st.none() | pick,
        outer=st.none() | st.integers(0, DEVICES - 1),
        op=st.sampled_from(["d2h", "h2d", "memset", "to_device"]),
        i=pick,
        seed=st.integers(0, 255),
        prequeue=st.booleans(),
        fail=st.booleans(),
    )
    def with_stream(self, stream, nest, outer, op, i, seed, prequeue, fail):
        """``with s:`` (nested across devices, inside ``with Device(k):``): the device and the
        stream per device are current; a blocking copy of a buffer of device e runs on the
        current stream of e (after its queued work); on exit (also by an exception) the
        previous device and streams are back."""
        s = self.stream_for(stream)
        inner = s if nest is None else self.stream_for(nest)
        frame = {s.device: s}
        frame2 = {**frame, inner.device: inner}
        prev = 0 if outer is None else outer
        if op == "to_device" and len(self.handles) >= MAX_BUFFERS:
            op = "d2h"
        h = self.handles[i % len(self.handles)]
        dev = inner.device if op == "to_device" else h.alloc.device
        on = frame2.get(dev, self.defaults[dev])  # the stream the blocking call must use
        if prequeue and op != "to_device":
            # work queued on that stream just before: the blocking call must come after it
            def k(v, c=seed | 1):
                f = v.reshape(-1).view(np.uint8)
                f ^= c

            def apply_k():
                h.write(0, (np.frombuffer(bytes(h.model()), np.uint8) ^ (seed | 1)).tobytes())

            self.run_on(on, [h.alloc], lambda: on.obj.launch_kernel(k, (h.obj,)), apply_k)

        def check(cur_dev: int, cur: SModel | None, fr: dict) -> None:
            assert runtime.get_device() == cur_dev
            want = cur.obj if cur is not None else runtime.default_stream(cur_dev)
            assert runtime.current_stream() == want
            for e in range(DEVICES):
                assert runtime.current_stream(e) == (fr[e].obj if e in fr else self.defaults[e].obj)

        class Boom(Exception):
            pass

        def blocking_call():
            COUNTS["with_blocking_ops"] += 1
            if op == "d2h":
                host = np.full(h.nbytes, 0xEE, np.uint8)

                def apply():
                    assert host.tobytes() == bytes(h.model()), "d2h inside with differs"

                if not self.blocking_on(
                    on, [h.alloc], lambda: runtime.memcpy_device_to_host(host, h.obj), apply
                ):
                    assert (host == 0xEE).all(), "a skipped d2h wrote the host buffer"
            elif op == "h2d":
                data = pattern(h.nbytes, seed)
                self.blocking_on(
                    on,
                    [h.alloc],
                    lambda: runtime.memcpy_host_to_device(h.obj, data),
                    lambda: h.write(0, data),
                )
            elif op == "memset":
                self.blocking_on(
                    on,
                    [h.alloc],
                    lambda: runtime.memset(h.obj, seed),
                    lambda: h.write(0, bytes([seed]) * h.nbytes),
                )
            else:
                host = np.frombuffer(pattern(seed * 13, seed), np.uint8)
                made = []

                def apply():
                    b = made[0]
                    assert int(b.device) == inner.device and b.nbytes == host.nbytes
                    alloc = Alloc(inner.device, host.nbytes)
                    alloc.data[:] = host.tobytes()
                    self.add_handle(b, alloc, 0, host.nbytes, "uint8")

                self.blocking_on(on, [], lambda: made.append(runtime.to_device(host)), apply)

        def body():
            with s.obj as entered:
                assert entered is s.obj
                check(s.device, s, frame)
                if nest is None:
                    blocking_call()
                    if fail:
                        raise Boom
                    return
                with inner.obj:
                    check(inner.device, inner, frame2)
                    blocking_call()
                    if fail:
                        raise Boom
                check(s.device, s, frame)

        def run():
            check(prev, None, {})
            try:
                body()
            except Boom:
                assert fail
            check(prev, None, {})

        assert runtime.get_device() == 0
        if outer is None:
            run()
        else:
            with runtime.Device(outer):
                run()
        check(0, None, {})
        COUNTS["with_blocks"] += 1

    # ------------------------------------------------------------------ callbacks

    @precondition(lambda self: self.handles)
    @rule(
        stream=pick,
        other=pick,
        as_kernel=st.booleans(),
        actions=st.sets(st.sampled_from(CALLBACK_ACTIONS), min_size=1, max_size=5),
        i=pick,
        j=pick,
        seed=st.integers(0, 255),
    )
    def callback_calls_runtime(self, stream, other, as_kernel, actions, i, j, seed):
        """A host function or Python kernel that calls back into the runtime from the worker
        thread. Everything is idle first, so the outcome of each call is exact: allowed
        calls (a blocking copy on another, idle stream; ``query``; a launch and an
        ``Event.record`` on another stream) take effect, and waits that need the callback's
        own stream (its synchronize, the barriers, ``shutdown``, its destroy, a blocking copy
        on it) raise InvalidOperationError inside the callback."""
        self.sync_all()
        s = self.stream_for(stream)
        others = [x for x in self.all_streams() if x is not s]
        t = others[other % len(others)]
        h = self.handles[i % len(self.handles)]
        # the launch on t touches another allocation than the copies (see bug 4 below)
        xs = [g for g in self.handles if g.alloc is not h.alloc]
        x = xs[j % len(xs)] if xs else None
        if x is None:
            actions = actions - {"launch_other"} or {"query"}
        # Without a frame the worker thread's blocking copy uses the default stream of the
        # buffer's device: that is the callback's own stream when s is that default stream.
        own_copy = s.default and s.device == h.alloc.device
        # A blocking copy on the callback's own stream is refused before anything is queued
        # (it could not wait for that stream there); on an idle stream it runs right there, in
        # synchronous mode a launch on another, idle stream too.
        order = [a for a in CALLBACK_ACTIONS if a in actions]
        # (t's query is left out when copies ran on t: that is asked in other rules)
        t_copies = t is self.defaults[h.alloc.device] and bool({"d2h", "h2d"} & actions)
        host = np.full(h.nbytes, 0xEE, np.uint8)
        data = pattern(h.nbytes, seed)
        ev = runtime.Event(enable_timing=False)
        c = seed | 1

        def k(v):
            f = v.reshape(-1).view(np.uint8)
            f ^= c

        calls = {
            "d2h": lambda: runtime.memcpy_device_to_host(host, h.obj),
            "h2d": lambda: runtime.memcpy_host_to_device(h.obj, data),
            "query": lambda: (s.obj.query(), None if t_copies else t.obj.query()),
            "launch_other": lambda: t.obj.launch_kernel(k, (x.obj,)),
            "record_other": lambda: ev.record(t.obj),
            "sync_own": lambda: s.obj.synchronize(timeout=30),
            "barrier": lambda: runtime.stream_synchronize(timeout=30),
            "device_own": lambda: runtime.Device(s.device).synchronize(timeout=30),
            "shutdown": runtime.shutdown,
            "destroy_own": s.obj.destroy,
        }
        refused = "InvalidOperationError"
        expect = {}
        want_host = None
        for name in order:
            if name in ("d2h", "h2d"):
                if own_copy:
                    expect[name] = refused
                elif name == "d2h":
                    expect[name] = "ok"
                    want_host = bytes(h.model())
                else:
                    expect[name] = "ok"
            elif name == "query":
                expect[name] = (False, None if t_copies else True)  # s runs it; t is idle
            elif name in ("launch_other", "record_other"):
                expect[name] = "ok"
            else:
                expect[name] = refused
        seen = {}

        def callback(*_):
            for name in order:
                try:
                    r = calls[name]()
                    seen[name] = "ok" if r is None else r
                except BaseException as e:  # recorded, never raised out of the callback
                    seen[name] = type(e).__name__

        if as_kernel:
            s.obj.launch_kernel(callback)
        else:
            s.obj.launch_host_func(callback)
        s.obj.synchronize(timeout=30)
        self.synced(s)
        assert seen == expect, (seen, expect)
        assert runtime.is_initialized()
        COUNTS["callbacks"] += 1
        COUNTS["callback_calls_refused"] += sum(v == refused for v in expect.values())
        COUNTS["callback_calls_allowed"] += sum(v != refused for v in expect.values())
        # the model, in the order the callback ran the calls
        if expect.get("d2h") == "ok":
            assert host.tobytes() == want_host, "d2h from a callback differs from the model"
        elif "d2h" in expect:
            assert (host == 0xEE).all(), "a refused d2h wrote the host buffer"
        if expect.get("h2d") == "ok":
            h.write(0, data)
        if "launch_other" in expect:
            x.write(0, (np.frombuffer(bytes(x.model()), np.uint8) ^ c).tobytes())
            x.alloc.owner = t  # queued on t by the callback, not known complete
            COUNTS["ops_applied"] += 1
            if not self.async_mode:
                self.synced(t)
        if "record_other" in expect:
            ev.synchronize(timeout=30)
            assert t.obj.query(), "the event recorded last on t completed, t must be idle"
            self.synced(t)

    # ------------------------------------------------------------------ fork

    @precondition(lambda self: hasattr(os, "fork"))
    @rule(go=st.integers(0, FORK_ONE_IN - 1), i=pick, j=pick, seed=st.integers(1, 255))
    def fork_process(self, go, i, j, seed):
        """Rarely: fork. In the child every inherited handle fails (buffers, streams and graphs
        with InvalidHandleError; events and global calls with NotInitializedError until
        ``init``, InvalidHandleError after it), ``init`` works and a round trip is exact. The
        parent's runtime and model go on unchanged (checked by the later rules)."""
        if go:
            return
        buf = self.handles[i % len(self.handles)].obj if self.handles else None
        s = self.stream_for(j).obj
        ev = self.events[j % len(self.events)] if self.events else runtime.Event()
        s.begin_capture()
        s.launch_kernel(kernels.noop)
        graph = s.end_capture()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            status = 1
            try:
                os.close(r)
                # a hang dumps the child's Python stacks into the pipe (the parent adds the
                # native ones, then fails). A signal handler, not dump_traceback_later: that
                # first cancels the parent's timer (the conftest's fallback without
                # pytest-timeout), whose lock the parent's watchdog thread held at the fork,
                # and the child hung on it.
                faulthandler.register(signal.SIGALRM, file=w, all_threads=True)
                signal.alarm(15)
                os.write(w, fork_child(buf, s, ev, graph, seed).encode()[:4000])
                status = 0
            except BaseException as e:
                try:
                    os.write(w, f"child: {type(e).__name__}: {e}".encode()[:4000])
                except BaseException:
                    pass
            finally:
                os._exit(status)
        os.close(w)
        deadline = time.monotonic() + 30
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                stacks = native_stacks(pid)
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                with os.fdopen(r, "rb") as f:
                    py_stacks = f.read().decode(errors="replace")
                raise AssertionError(
                    f"a forked child hung for 30 s; Python:\n{py_stacks}\nnative:\n{stacks}"
                )
            time.sleep(0.005)
        with os.fdopen(r, "rb") as f:
            msg = f.read().decode()
        # faulthandler's dump: the child hung (a failure, with its Python stacks)
        assert "Thread 0x" not in msg and "Current thread" not in msg, f"child hung:\n{msg}"
        assert os.waitstatus_to_exitcode(status) == 0, msg
        assert msg == "ok", msg
        COUNTS["forks"] += 1

    # ------------------------------------------------------------------ options, lifecycle

    @rule(name=st.sampled_from(OPTIONS), value=st.booleans())
    def set_option(self, name, value):
        runtime.set_option(name, value)
        assert runtime.get_option(name) is value
        if name == "enableAsync":
            self.async_mode = value

    @rule(device=st.none() | st.integers(0, DEVICES - 1))
    def empty_cache(self, device):
        runtime.empty_cache(device)

    @rule(go=st.integers(0, 3))
    def shutdown_and_init(self, go):
        if go:
            return
        COUNTS["shutdowns"] += 1
        old_bufs = [h.obj for h in self.handles] + [h.obj for h in self.freed]
        old_streams = [s.obj for s in self.streams]
        old_events = list(self.events)
        runtime.shutdown()  # waits for queued work; pending kernel errors are dropped
        for s in self.all_streams():
            s.poisoned = False
            self.synced(s)
        assert not self.pending
        # numpy views keep their memory (and its contents) after shutdown
        for arr, alloc, off in self.np_views:
            assert arr.reshape(-1).view(np.uint8).tobytes() == bytes(
                alloc.data[off : off + arr.nbytes]
            )
        runtime.init(device_count=DEVICES, memory=MEMORY)
        for b in old_bufs:
            assert b.freed
            with pytest.raises(runtime.InvalidHandleError):
                runtime.memcpy_device_to_host(bytearray(b.nbytes), b)
        for s in old_streams:
            with pytest.raises(runtime.InvalidHandleError):
                s.launch_kernel(kernels.noop)
        for e in old_events:  # events belong to their runtime as well
            with pytest.raises(runtime.InvalidHandleError):
                e.query()
        self.events = []
        self.stale = (old_bufs + old_streams)[-8:]
        self.handles, self.freed, self.streams, self.destroyed, self.np_views = [], [], [], [], []
        self.defaults = [SModel(runtime.default_stream(d), d, default=True) for d in range(DEVICES)]
        for d in range(DEVICES):
            s = runtime.memory_stats(d)
            assert s["active_allocations"] == 0 and s["allocated"] == 0, s

    def teardown(self):
        if not hasattr(self, "handles"):
            return
        try:
            if not runtime.is_initialized():  # a failure inside shutdown_and_init
                return
            self.sync_all()
            for h in self.handles:
                assert self.read(h) == bytes(h.model())
            self.check_stats()
            for h in list(self.handles):
                runtime.device_free(h.obj)
                self.drop_handle(h)
            self.np_views.clear()
            for s in self.streams:
                s.obj.destroy()
            for d in range(DEVICES):
                s = runtime.memory_stats(d)
                assert s["active_allocations"] == 0 and s["allocated"] == 0, s
        finally:
            for o, v in SAVED_OPTIONS.items():
                runtime.set_option(o, v)
            # Whatever happened above, the next example starts from a fresh runtime (after a
            # failure the checks above stop early and would leave buffers behind).
            self.handles, self.np_views, self.streams, self.pending = [], [], [], []
            runtime.shutdown()
            runtime.init(device_count=DEVICES, memory=MEMORY)


EXAMPLES = os.environ.get("RELIABILITY_STATEFUL_EXAMPLES")  # overrides the profile's count
Machine.TestCase.settings = settings(
    settings.default,
    stateful_step_count=STEPS,
    **({"max_examples": int(EXAMPLES)} if EXAMPLES else {}),
)
TestStateMachine = Machine.TestCase


def test_zz_report_counts():
    """Print what the state machine ran (``pytest -s`` shows it; RELIABILITY.md quotes it)."""
    print(
        f"\nstateful: {COUNTS['examples']} examples, {COUNTS['steps']} steps, "
        f"{COUNTS['shutdowns']} shutdown+init cycles, {COUNTS['ops_applied']} stream operations "
        f"checked, {COUNTS['ops_skipped']} skipped behind a kernel error, "
        f"{COUNTS['kernel_errors']} KernelErrors expected and seen, {COUNTS['invalid_handles']} "
        f"invalid-handle uses refused (max_examples={Machine.TestCase.settings.max_examples})"
        f"\nstateful: {COUNTS['captures']} graphs captured and {COUNTS['graph_launches']} "
        f"replays checked, {COUNTS['unjoined_forks']} unjoined forks refused at end_capture, "
        f"{COUNTS['capture_refusals']} waits refused during capture; {COUNTS['with_blocks']} "
        f"`with stream:` blocks ({COUNTS['with_blocking_ops']} blocking calls in them); "
        f"{COUNTS['callbacks']} callbacks calling the runtime ({COUNTS['callback_calls_allowed']} "
        f"allowed calls checked, {COUNTS['callback_calls_refused']} refused as predicted); "
        f"{COUNTS['forks']} forks checked; {COUNTS['user_events']} user-event gates"
    )
    if COUNTS["examples"] == 0:
        pytest.skip("the state machine did not run in this session")
    assert COUNTS["examples"] >= Machine.TestCase.settings.max_examples
