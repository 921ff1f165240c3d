"""Fault injection: every fault ends with a clear error, a runtime that keeps working, and the
allocator statistics back at baseline.

Faults injected (each test adds to ``FAULTS``; the last test prints the tally for
RELIABILITY.md):

* the nth allocation fails (``_inject_alloc_failure``), for every n through workloads of
  ``device_malloc`` / ``empty`` / ``zeros`` / ``to_device`` (with and without a stream) /
  copies, with memory reuse on and off and with cached blocks that could have served it;
* native kernels that return an error (``test_error``) or panic (``test_panic``) at random
  points among good work, asynchronously and with ``enableAsync`` off;
* Python kernels and host functions raising (several exception types, KeyboardInterrupt and
  SystemExit included) at random points;
* ``KeyboardInterrupt`` (``_thread.interrupt_main``) during ``Stream.synchronize``,
  ``Event.synchronize``, device and global barriers, stream destroy, and blocking copies queued
  behind large copies or a slow Python kernel;
* shutdown with work queued on many streams (and with failed kernels pending), and shutdown
  while another thread is launching and waiting;
* destroying a stream while other threads launch on it, and barriers racing with destroys.

Baseline: after every test all streams are synchronised, ``allocated == 0`` and
``active_allocations == 0`` on every device, and after ``empty_cache`` ``reserved`` is back
to its value at the start (0).
"""

from __future__ import annotations

import _thread
import collections
import gc
import threading
import time

import numpy as np
import pytest

import runtime
from runtime import kernels

DEVICES = 4
MiB = 1 << 20
WAIT = 30.0
FAULTS: collections.Counter[str] = collections.Counter()


@pytest.fixture(scope="module", autouse=True)
def _runtime():
    runtime.shutdown()
    runtime.init(device_count=DEVICES, memory="256MiB")
    runtime._runtime._register_test_kernels()
    yield
    runtime.set_option("enableAsync", True)
    runtime.set_option("enableMemoryReuse", True)
    runtime.shutdown()


def settle(device: int) -> dict:
    """empty_cache until nothing is cached (the scrubber may hold a block for a moment)."""
    for _ in range(1000):
        runtime.empty_cache(device)
        s = runtime.memory_stats(device)
        if s["reserved"] == s["allocated"]:
            return s
        time.sleep(0.002)
    return runtime.memory_stats(device)


def at_baseline() -> None:
    # A KernelError keeps the kernel's exception (``__cause__``) and its traceback, whose
    # frames hold the kernel's numpy views of device memory; a test that kept the error in a
    # local makes a reference cycle. Collect it, so the views (and the memory) go.
    gc.collect()
    runtime.stream_synchronize(timeout=WAIT)
    for d in range(DEVICES):
        # queued operations drop their buffers when they complete; allow a moment
        for _ in range(500):
            s = runtime.memory_stats(d)
            if s["active_allocations"] == 0:
                break
            time.sleep(0.002)
        assert s["active_allocations"] == 0 and s["allocated"] == 0, (d, s)
        s = settle(d)
        assert s["reserved"] == 0, (d, s)


#: Faults each test of this module injected (checked by the report at the end).
INJECTED: dict[str, int] = {}


@pytest.fixture(autouse=True)
def _baseline(request):
    if runtime.is_initialized():
        at_baseline()
    before = sum(FAULTS.values())
    yield
    INJECTED[request.node.name] = sum(FAULTS.values()) - before
    for d in range(DEVICES):
        runtime._runtime._inject_alloc_failure(d, 0)
    runtime.set_option("enableAsync", True)
    runtime.set_option("enableMemoryReuse", True)
    if not runtime.is_initialized():
        runtime.init(device_count=DEVICES, memory="256MiB")
    at_baseline()


def works(device: int = 0) -> None:
    """The runtime still works: allocate, copy both ways, run a kernel, free."""
    s = runtime.Stream(device)
    x = runtime.to_device(np.arange(1000, dtype=np.int64), device=device)
    s.launch_kernel(kernels.scale, (x, x, 3))
    s.synchronize(timeout=WAIT)
    np.testing.assert_array_equal(x.copy_to_host(), np.arange(1000) * 3)
    runtime.device_free(x)
    s.destroy()


# ------------------------------------------------------------------ allocation failures


