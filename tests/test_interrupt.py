"""Ctrl-C (KeyboardInterrupt) while waiting: waits release the GIL and stay interruptible.

A timer thread calls ``_thread.interrupt_main()`` while the main thread waits; the wait must
raise KeyboardInterrupt promptly, and the runtime must be fully usable afterwards (the work that
was being waited for still runs to completion).
"""

from __future__ import annotations

import _thread
import math
import threading
import time

import numpy as np
import pytest

import runtime
from runtime import kernels

WAIT = 10.0
DELAY = 0.2  # seconds until the simulated Ctrl-C


@pytest.fixture(scope="module", autouse=True)
def _runtime():
    runtime.init(device_count=4, memory="1GiB")
    yield
    runtime.shutdown()


def interrupted(call):
    """Run ``call()`` while a timer interrupts the main thread after DELAY seconds.

    Returns True if ``call`` itself raised KeyboardInterrupt. (Written out rather than with
    ``pytest.raises`` so that a late interrupt, if ``call`` returned first, is absorbed here
    instead of aborting the test session.)
    """
    timer = threading.Timer(DELAY, _thread.interrupt_main)
    raised = False
    try:
        timer.start()
        try:
            call()
        except KeyboardInterrupt:
            raised = True
        finally:
            timer.join()
            time.sleep(0.05)  # a pending interrupt lands here at the latest
    except KeyboardInterrupt:
        pass
    return raised


def stepping_kernel(stop, started=None, steps=None):
    """A Python kernel that sleeps in 10 ms steps until `stop` is set (at most WAIT seconds)."""

    def kernel():
        if started is not None:
            started.set()
        deadline = time.monotonic() + WAIT
        while not stop.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
            if steps is not None:
                steps.append(1)

    return kernel


def assert_stream_usable(s):
    log = []
    x = runtime.empty(4, "float32", device=s.device)
    s.launch_kernel(log.append, ("after",))
    s.launch_kernel(kernels.fill, (x, 3.0))
    s.synchronize(timeout=WAIT)
    assert log == ["after"]
    got = np.empty(4, np.float32)
    runtime.memcpy_device_to_host(got, x, s)
    s.synchronize(timeout=WAIT)
    np.testing.assert_array_equal(got, np.full(4, 3.0, np.float32))


def test_interrupt_synchronize_python_kernel():
    s = runtime.Stream(0)
    stop = threading.Event()
    steps = []
    s.launch_kernel(stepping_kernel(stop, steps=steps))
    try:
        t0 = time.monotonic()
        assert interrupted(lambda: s.synchronize(timeout=WAIT))
        assert time.monotonic() - t0 < WAIT / 2
        assert not s.query()  # the kernel is still running: the interrupt hit the wait only
    finally:
        stop.set()
    s.synchronize(timeout=WAIT)  # no KernelError: the kernel was not interrupted
    assert steps
    assert_stream_usable(s)
    s.destroy()


def matmul_chain_length(a, b, c, seconds):
    """How many 512x512 matmuls make about `seconds` of work here (sizing, not a speed check)."""
    s = runtime.Stream(0)
    s.launch_kernel(kernels.matmul, (c, a, b))  # warm up
    s.synchronize(timeout=WAIT)
    t0 = time.perf_counter()
    for _ in range(3):
        s.launch_kernel(kernels.matmul, (c, a, b))
    s.synchronize(timeout=WAIT)
    one = max((time.perf_counter() - t0) / 3, 1e-4)
    s.destroy()
    return max(20, min(5000, math.ceil(seconds / one)))


def test_interrupt_synchronize_native_matmul_chain():
    rng = np.random.default_rng(0)
    a = runtime.to_device(rng.standard_normal((512, 512)).astype(np.float32))
    b = runtime.to_device(rng.standard_normal((512, 512)).astype(np.float32))
    c = runtime.empty((512, 512), "float32")
    n = matmul_chain_length(a, b, c, seconds=1.5)
    s = runtime.Stream(0)
    done = []
    for _ in range(n):
        s.launch_kernel(kernels.matmul, (c, a, b))
    s.launch_host_func(done.append, True)
    assert interrupted(lambda: s.synchronize(timeout=60))
    s.synchronize(timeout=60)  # the chain still completes
    assert done == [True]
    want = a.copy_to_host().astype(np.float64) @ b.copy_to_host().astype(np.float64)
    np.testing.assert_allclose(c.copy_to_host(), want, rtol=1e-3, atol=1e-3)
    assert_stream_usable(s)
    s.destroy()