def workload(device: int, stream, log: list):
    """Allocations of every kind and size class, each followed by a use; returns the buffers.

    ``log`` records each allocation attempt, so the test knows which one failed.
    """
    bufs = []

    def alloc(kind, f):
        log.append(kind)
        b = f()
        bufs.append(b)
        return b

    a = alloc("malloc 64 B", lambda: runtime.device_malloc(device, 64))
    runtime.memset(a, 1)
    b = alloc("malloc 1 MiB", lambda: runtime.device_malloc(device, MiB))
    runtime.memcpy_host_to_device(b, np.full(MiB, 2, np.uint8))
    c = alloc("empty int32", lambda: runtime.empty((3, 5), "int32", device=device))
    runtime.memcpy_d2d(c, a, count=60)
    alloc("zeros float64", lambda: runtime.zeros(1000, "float64", device=device))
    host = np.arange(5000, dtype=np.float32)
    d = alloc("to_device", lambda: runtime.to_device(host, device=device))
    e = alloc("to_device stream", lambda: runtime.to_device(host, device=device, stream=stream))
    f = alloc("malloc 3 MiB", lambda: runtime.device_malloc(device, 3 * MiB + 17))
    runtime.memcpy_d2d(f, b, stream)
    g = alloc("malloc 40 KiB", lambda: runtime.device_malloc(device, 40_000))
    stream.launch_kernel(kernels.add, (d, d, e))
    stream.synchronize(timeout=WAIT)
    np.testing.assert_array_equal(d.copy_to_host(), host * 2)
    assert (np.asarray(f)[:MiB] == 2).all() and not np.asarray(f)[MiB:].any()
    assert not np.asarray(g).any()
    assert (np.asarray(c).view(np.uint8)[:60] == 1).all()
    return bufs


N_ALLOCS = 8


@pytest.mark.parametrize("reuse", [True, False])
@pytest.mark.parametrize("nth", range(1, N_ALLOCS + 2))
def test_nth_allocation_fails(nth, reuse):
    runtime.set_option("enableMemoryReuse", reuse)
    dev = nth % DEVICES
    s = runtime.Stream(dev)
    # warm the caches, so that a cached block could have served the failing allocation
    for buf in workload(dev, s, []):
        runtime.device_free(buf)
    before = runtime.memory_stats(dev)
    runtime._runtime._inject_alloc_failure(dev, nth)
    log: list[str] = []
    bufs = []
    if nth <= N_ALLOCS:
        with pytest.raises(runtime.OutOfMemoryError, match=rf"device {dev}: tried to allocate"):
            workload(dev, s, log)
        assert len(log) == nth, f"the failure hit allocation {len(log)}, not {nth}"
        FAULTS["allocation failure"] += 1
        after = runtime.memory_stats(dev)
        assert after["num_ooms"] == before["num_ooms"] + 1
    else:
        bufs = workload(dev, s, log)  # fewer allocations than nth: nothing fails
        runtime._runtime._inject_alloc_failure(dev, 0)
    s.synchronize(timeout=WAIT)
    # the buffers the failed workload made are dropped with it; the runtime still works
    for buf in bufs:
        runtime.device_free(buf)
    for buf in workload(dev, s, []):
        runtime.device_free(buf)
    s.destroy()
    works(dev)


def test_allocation_failure_inside_view_and_kernel_paths_changes_nothing():
    """A failed allocation in the middle of a stream's work leaves the queued work intact."""
    s = runtime.Stream(1)
    x = runtime.to_device(np.arange(64, dtype=np.int32), device=1)
    s.launch_kernel(kernels.scale, (x, x, 2))
    runtime._runtime._inject_alloc_failure(1, 1)
    with pytest.raises(runtime.OutOfMemoryError):
        runtime.to_device(np.ones(8, np.int32), device=1, stream=s)
    s.launch_kernel(kernels.scale, (x, x, 5))
    s.synchronize(timeout=WAIT)
    np.testing.assert_array_equal(x.copy_to_host(), np.arange(64) * 10)
    FAULTS["allocation failure"] += 1
    runtime.device_free(x)
    s.destroy()


@pytest.mark.parametrize("seed", range(6))
def test_allocation_failures_at_random_points_of_random_work(seed):
    rng = np.random.default_rng(seed)
    live = []
    for _ in range(60):
        dev = int(rng.integers(0, DEVICES))
        if rng.random() < 0.2:
            runtime._runtime._inject_alloc_failure(dev, int(rng.integers(1, 4)))
        size = int(rng.choice([1, 100, 4096, 33_000, MiB, 5 * MiB]))
        try:
            b = runtime.device_malloc(dev, size)
        except runtime.OutOfMemoryError as e:
            assert str(size) in str(e)
            FAULTS["allocation failure"] += 1
            continue
        assert not np.asarray(b).any()
        runtime.memset(b, int(rng.integers(0, 256)))
        live.append(b)
        if len(live) > 6:
            runtime.device_free(live.pop(int(rng.integers(0, len(live)))))
    for b in live:
        runtime.device_free(b)


# ------------------------------------------------------------------ failing kernels


def _good_ops(s, x, rng, n):
    """n random good ops on int64 buffer x (on s); returns a function applying them to a model."""
    ops = []
    for _ in range(n):
        k = int(rng.integers(0, 3))
        v = int(rng.integers(-5, 6))
        if k == 0:
            ops.append(("fill", v))
        elif k == 1:
            ops.append(("scale", v))
        else:
            ops.append(("add", 0))
    return ops


def _launch(s, x, op):
    kind, v = op
    if kind == "fill":
        s.launch_kernel(kernels.fill, (x, v))
    elif kind == "scale":
        s.launch_kernel(kernels.scale, (x, x, v))
    else:
        s.launch_kernel(kernels.add, (x, x, x))


def _apply(model, op):
    kind, v = op
    if kind == "fill":
        model[:] = v
    elif kind == "scale":
        model *= v
    else:
        model += model


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("bad", ["test_error", "test_panic", "python"])
def test_failing_kernel_at_a_random_point_skips_the_rest_until_synchronize(bad, seed):
    rng = np.random.default_rng(seed)
    dev = seed % DEVICES
    s, other = runtime.Stream(dev), runtime.Stream(dev)
    x = runtime.to_device(np.arange(16, dtype=np.int64), device=dev)
    y = runtime.to_device(np.arange(16, dtype=np.int64), device=dev)
    model = np.arange(16, dtype=np.int64)
    before, after = _good_ops(s, x, rng, int(rng.integers(0, 8))), _good_ops(s, x, rng, 6)
    for op in before:
        _launch(s, x, op)
        _apply(model, op)

    def boom(*args):
        raise ValueError(f"injected failure {seed}")

    kernel = boom if bad == "python" else bad
    s.launch_kernel(kernel, (x,))
    e = s.record_event()  # records behind a failure still complete
    for op in after:
        _launch(s, x, op)  # skipped
    other.wait_event(e)  # another stream waiting behind the failure does not hang
    other.launch_kernel(kernels.add, (y, y, y))
    with pytest.raises(runtime.KernelError) as info:
        s.synchronize(timeout=WAIT)
    err = info.value
    assert err.kernel == ("boom" if bad == "python" else bad) or "boom" in err.kernel
    assert err.stream == s.id
    if bad == "python":
        assert isinstance(err.__cause__, ValueError)
    FAULTS[f"kernel failure: {bad}"] += 1
    other.synchronize(timeout=WAIT)
    e.synchronize(timeout=WAIT)
    np.testing.assert_array_equal(x.copy_to_host(), model)  # work after the failure skipped
    np.testing.assert_array_equal(y.copy_to_host(), np.arange(16) * 2)
    # the stream works again, in order
    for op in after:
        _launch(s, x, op)
        _apply(model, op)
    s.synchronize(timeout=WAIT)
    np.testing.assert_array_equal(x.copy_to_host(), model)
    for b in (x, y):
        runtime.device_free(b)
    s.destroy()
    other.destroy()


@pytest.mark.parametrize("bad", ["test_error", "test_panic", "python"])
def test_failing_kernel_in_sync_mode_raises_at_the_launch(bad):
    s = runtime.Stream(2)
    x = runtime.to_device(np.ones(8, np.float32), device=2)
    runtime.set_option("enableAsync", False)
    try:

        def boom():
            raise KeyError("sync-mode failure")

        with pytest.raises(runtime.KernelError):
            s.launch_kernel(boom if bad == "python" else bad)
        FAULTS[f"kernel failure: {bad}"] += 1
        s.launch_kernel(kernels.scale, (x, x, 4.0))  # runs at once, no stale error
        np.testing.assert_array_equal(np.asarray(x), np.full(8, 4.0, np.float32))
    finally:
        runtime.set_option("enableAsync", True)
    s.synchronize(timeout=WAIT)
    runtime.device_free(x)
    s.destroy()