def test_interrupt_synchronize_blocked_on_event():
    producer, consumer = runtime.Stream(0), runtime.Stream(1)
    stop = threading.Event()
    producer.launch_kernel(stepping_kernel(stop))
    consumer.wait_stream(producer)
    log = []
    consumer.launch_kernel(log.append, (1,))
    try:
        assert interrupted(lambda: consumer.synchronize(timeout=WAIT))
    finally:
        stop.set()
    consumer.synchronize(timeout=WAIT)
    assert log == [1]
    assert_stream_usable(consumer)
    producer.destroy()
    consumer.destroy()


def test_interrupt_event_synchronize():
    s = runtime.Stream(0)
    stop = threading.Event()
    s.launch_kernel(stepping_kernel(stop))
    e = s.record_event()
    try:
        assert interrupted(lambda: e.synchronize(timeout=WAIT))
        assert not e.query()
    finally:
        stop.set()
    e.synchronize(timeout=WAIT)
    assert e.query()
    s.destroy()


@pytest.mark.parametrize("barrier", ["stream_synchronize", "device_synchronize"])
def test_interrupt_barriers(barrier):
    s = runtime.Stream(2)
    stop = threading.Event()
    started = threading.Event()
    s.launch_kernel(stepping_kernel(stop, started))
    call = {
        "stream_synchronize": lambda: runtime.stream_synchronize(timeout=WAIT),
        "device_synchronize": lambda: runtime.Device(2).synchronize(timeout=WAIT),
    }[barrier]
    try:
        assert started.wait(WAIT)
        assert interrupted(call)
    finally:
        stop.set()
    runtime.stream_synchronize(timeout=WAIT)
    assert_stream_usable(s)
    s.destroy()


def test_interrupt_blocking_copy_then_copy_completes():
    """Ctrl-C during a blocking copy queued behind busy work: the copy still lands later."""
    s = runtime.Stream(0)
    stop = threading.Event()
    src = runtime.to_device(np.arange(1024, dtype=np.int64))
    host = np.zeros(1024, np.int64)
    s.launch_kernel(stepping_kernel(stop))
    try:
        with s:
            assert interrupted(lambda: runtime.memcpy_device_to_host(host, src))
        assert not host.any()  # not copied yet: still queued behind the kernel
    finally:
        stop.set()
    s.synchronize(timeout=WAIT)
    np.testing.assert_array_equal(host, np.arange(1024))
    s.destroy()


def test_interrupt_destroy_leaves_stream_alive():
    s = runtime.Stream(0)
    stop = threading.Event()
    s.launch_kernel(stepping_kernel(stop))
    try:
        assert interrupted(s.destroy)
        assert "destroyed" not in repr(s)
    finally:
        stop.set()
    assert_stream_usable(s)
    s.destroy()
    with pytest.raises(runtime.InvalidHandleError):
        s.query()


def test_interrupt_sync_mode_launch():
    """With enableAsync off a launch waits for its kernel; that wait is interruptible too."""
    s = runtime.Stream(0)
    stop = threading.Event()
    saved = runtime.get_option("enableAsync")
    runtime.set_option("enableAsync", False)
    try:
        assert interrupted(lambda: s.launch_kernel(stepping_kernel(stop)))
    finally:
        runtime.set_option("enableAsync", saved)
        stop.set()
    s.synchronize(timeout=WAIT)
    assert_stream_usable(s)
    s.destroy()


def test_interrupt_launch_waiting_for_backlog_room():
    """A launch that waits for room in a full backlog (behind a blocked kernel) is a wait like
    any other: Ctrl-C interrupts it, the launch itself stays queued and runs."""
    s = runtime.Stream(0)
    stop = threading.Event()
    ran = []
    s.launch_kernel(stepping_kernel(stop))
    try:
        for _ in range(runtime.MAX_QUEUED - 1):
            s.launch_kernel(kernels.noop)
        t0 = time.monotonic()
        assert interrupted(lambda: s.launch_kernel(ran.append, (1,)))  # pending > MAX_QUEUED
        assert time.monotonic() - t0 < WAIT / 2
        assert not ran
    finally:
        stop.set()
    s.synchronize(timeout=WAIT)
    assert ran == [1]
    assert_stream_usable(s)
    s.destroy()