class CustomError(Exception):
    pass


@pytest.mark.parametrize(
    "exc",
    [
        ValueError("v"),
        KeyError("k"),
        ZeroDivisionError("z"),
        CustomError("c"),
        MemoryError("m"),
        RecursionError("r"),
        KeyboardInterrupt(),
        SystemExit(3),
        GeneratorExit(),
    ],
    ids=lambda e: type(e).__name__,
)
@pytest.mark.parametrize("launch", ["kernel", "host_func"])
def test_python_kernel_raising_any_exception_becomes_kernel_error(exc, launch):
    """Even BaseExceptions raised inside a kernel stay on the stream: they surface as a
    KernelError with the original as ``__cause__`` and never unwind the caller or a worker."""
    s = runtime.Stream(3)
    ran = []

    def bad(*args):
        raise exc

    if launch == "kernel":
        s.launch_kernel(bad, (1,))
    else:
        s.launch_host_func(bad, 1)
    s.launch_host_func(ran.append, "skipped")
    with pytest.raises(runtime.KernelError) as info:
        s.synchronize(timeout=WAIT)
    assert isinstance(info.value.__cause__, type(exc))
    assert ran == []
    FAULTS["python kernel raises " + type(exc).__name__] += 1
    s.launch_host_func(ran.append, "after")
    s.synchronize(timeout=WAIT)
    assert ran == ["after"]
    s.destroy()
    works(3)


def test_failures_on_many_streams_surface_once_each_at_barriers():
    streams = [runtime.Stream(i % DEVICES) for i in range(8)]
    for i, s in enumerate(streams):
        if i % 2:
            s.launch_kernel("test_error" if i % 4 == 1 else "test_panic")
        s.launch_kernel(kernels.noop)
    with pytest.raises(runtime.KernelError):
        runtime.stream_synchronize(timeout=WAIT)
    FAULTS["kernel failure: test_error"] += 2
    FAULTS["kernel failure: test_panic"] += 2
    runtime.stream_synchronize(timeout=WAIT)  # errors were reported (and cleared)
    for s in streams:
        s.synchronize(timeout=WAIT)
        s.destroy()


# ------------------------------------------------------------------ Ctrl-C while waiting


def interrupted(call, delay: float) -> bool:
    """Run ``call()`` while a timer interrupts the main thread after ``delay`` seconds; True if
    ``call`` raised KeyboardInterrupt (a late interrupt is absorbed here)."""
    timer = threading.Timer(delay, _thread.interrupt_main)
    raised = False
    try:
        timer.start()
        try:
            call()
        except KeyboardInterrupt:
            raised = True
        finally:
            timer.join()
            time.sleep(0.05)
    except KeyboardInterrupt:
        pass
    return raised


def slow_kernel(stop: threading.Event, seconds: float = WAIT):
    def kernel():
        deadline = time.monotonic() + seconds
        while not stop.is_set() and time.monotonic() < deadline:
            time.sleep(0.005)

    return kernel


WAITS = {
    "stream.synchronize": lambda s, e, dev: s.synchronize(timeout=WAIT),
    "event.synchronize": lambda s, e, dev: e.synchronize(timeout=WAIT),
    "device.synchronize": lambda s, e, dev: runtime.Device(dev).synchronize(timeout=WAIT),
    "stream_synchronize": lambda s, e, dev: runtime.stream_synchronize(timeout=WAIT),
    "stream.destroy": lambda s, e, dev: s.destroy(),
}


@pytest.mark.parametrize("delay", [0.02, 0.1, 0.25])
@pytest.mark.parametrize("wait", list(WAITS))
def test_keyboard_interrupt_during_a_wait_behind_a_slow_python_kernel(wait, delay):
    dev = 1
    s = runtime.Stream(dev)
    x = runtime.to_device(np.arange(256, dtype=np.int64), device=dev)
    stop = threading.Event()
    s.launch_kernel(slow_kernel(stop))
    s.launch_kernel(kernels.scale, (x, x, 2))
    e = s.record_event()
    try:
        assert interrupted(lambda: WAITS[wait](s, e, dev), delay)
        FAULTS["KeyboardInterrupt during " + wait] += 1
        assert "destroyed" not in repr(s)  # an interrupted destroy leaves the stream alive
    finally:
        stop.set()
    s.synchronize(timeout=WAIT)  # the queued work still completes
    np.testing.assert_array_equal(x.copy_to_host(), np.arange(256) * 2)
    runtime.device_free(x)
    s.destroy()
    works(dev)


@pytest.mark.parametrize("copy", ["d2h", "h2d", "d2d", "memset"])
def test_keyboard_interrupt_during_a_blocking_copy_behind_large_copies(copy):
    """Large copies queued on the current stream; a blocking copy waits behind them and is
    interrupted; afterwards everything lands and the data is right."""
    dev = 2
    s = runtime.Stream(dev)
    n = 32 * MiB
    big_src = runtime.device_malloc(dev, n)
    big_dst = runtime.device_malloc(dev, n)
    runtime.memset(big_src, 0x5A)
    pat = (np.arange(4096) % 251).astype(np.uint8)
    small = runtime.to_device(pat, device=dev)
    other = runtime.device_malloc(dev, 4096)
    host = np.zeros(4096, np.uint8)
    stop = threading.Event()
    s.launch_kernel(slow_kernel(stop, 2.0))  # make sure the copy really waits
    for _ in range(16):
        runtime.memcpy_d2d(big_dst, big_src, s)
    calls = {
        "d2h": lambda: runtime.memcpy_device_to_host(host, small),
        "h2d": lambda: runtime.memcpy_host_to_device(other, np.full(4096, 7, np.uint8)),
        "d2d": lambda: runtime.memcpy_d2d(other, small),
        "memset": lambda: runtime.memset(other, 9),
    }
    try:
        with s:
            assert interrupted(calls[copy], 0.1)
        FAULTS["KeyboardInterrupt during blocking " + copy] += 1
    finally:
        stop.set()
    s.synchronize(timeout=WAIT)
    assert (np.asarray(big_dst) == 0x5A).all()
    want = {
        "d2h": lambda: np.testing.assert_array_equal(host, pat),
        "h2d": lambda: np.testing.assert_array_equal(np.asarray(other), np.full(4096, 7)),
        "d2d": lambda: np.testing.assert_array_equal(np.asarray(other), pat),
        "memset": lambda: np.testing.assert_array_equal(np.asarray(other), np.full(4096, 9)),
    }
    want[copy]()
    for b in (big_src, big_dst, small, other):
        runtime.device_free(b)
    s.destroy()
    works(dev)


def test_keyboard_interrupt_storm():
    """Interrupts at random moments of random waits, back to back: never a hang or a crash."""
    rng = np.random.default_rng(7)
    s = runtime.Stream(0)
    x = runtime.to_device(np.zeros(1, np.int64), device=0)
    one = runtime.to_device(np.ones(1, np.int64), device=0)
    expect = 0
    for i in range(20):
        stop = threading.Event()
        s.launch_kernel(slow_kernel(stop, 0.3))
        k = int(rng.integers(1, 50))
        for _ in range(k):
            s.launch_kernel(kernels.add, (x, x, one))
        expect += k
        wait = list(WAITS)[i % 4]  # not destroy: the stream is reused
        e = s.record_event()
        interrupted(lambda w=wait, e=e: WAITS[w](s, e, 0), float(rng.uniform(0.0, 0.2)))
        FAULTS["KeyboardInterrupt storm"] += 1
        stop.set()
    s.synchronize(timeout=WAIT)
    assert x.copy_to_host()[0] == expect
    for b in (x, one):
        runtime.device_free(b)
    s.destroy()


# ------------------------------------------------------------------ shutdown with queued work


def test_shutdown_with_work_queued_on_many_streams():
    log = []
    streams = [runtime.Stream(i % DEVICES, -(i % 3)) for i in range(16)]
    hosts = []
    bufs = []
    views = []
    for i, s in enumerate(streams):
        dev = i % DEVICES
        b = runtime.to_device(np.full(MiB // 8, i, np.int64), device=dev, stream=s)
        s.launch_host_func(time.sleep, 0.005)
        s.launch_kernel(kernels.scale, (b, b, 3))
        # a Python kernel with a buffer argument: it runs while shutdown drains (regression:
        # it used to fail there, "the runtime was shut down", skipping the rest of its stream)
        s.launch_kernel(np.add, (b, 0, b))
        # Into pageable memory a queued copy is complete on return (CUDA's rule), so it
        # comes before the failures: they stay pending until shutdown drops them.
        h = np.zeros(MiB // 8, np.int64)
        runtime.memcpy_device_to_host(h, b, s)
        if i % 5 == 0:
            s.launch_kernel("test_panic")  # pending errors are dropped by shutdown
        if i % 5 == 1:
            s.launch_kernel(lambda: 1 / 0)
        s.launch_host_func(log.append, i)
        hosts.append((i, h))
        bufs.append(b)
        if i % 4 == 0:
            views.append((i, np.asarray(b)))
    runtime.shutdown()
    FAULTS["shutdown with queued work"] += 1
    # everything queued ran (or was skipped behind an error) before shutdown returned
    assert sorted(log) == [i for i in range(16) if i % 5 not in (0, 1)]
    for i, h in hosts:
        assert (h == 3 * i).all()
    for i, v in views:  # numpy views keep their memory (the scale ran before any failure)
        assert (v == 3 * i).all()
    for b in bufs:
        assert b.freed
        with pytest.raises(runtime.InvalidHandleError):
            b.copy_to_host()
    for s in streams:
        with pytest.raises(runtime.InvalidHandleError):
            s.synchronize()
    with pytest.raises(runtime.NotInitializedError):
        runtime.device_malloc(0, 1)
    del views
    runtime.init(device_count=DEVICES, memory="256MiB")
    works(0)


def test_shutdown_runs_queued_python_kernels_and_the_work_behind_them():
    """Regression: shutdown took the runtime away before draining, so a queued Python kernel
    with a DeviceBuffer argument failed to convert it and the rest of its stream was skipped:
    the writes below were silently lost."""
    b = runtime.device_malloc(0, 8)
    arr = np.asarray(b)
    s = runtime.Stream(0)
    s.launch_host_func(time.sleep, 0.05)

    def seven(x):
        x[:] = 7

    s.launch_kernel(seven, (b,))
    runtime.memset(b, 9, count=1, stream=s)
    runtime.shutdown()
    FAULTS["shutdown with queued work"] += 1
    assert arr.tolist() == [9, 7, 7, 7, 7, 7, 7, 7]
    del arr
    runtime.init(device_count=DEVICES, memory="256MiB")


def test_init_racing_shutdown_returns_a_new_working_runtime():
    """Regression: while shutdown drained, init() returned the dying runtime, and every call
    after it failed. Now init waits for the shutdown (without the GIL: the drain runs a
    Python kernel) and builds a new runtime."""
    for _ in range(3):
        s = runtime.Stream(0)
        started = threading.Event()

        def slow(started: threading.Event = started) -> None:
            started.set()
            time.sleep(0.05)

        s.launch_host_func(slow)
        assert started.wait(WAIT)
        closer = threading.Thread(target=runtime.shutdown)
        closer.start()
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:  # until the shutdown refuses new work
            try:
                runtime.Stream(0)
            except (runtime.InvalidHandleError, runtime.NotInitializedError):
                break
        runtime.init(device_count=DEVICES, memory="256MiB")
        closer.join(WAIT)
        assert not closer.is_alive()
        assert runtime.is_initialized()
        b = runtime.to_device(np.arange(4, dtype=np.int32))
        assert b.copy_to_host().tolist() == [0, 1, 2, 3]
        FAULTS["init racing shutdown"] += 1


def test_shutdown_while_another_thread_launches_and_waits():
    results: collections.Counter[str] = collections.Counter()
    for trial in range(30):
        runtime.init(device_count=DEVICES, memory="256MiB")
        s = runtime.Stream(trial % DEVICES)
        slow = runtime.Stream((trial + 1) % DEVICES)
        x = runtime.to_device(np.zeros(1, np.int64), device=trial % DEVICES)
        one = runtime.to_device(np.ones(1, np.int64), device=trial % DEVICES)
        stop = threading.Event()

        def launcher(s=s, x=x, one=one, stop=stop):
            e = runtime.Event()
            while not stop.is_set():
                try:
                    s.launch_kernel(kernels.add, (x, x, one))
                    e.record(s)
                    e.synchronize(timeout=10)
                    results["ok"] += 1
                except runtime.WaitTimeoutError:
                    results["HANG"] += 1
                    return
                except (runtime.InvalidHandleError, runtime.NotInitializedError) as err:
                    results[type(err).__name__] += 1
                    return

        if trial % 2:
            slow.launch_host_func(time.sleep, 0.05)  # shutdown drains this device slowly
        t = threading.Thread(target=launcher)
        t.start()
        time.sleep(0.002 * (trial % 5))
        runtime.shutdown()
        stop.set()
        t.join(timeout=WAIT)
        assert not t.is_alive(), "the launcher hung after shutdown"
        FAULTS["shutdown racing a launcher"] += 1
        del x, one
    assert results["HANG"] == 0, results
    runtime.init(device_count=DEVICES, memory="256MiB")
    runtime._runtime._register_test_kernels()
    works(1)


# ------------------------------------------------------------------ destroy races


def test_destroy_while_other_threads_launch():
    """Launchers get success or InvalidHandleError, never a crash or hang; every launch that
    succeeded runs (counted on the device by a native add) and a global barrier waits for it."""
    for trial in range(24):
        dev = trial % DEVICES
        s = runtime.Stream(dev)
        x = runtime.to_device(np.zeros(1, np.int64), device=dev)
        one = runtime.to_device(np.ones(1, np.int64), device=dev)
        ok = [0, 0, 0]
        refused = []
        go = threading.Barrier(4, timeout=WAIT)

        def launcher(k, s=s, x=x, one=one, ok=ok, refused=refused, go=go):
            go.wait()
            while ok[k] < 20_000:  # bounded: the queue has no back-pressure
                try:
                    if k == 2:
                        runtime.memset(one, 1, count=0, stream=s)  # a copy path too
                    s.launch_kernel(kernels.add, (x, x, one))
                    ok[k] += 1
                except runtime.InvalidHandleError as e:
                    refused.append(str(e))
                    return
            refused.append("bound reached before the destroy")

        threads = [threading.Thread(target=launcher, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        go.wait()
        time.sleep(0.001 * (trial % 4))
        s.destroy()
        for t in threads:
            t.join(timeout=WAIT)
        assert not any(t.is_alive() for t in threads)
        assert len(refused) == 3, refused
        assert all("destroyed" in r or r.startswith("bound") for r in refused), refused
        FAULTS["stream destroyed under launchers"] += 1
        # Regression: the barrier covers launches accepted just before the destroy took
        # effect (it used to skip destroyed streams, and that work could still be queued).
        runtime.stream_synchronize(timeout=WAIT)
        assert x.copy_to_host()[0] == sum(ok), (x.copy_to_host()[0], ok)
        runtime.device_free(x)
        runtime.device_free(one)


def test_barriers_racing_with_stream_destroy():
    """Regression: stream_synchronize() / Device.synchronize() used to raise
    InvalidHandleError ("Stream#N ... destroyed") when another thread destroyed a stream
    between the barrier's liveness check and its wait."""
    stop = threading.Event()
    errors = []

    def churn():
        while not stop.is_set():
            s = runtime.Stream(0)
            s.launch_kernel(kernels.noop)
            s.destroy()

    threads = [threading.Thread(target=churn) for _ in range(2)]
    for t in threads:
        t.start()
    n = 0
    deadline = time.monotonic() + 1.5
    try:
        while time.monotonic() < deadline:
            try:
                if n % 2:
                    runtime.stream_synchronize(timeout=WAIT)
                else:
                    runtime.Device(0).synchronize(timeout=WAIT)
            except runtime.Error as e:
                errors.append(repr(e))
            n += 1
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=WAIT)
    FAULTS["barrier racing destroy"] += 1
    assert not errors, f"{len(errors)} of {n} barriers failed, e.g. {errors[:3]}"


def test_zz_report_fault_kinds():
    kinds = sorted(FAULTS)
    print(f"\nfaults: {len(kinds)} kinds, {sum(FAULTS.values())} injections:")
    for k in kinds:
        print(f"  {k:48s} {FAULTS[k]}")
    ran = {name: n for name, n in INJECTED.items() if not name.startswith("test_zz_")}
    if not ran:
        pytest.skip("no fault test ran in this session")
    # Every fault test injected its fault (a test whose fault never happened, such as an
    # interrupt that arrived after the wait, would otherwise pass having checked nothing),
    # except the control case of the allocation failures: nth past the workload's count.
    control = f"test_nth_allocation_fails[{N_ALLOCS + 1}-"
    missed = [name for name, n in ran.items() if n == 0 and not name.startswith(control)]
    assert not missed, f"tests that injected no fault: {missed}"
    assert sum(ran.values()) == sum(FAULTS.values())
    families = {name.split("[")[0] for name in ran}
    assert len(kinds) >= len(families), (kinds, families)
