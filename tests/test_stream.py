"""Streams: creation, Python kernels and host functions, ordering, waiting, errors."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import runtime
from runtime import kernels

WAIT = 10.0  # seconds: generous upper bound on any wait that could otherwise hang


@pytest.fixture(scope="module", autouse=True)
def _runtime():
    runtime.init(device_count=4, memory="1GiB")
    yield
    runtime.shutdown()


@pytest.fixture
def stream():
    s = runtime.Stream(0)
    yield s
    if "destroyed" not in repr(s):
        s.synchronize(timeout=WAIT)
        s.destroy()


@pytest.fixture
def option():
    """Set runtime options for one test; the previous values are restored afterwards."""
    saved = {}

    def set_(name, value):
        saved.setdefault(name, runtime.get_option(name))
        runtime.set_option(name, value)

    yield set_
    for name, value in saved.items():
        runtime.set_option(name, value)


def to_host(buf, dtype=np.uint8):
    out = np.empty(buf.nbytes // np.dtype(dtype).itemsize, dtype)
    runtime.memcpy_device_to_host(out, buf)
    return out


def failing_kernel(msg):
    raise ValueError(msg)


def gated(gate, started=None):
    """A kernel that blocks (GIL released) until `gate` is set."""

    def kernel():
        if started is not None:
            started.set()
        assert gate.wait(WAIT), "gate never opened"

    return kernel


# --- creation ---------------------------------------------------------------------------------


def test_stream_on_current_device_by_default():
    s = runtime.Stream()
    assert s.device == runtime.Device(0)
    assert s.priority == 0
    assert not s.is_default
    s.destroy()


@pytest.mark.parametrize("dev", [2, runtime.Device])
def test_stream_device_int_or_device(dev):
    d = dev if isinstance(dev, int) else dev(3)
    s = runtime.Stream(d)
    assert s.device == runtime.Device(int(d))
    assert f"device={int(d)}" in repr(s)
    s.destroy()


def test_stream_device_keyword_and_current_device():
    s = runtime.Stream(device=runtime.Device(1))
    assert s.device.index == 1
    s.destroy()
    with runtime.Device(2):
        s = runtime.Stream()
        assert s.device.index == 2
        s.destroy()


def test_stream_ids_unique_and_equality():
    a, b = runtime.Stream(0), runtime.Stream(0)
    assert a.id != b.id
    assert a != b
    assert a == a
    assert len({a, b, a}) == 2
    a.destroy()
    b.destroy()


def test_stream_bad_device():
    with pytest.raises(runtime.InvalidDeviceError):
        runtime.Stream(4)
    with pytest.raises(ValueError):
        runtime.Stream(-1)
    with pytest.raises(TypeError, match="device"):
        runtime.Stream("0")
    with pytest.raises(TypeError, match="device"):
        runtime.Stream(True)


def test_priority_range_all_valid():
    lowest, highest = runtime.stream_priority_range()
    assert highest <= lowest  # lower numbers are more urgent
    assert lowest == 0  # the default priority is the lowest
    for p in range(highest, lowest + 1):
        s = runtime.Stream(0, priority=p)
        assert s.priority == p
        s.launch_kernel(lambda: None)
        s.synchronize(timeout=WAIT)
        s.destroy()


@pytest.mark.parametrize("p", ["out_below", "out_above", 2**40, -(2**40), 2**70])
def test_priority_out_of_range(p):
    lowest, highest = runtime.stream_priority_range()
    value = {"out_below": highest - 1, "out_above": lowest + 1}.get(p, p)
    with pytest.raises(ValueError, match="priority") as ei:
        runtime.Stream(0, priority=value)
    assert f"got {value}" in str(ei.value)  # the value passed, not a clamped one


@pytest.mark.parametrize("p", [0.0, "0", True, [0], 1.5])
def test_priority_wrong_type(p):
    with pytest.raises(TypeError, match="priority"):
        runtime.Stream(0, priority=p)


def test_priority_none_is_default():
    s = runtime.Stream(0, priority=None)
    assert s.priority == 0
    s.destroy()


# --- Python kernels ---------------------------------------------------------------------------


def test_python_kernels_run_in_order(stream):
    log = []
    for i in range(100):
        stream.launch_kernel(log.append, (i,))
    stream.synchronize(timeout=WAIT)
    assert log == list(range(100))


def test_launch_kernel_args_forms(stream):
    log = []
    stream.launch_kernel(lambda *a: log.append(a))
    stream.launch_kernel(lambda *a: log.append(a), None)
    stream.launch_kernel(lambda *a: log.append(a), [1, 2])
    stream.launch_kernel(lambda *a: log.append(a), (3,))
    stream.launch_kernel(lambda *a: log.append(a), args=(4, 5))
    stream.synchronize(timeout=WAIT)
    assert log == [(), (), (1, 2), (3,), (4, 5)]


def test_launch_kernel_bad_arguments(stream):
    with pytest.raises(TypeError, match="kernel"):
        stream.launch_kernel(42, ())
    with pytest.raises(TypeError, match="args"):
        stream.launch_kernel(lambda s: None, "abc")
    with pytest.raises(TypeError, match="args"):
        stream.launch_kernel(lambda s: None, 5)
    with pytest.raises(ValueError, match="nope"):
        stream.launch_kernel("nope", ())
    stream.synchronize(timeout=WAIT)


def test_device_buffer_arg_is_shared_numpy_view(stream):
    buf = runtime.device_malloc(0, 64)
    seen = {}

    def kernel(view):
        seen["type"] = type(view)
        seen["dtype"] = view.dtype
        seen["shape"] = view.shape
        seen["ptr"] = view.__array_interface__["data"][0]
        view[:] = np.arange(64, dtype=np.uint8)

    stream.launch_kernel(kernel, (buf,))
    stream.synchronize(timeout=WAIT)
    assert seen["type"] is np.ndarray
    assert seen["dtype"] == np.uint8
    assert seen["shape"] == (64,)
    assert seen["ptr"] == buf.ptr
    np.testing.assert_array_equal(to_host(buf), np.arange(64, dtype=np.uint8))
    runtime.device_free(buf)


def test_kernel_sees_data_copied_in_and_writes_are_visible(stream):
    x = runtime.to_device(np.arange(12, dtype=np.float64).reshape(3, 4))

    def double(v):
        v *= 2

    stream.launch_kernel(double, (x,))
    stream.synchronize(timeout=WAIT)
    np.testing.assert_array_equal(x.copy_to_host(), 2 * np.arange(12.0).reshape(3, 4))


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
def test_typed_buffer_arrives_as_typed_array(stream, dtype):
    buf = runtime.empty((3, 4), dtype)
    seen = {}

    def kernel(v):
        seen["dtype"], seen["shape"] = v.dtype, v.shape
        v[...] = np.arange(12).reshape(3, 4)

    stream.launch_kernel(kernel, (buf,))
    stream.synchronize(timeout=WAIT)
    assert seen["dtype"] == np.dtype(dtype)
    assert seen["shape"] == (3, 4)
    np.testing.assert_array_equal(buf.copy_to_host(), np.arange(12).reshape(3, 4).astype(dtype))


def test_typed_view_at_offset_writes_its_part_only(stream):
    raw = runtime.device_malloc(0, 64)
    view = raw.view("int32", shape=(2, 2), offset=16)
    seen = {}

    def kernel(v):
        seen["dtype"], seen["shape"] = v.dtype, v.shape
        v[...] = [[1, 2], [3, 4]]

    stream.launch_kernel(kernel, (view,))
    stream.synchronize(timeout=WAIT)
    assert seen == {"dtype": np.dtype("int32"), "shape": (2, 2)}
    words = to_host(raw, np.int32)
    np.testing.assert_array_equal(words[4:8], [1, 2, 3, 4])
    assert not words[:4].any() and not words[8:].any()


def test_other_args_pass_through_unchanged(stream):
    marker = object()
    host = np.arange(3)
    d = {"k": [1, 2]}
    buf = runtime.device_malloc(0, 8)
    got = []
    stream.launch_kernel(lambda *a: got.extend(a), (marker, host, d, None, "s", 1.5, 7, buf))
    stream.synchronize(timeout=WAIT)
    assert got[0] is marker
    assert got[1] is host
    assert got[2] is d
    assert got[3:7] == [None, "s", 1.5, 7]
    assert isinstance(got[7], np.ndarray)  # only device buffers become views


def test_buffer_kept_alive_until_kernel_ran(stream):
    gate = threading.Event()
    buf = runtime.device_malloc(0, 16)
    sums = []
    stream.launch_kernel(gated(gate))
    stream.launch_kernel(lambda v: (v.fill(3), sums.append(int(v.sum()))), (buf,))
    runtime.device_free(buf)  # the queued kernel holds its own reference
    gate.set()
    stream.synchronize(timeout=WAIT)
    assert sums == [48]
    with pytest.raises(runtime.InvalidHandleError):
        stream.launch_kernel(lambda v: None, (buf,))


def test_launch_host_func(stream):
    log = []
    buf = runtime.device_malloc(0, 8)
    stream.launch_kernel(log.append, ("kernel",))
    stream.launch_host_func(lambda *a: log.append(a), 1, "two", buf)
    stream.launch_host_func(log.append, "last")
    stream.synchronize(timeout=WAIT)
    assert log[0] == "kernel"
    assert log[1][:2] == (1, "two")
    assert log[1][2] is buf  # host functions get their arguments as given
    assert log[2] == "last"
    with pytest.raises(TypeError, match="func"):
        stream.launch_host_func(3)


def test_query(stream):
    assert stream.query() is True
    gate = threading.Event()
    stream.launch_kernel(gated(gate))
    assert stream.query() is False
    gate.set()
    stream.synchronize(timeout=WAIT)
    assert stream.query() is True


def test_synchronize_timeout_raises(stream):
    gate = threading.Event()
    for _ in range(3):  # the waiter must not run the kernel itself (and so overrun the timeout)
        stream.launch_kernel(gated(gate))
        t0 = time.monotonic()
        with pytest.raises(runtime.WaitTimeoutError) as ei:
            stream.synchronize(timeout=0.1)
        assert time.monotonic() - t0 < WAIT / 2
        assert isinstance(ei.value, TimeoutError)
        assert isinstance(ei.value, runtime.Error)
        assert isinstance(ei.value, RuntimeError)
        assert not stream.query()
    gate.set()
    stream.synchronize(timeout=WAIT)
    assert stream.query()


def test_synchronize_timeout_while_stream_not_yet_picked_up():
    """All compute workers busy: the waited-for stream is queued, not running.

    A waiter must not run that stream's work on its own thread: it would block past its timeout
    (and past Ctrl-C) for as long as the work takes.
    """
    n = runtime.get_device_compute_info(0).compute_engines
    gate = threading.Event()
    started = [threading.Event() for _ in range(n)]
    blockers = [runtime.Stream(0) for _ in range(n)]
    for s, st in zip(blockers, started):
        s.launch_kernel(gated(gate, st))
    try:
        for st in started:
            assert st.wait(WAIT)
        target = runtime.Stream(0)
        ran_on = []
        target.launch_kernel(lambda: (ran_on.append(threading.current_thread()), time.sleep(1.0)))
        t0 = time.monotonic()
        with pytest.raises(runtime.WaitTimeoutError):
            target.synchronize(timeout=0.1)
        assert time.monotonic() - t0 < 0.9
        assert ran_on == []
    finally:
        gate.set()
    target.synchronize(timeout=WAIT)
    assert ran_on and ran_on[0] is not threading.main_thread()
    for s in [*blockers, target]:
        s.synchronize(timeout=WAIT)
        s.destroy()


def test_synchronize_bad_timeout(stream):
    with pytest.raises(ValueError, match="timeout"):
        stream.synchronize(timeout=-1)
    with pytest.raises(ValueError, match="timeout"):
        stream.synchronize(timeout=float("nan"))
    with pytest.raises(TypeError):
        stream.synchronize(timeout="1")


def test_synchronize_idle_stream_with_zero_timeout(stream):
    # timeout=0 is a poll: an idle stream succeeds at once, a busy one raises at once.
    assert stream.synchronize(timeout=0) is None and stream.query()
    gate, log = threading.Event(), []
    stream.launch_host_func(lambda: (gate.wait(WAIT), log.append("ran")))
    with pytest.raises(runtime.WaitTimeoutError):
        stream.synchronize(timeout=0)
    assert log == [] and not stream.query()
    gate.set()
    stream.synchronize(timeout=WAIT)
    assert log == ["ran"] and stream.query()
    assert stream.synchronize(timeout=0) is None


# --- cross-stream ordering --------------------------------------------------------------------


def producer_consumer(wait):
    """A producer sleeps then writes; the consumer (made to wait by `wait`) copies it out."""
    producer, consumer = runtime.Stream(0), runtime.Stream(0)
    gate = threading.Event()
    src = runtime.empty(256, "float32")
    dst = runtime.empty(256, "float32")

    def produce(v):
        assert gate.wait(WAIT)
        time.sleep(0.05)
        v[:] = np.arange(256, dtype=np.float32)

    producer.launch_kernel(produce, (src,))
    wait(consumer, producer)
    runtime.memcpy_d2d(dst, src, consumer)
    seen = []
    consumer.launch_kernel(lambda v: seen.append(v.copy()), (dst,))
    assert not consumer.query()  # blocked behind the producer
    gate.set()
    consumer.synchronize(timeout=WAIT)
    np.testing.assert_array_equal(seen[0], np.arange(256, dtype=np.float32))
    np.testing.assert_array_equal(dst.copy_to_host(), np.arange(256, dtype=np.float32))
    producer.synchronize(timeout=WAIT)
    producer.destroy()
    consumer.destroy()


def test_wait_event_orders_consumer_after_producer():
    def wait(consumer, producer):
        ev = runtime.Event()
        ev.record(producer)
        consumer.wait_event(ev)

    producer_consumer(wait)


def test_wait_stream_orders_consumer_after_producer():
    producer_consumer(lambda consumer, producer: consumer.wait_stream(producer))


def test_wait_event_across_devices():
    def wait(consumer, producer):
        ev = producer.record_event()
        other = runtime.Stream(1)
        other.wait_event(ev)
        ev2 = other.record_event()
        consumer.wait_event(ev2)

    producer_consumer(wait)


def test_wait_event_bad_type(stream):
    with pytest.raises(TypeError, match="event"):
        stream.wait_event(stream)
    with pytest.raises(TypeError):
        stream.wait_stream(runtime.Event())


def test_record_event(stream):
    gate = threading.Event()
    stream.launch_kernel(gated(gate))
    ev = stream.record_event()
    assert isinstance(ev, runtime.Event)
    assert ev.enable_timing
    assert not ev.query()
    gate.set()
    ev.synchronize(timeout=WAIT)
    assert ev.query()
    assert not stream.record_event(enable_timing=False).enable_timing


# --- current stream ---------------------------------------------------------------------------


def test_with_stream_makes_it_current():
    s = runtime.Stream(0)
    assert runtime.current_stream() == runtime.default_stream()
    with s as entered:
        assert entered is s
        assert runtime.current_stream() == s
        assert runtime.current_stream(0) == s
        assert runtime.current_stream(1) == runtime.default_stream(1)
    assert runtime.current_stream() == runtime.default_stream()
    s.destroy()


def test_with_stream_nested_and_other_device():
    a, b, c = runtime.Stream(0), runtime.Stream(0), runtime.Stream(1)
    with a:
        with b:
            assert runtime.current_stream() == b
            with c:
                assert runtime.current_stream(1) == c
                assert runtime.current_stream(0) == b
            assert runtime.current_stream(1) == runtime.default_stream(1)
        assert runtime.current_stream() == a
    assert runtime.current_stream() == runtime.default_stream()
    for s in (a, b, c):
        s.destroy()


def test_with_stream_restores_on_exception():
    s = runtime.Stream(0)
    with pytest.raises(KeyError), s:
        raise KeyError("x")
    assert runtime.current_stream() == runtime.default_stream()
    s.destroy()


def test_current_stream_is_per_thread():
    s = runtime.Stream(0)
    other = []
    with s:
        t = threading.Thread(target=lambda: other.append(runtime.current_stream()))
        t.start()
        t.join(WAIT)
        assert runtime.current_stream() == s
    assert other == [runtime.default_stream()]
    s.destroy()


def test_copies_without_stream_order_on_current_stream():
    s = runtime.Stream(0)
    src = runtime.empty(64, "int64")
    dst = runtime.empty(64, "int64")

    def slow_write(v):
        time.sleep(0.1)
        v[:] = np.arange(64)

    with s:
        s.launch_kernel(slow_write, (src,))
        runtime.memcpy_d2d(dst, src)  # queued behind slow_write on s, then waited for
        host = np.zeros(64, np.int64)
        runtime.memcpy_device_to_host(host, dst)
    np.testing.assert_array_equal(host, np.arange(64))
    assert s.query()
    s.destroy()


def test_native_kernel_call_form_uses_current_stream():
    s = runtime.Stream(0)
    x = runtime.empty(16, "float32")
    gate = threading.Event()
    with s:
        s.launch_kernel(gated(gate))
        runtime.kernels.fill(x, 5.0)  # no stream=: queued on s, behind the gate
        assert not s.query()
        gate.set()
        np.testing.assert_array_equal(x.copy_to_host(), np.full(16, 5.0, np.float32))
    s.synchronize(timeout=WAIT)
    s.destroy()


# --- default streams --------------------------------------------------------------------------


def test_default_stream_per_device():
    defaults = [runtime.default_stream(i) for i in range(runtime.get_device_count())]
    assert all(d.is_default for d in defaults)
    assert [d.device.index for d in defaults] == list(range(runtime.get_device_count()))
    assert len({d.id for d in defaults}) == len(defaults)
    assert runtime.default_stream(2) == runtime.default_stream(runtime.Device(2))
    assert runtime.default_stream() == defaults[0]
    with runtime.Device(3):
        assert runtime.default_stream() == defaults[3]
        assert runtime.current_stream() == defaults[3]


def test_default_stream_runs_work_and_cannot_be_destroyed():
    d = runtime.default_stream(1)
    log = []
    d.launch_kernel(log.append, (1,))
    d.synchronize(timeout=WAIT)
    assert log == [1]
    with pytest.raises(runtime.InvalidOperationError):
        d.destroy()
    d.launch_kernel(log.append, (2,))
    d.synchronize(timeout=WAIT)
    assert log == [1, 2]


# --- destroy ----------------------------------------------------------------------------------


def test_destroy_lets_queued_work_finish_then_invalidates():
    s = runtime.Stream(0)
    log = []

    def slow(i):
        time.sleep(0.02)
        log.append(i)

    for i in range(5):
        s.launch_kernel(slow, (i,))
    s.destroy()
    assert log == [0, 1, 2, 3, 4]
    assert "destroyed" in repr(s)
    ev = runtime.Event()
    buf = runtime.device_malloc(0, 8)
    for call in (
        lambda: s.launch_kernel(log.append, (9,)),
        lambda: s.launch_kernel(runtime.kernels.noop),
        lambda: s.launch_host_func(log.append, 9),
        s.synchronize,
        s.query,
        s.destroy,
        s.record_event,
        s.begin_capture,
        lambda: s.wait_event(ev),
        lambda: ev.record(s),
        lambda: runtime.memcpy_d2d(buf, buf, s),
        s.__enter__,
    ):
        with pytest.raises(runtime.InvalidHandleError):
            call()
    assert log == [0, 1, 2, 3, 4]


def test_destroyed_current_stream_falls_back_to_default():
    s = runtime.Stream(0)
    with s:
        s.destroy()
        assert runtime.current_stream() == runtime.default_stream()
        buf = runtime.to_device(np.arange(4, dtype=np.int32))
        np.testing.assert_array_equal(buf.copy_to_host(), np.arange(4))


def test_destroy_reports_pending_error():
    s = runtime.Stream(0)
    s.launch_kernel(failing_kernel, ("on destroy",))
    with pytest.raises(runtime.KernelError, match="on destroy"):
        s.destroy()
    with pytest.raises(runtime.InvalidHandleError):
        s.query()


# --- barriers ---------------------------------------------------------------------------------


def slow_flag(flags, i, delay=0.05):
    def kernel():
        time.sleep(delay)
        flags[i] = True

    return kernel


def test_stream_synchronize_barrier_all_streams_all_devices():
    streams = [runtime.Stream(i % 4) for i in range(8)]
    flags = [False] * 8
    for i, s in enumerate(streams):
        s.launch_kernel(slow_flag(flags, i))
    runtime.stream_synchronize(timeout=WAIT)
    assert all(flags)
    assert all(s.query() for s in streams)
    for s in streams:
        s.destroy()


def test_stream_synchronize_includes_default_streams():
    flags = [False] * 2
    runtime.default_stream(0).launch_kernel(slow_flag(flags, 0))
    runtime.default_stream(3).launch_kernel(slow_flag(flags, 1))
    runtime.stream_synchronize(timeout=WAIT)
    assert flags == [True, True]


def test_stream_synchronize_reports_kernel_error():
    s = runtime.Stream(2)
    s.launch_kernel(failing_kernel, ("barrier-err",))
    with pytest.raises(runtime.KernelError, match="barrier-err"):
        runtime.stream_synchronize(timeout=WAIT)
    s.synchronize(timeout=WAIT)  # reported once
    s.destroy()


def test_stream_synchronize_timeout():
    s = runtime.Stream(0)
    gate = threading.Event()
    started = threading.Event()
    s.launch_kernel(gated(gate, started))
    assert started.wait(WAIT)
    try:
        with pytest.raises(runtime.WaitTimeoutError):
            runtime.stream_synchronize(timeout=0.1)
    finally:
        gate.set()
    runtime.stream_synchronize(timeout=WAIT)
    s.destroy()


@pytest.mark.parametrize("barrier", ["stream_synchronize", "device_synchronize"])
def test_barrier_timeout_while_stream_not_yet_picked_up(barrier):
    sync = {
        "stream_synchronize": runtime.stream_synchronize,
        "device_synchronize": runtime.Device(0).synchronize,
    }[barrier]
    n = runtime.get_device_compute_info(0).compute_engines
    # Whether the barrier reaches the queued stream before a running one depends on the order
    # it visits streams in; repeat until it has had the chance.
    for _ in range(40):
        gate = threading.Event()
        started = [threading.Event() for _ in range(n)]
        blockers = [runtime.Stream(0) for _ in range(n)]
        for s, st in zip(blockers, started):
            s.launch_kernel(gated(gate, st))
        try:
            for st in started:
                assert st.wait(WAIT)
            target = runtime.Stream(0)
            target.launch_kernel(time.sleep, (0.3,))  # queued: every worker is busy
            t0 = time.monotonic()
            with pytest.raises(runtime.WaitTimeoutError):
                sync(timeout=0.02)
            assert time.monotonic() - t0 < 0.25, "the barrier overran its timeout"
        finally:
            gate.set()
            runtime.stream_synchronize(timeout=WAIT)
        for s in [*blockers, target]:
            s.destroy()


def test_device_synchronize_waits_for_that_device():
    s1 = [runtime.Stream(1), runtime.Stream(1)]
    gate = threading.Event()
    flags = [False] * 2
    for i, s in enumerate(s1):
        s.launch_kernel(slow_flag(flags, i))
    other = runtime.Stream(2)
    started = threading.Event()
    other.launch_kernel(gated(gate, started))
    assert started.wait(WAIT)  # running, so the barrier below cannot run it itself
    runtime.Device(1).synchronize(timeout=WAIT)  # must not wait for device 2
    assert flags == [True, True]
    assert not other.query()
    with pytest.raises(runtime.WaitTimeoutError):
        runtime.Device(2).synchronize(timeout=0.05)
    gate.set()
    runtime.synchronize(2, timeout=WAIT)
    assert other.query()
    for s in [*s1, other]:
        s.destroy()


# --- the seed's examples ----------------------------------------------------------------------

SEED_EXAMPLE_3 = """
import runtime
import numpy as np
import time

# 初始化
runtime.init()
device = runtime.Device(0)

# 创建流
stream = runtime.Stream(device)

# 创建事件
start_event = runtime.Event()
end_event = runtime.Event()

# 准备数据
data = runtime.device_malloc(device, 1024 * 1024 * 4)
result = runtime.device_malloc(device, 1024 * 1024 * 4)

# 记录开始
start_event.record(stream)

# 执行算子（用一个简单的拷贝作为例子）
runtime.memcpy_d2d(result, data, stream)

# 记录结束
end_event.record(stream)

# 等待完成
stream.synchronize()

# 计算时间
elapsed_ms = start_event.elapsed_time(end_event)
print(f"Elapsed: {elapsed_ms:.3f} ms")

# 清理
start_event.destroy()
end_event.destroy()
stream.destroy()
runtime.shutdown()
"""

SEED_EXAMPLE_4 = """
import runtime
import numpy as np

# 初始化
runtime.init()
device = runtime.Device(0)

# 创建流
stream1 = runtime.Stream(device)
stream2 = runtime.Stream(device)
stream3 = runtime.Stream(device)

# (filled in: the seed leaves data1..3 / result1..3 undefined)
host = [np.full(1 << 16, i + 1, np.uint8) for i in range(3)]
data1, data2, data3 = (runtime.device_malloc(device, 1 << 16) for _ in range(3))
result1, result2, result3 = (runtime.device_malloc(device, 1 << 16) for _ in range(3))
for d, h in zip((data1, data2, data3), host):
    runtime.memcpy_host_to_device(d, h)

# 准备多个任务
tasks = [
    (stream1, data1, result1),
    (stream2, data2, result2),
    (stream3, data3, result3),
]

# 并行提交
for stream, data, result in tasks:
    runtime.memcpy_d2d(result, data, stream)

# 同步所有流
stream1.synchronize()
stream2.synchronize()
stream3.synchronize()

# 或者用一个屏障
runtime.stream_synchronize()

# (filled in: check the results)
for r, h in zip((result1, result2, result3), host):
    out = np.empty_like(h)
    runtime.memcpy_device_to_host(out, r)
    assert (out == h).all()
print("example 4 ok")

# 清理
for stream in [stream1, stream2, stream3]:
    stream.destroy()

runtime.shutdown()
"""


def run_script(code):
    # Run from this directory so that the installed package is imported, as a user would.
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=Path(__file__).parent,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_seed_example_3_as_written():
    r = run_script(SEED_EXAMPLE_3)
    assert r.returncode == 0, r.stderr
    line = r.stdout.strip().splitlines()[-1]
    assert line.startswith("Elapsed: ") and line.endswith(" ms")
    assert float(line.split()[1]) >= 0.0


def test_seed_example_4_as_written():
    r = run_script(SEED_EXAMPLE_4)
    assert r.returncode == 0, r.stderr
    assert "example 4 ok" in r.stdout


def test_seed_example_4_in_process():
    device = runtime.Device(0)
    stream1, stream2, stream3 = (runtime.Stream(device) for _ in range(3))
    n = 1024 * 1024
    hosts = [np.random.default_rng(i).integers(0, 255, n, dtype=np.uint8) for i in range(3)]
    datas = [runtime.device_malloc(device, n) for _ in range(3)]
    results = [runtime.device_malloc(device, n) for _ in range(3)]
    for d, h in zip(datas, hosts):
        runtime.memcpy_host_to_device(d, h)
    tasks = list(zip((stream1, stream2, stream3), datas, results))
    for stream, data, result in tasks:
        runtime.memcpy_d2d(result, data, stream)
    stream1.synchronize()
    stream2.synchronize()
    stream3.synchronize()
    runtime.stream_synchronize()
    for r, h in zip(results, hosts):
        np.testing.assert_array_equal(to_host(r), h)
    for stream in [stream1, stream2, stream3]:
        stream.destroy()


# --- options ----------------------------------------------------------------------------------


def test_sync_mode_launch_returns_after_kernel_ran(option):
    option("enableAsync", False)
    s = runtime.Stream(0)
    log = []

    def slow():
        time.sleep(0.05)
        log.append("ran")

    s.launch_kernel(slow)
    assert log == ["ran"]
    assert s.query()
    x = runtime.empty(8, "float64")
    s.launch_kernel(runtime.kernels.fill, (x, 3.0))
    assert s.query()
    host = np.zeros(8)
    runtime.memcpy_device_to_host(host, x, s)  # stream-ordered copy: done on return too
    np.testing.assert_array_equal(host, np.full(8, 3.0))
    s.launch_host_func(log.append, "host")
    assert log == ["ran", "host"]
    s.destroy()


def test_sync_mode_kernel_error_raises_at_launch(option):
    option("enableAsync", False)
    s = runtime.Stream(0)
    with pytest.raises(runtime.KernelError, match="at-launch") as ei:
        s.launch_kernel(failing_kernel, ("at-launch",))
    assert ei.value.kernel == "failing_kernel"
    assert isinstance(ei.value.__cause__, ValueError)
    s.synchronize(timeout=WAIT)  # already reported
    log = []
    s.launch_kernel(log.append, (1,))
    assert log == [1]
    s.destroy()


def test_async_mode_launch_returns_before_kernel_ran(option):
    option("enableAsync", True)
    s = runtime.Stream(0)
    gate = threading.Event()
    log = []
    s.launch_kernel(gated(gate))
    s.launch_kernel(log.append, (1,))  # returns at once although the stream is blocked
    assert log == []
    gate.set()
    s.synchronize(timeout=WAIT)
    assert log == [1]
    s.destroy()


@pytest.mark.parametrize("pipelining", [True, False])
def test_pipelining_on_and_off_give_ordered_results(option, pipelining):
    option("enablePipelining", pipelining)
    streams = [runtime.Stream(0) for _ in range(3)]
    rng = np.random.default_rng(5)
    results = []
    for i, s in enumerate(streams):
        host_in = rng.standard_normal(4096).astype(np.float32)
        x = runtime.empty(4096, "float32")
        y = runtime.empty(4096, "float32")
        host_out = np.zeros(4096, np.float32)
        log = []
        runtime.memcpy_host_to_device(x, host_in, s)
        s.launch_kernel(runtime.kernels.scale, (y, x, 2.0))
        s.launch_kernel(lambda v, log=log: log.append(v.copy()), (y,))
        s.launch_kernel(runtime.kernels.axpy, (y, x, float(i)))
        runtime.memcpy_device_to_host(host_out, y, s)
        s.launch_kernel(log.append, ("end",))
        results.append((host_in, host_out, log, i))
    for s in streams:
        s.synchronize(timeout=WAIT)
    for host_in, host_out, log, i in results:
        np.testing.assert_allclose(log[0], 2 * host_in, rtol=1e-6)
        assert log[1] == "end"
        np.testing.assert_allclose(host_out, (2 + i) * host_in, rtol=1e-5, atol=1e-6)
    for s in streams:
        s.destroy()


# --- threads ----------------------------------------------------------------------------------


def test_threads_launching_on_own_and_shared_streams():
    n_threads, n_kernels = 8, 200
    shared = runtime.Stream(0)
    shared_log = []
    own_logs = [[] for _ in range(n_threads)]
    start = threading.Barrier(n_threads, timeout=WAIT)

    def worker(t):
        own = runtime.Stream(t % 4)
        start.wait(WAIT)
        for i in range(n_kernels):
            own.launch_kernel(own_logs[t].append, (i,))
            shared.launch_kernel(shared_log.append, ((t, i),))
        own.synchronize(timeout=WAIT)
        assert own.query()
        own.destroy()

    with ThreadPoolExecutor(n_threads) as ex:
        for f in [ex.submit(worker, t) for t in range(n_threads)]:
            f.result(timeout=60)
    shared.synchronize(timeout=WAIT)
    for log in own_logs:
        assert log == list(range(n_kernels))
    assert len(shared_log) == n_threads * n_kernels
    for t in range(n_threads):
        assert [i for (u, i) in shared_log if u == t] == list(range(n_kernels))
    shared.destroy()


# --- kernel errors ----------------------------------------------------------------------------


def test_kernel_error_surfaces_at_next_synchronize(stream):
    log = []
    stream.launch_kernel(log.append, ("before",))
    stream.launch_kernel(failing_kernel, ("original boom 42",))
    stream.launch_kernel(log.append, ("skipped",))
    x = runtime.empty(4, "float32")
    stream.launch_kernel(runtime.kernels.fill, (x, 1.0))  # native kernels are skipped too
    stream.launch_host_func(log.append, "skipped host func")
    ev = stream.record_event()
    ev.synchronize(timeout=WAIT)  # an event behind the error still completes
    assert ev.query()
    with pytest.raises(runtime.KernelError) as ei:
        stream.synchronize(timeout=WAIT)
    err = ei.value
    assert isinstance(err, runtime.Error) and isinstance(err, RuntimeError)
    assert err.kernel == "failing_kernel"
    assert err.stream == stream.id
    assert "failing_kernel" in str(err)
    assert "original boom 42" in str(err)
    assert "ValueError" in str(err)
    assert isinstance(err.__cause__, ValueError)
    assert err.__cause__.args == ("original boom 42",)
    assert err.__cause__.__traceback__ is not None
    frames = []
    tb = err.__cause__.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    assert "failing_kernel" in frames
    assert log == ["before"]
    np.testing.assert_array_equal(x.copy_to_host(), np.zeros(4, np.float32))

    # reported once; the stream then works normally
    stream.synchronize(timeout=WAIT)
    stream.launch_kernel(log.append, ("after",))
    stream.launch_kernel(runtime.kernels.fill, (x, 2.0))
    stream.synchronize(timeout=WAIT)
    assert log == ["before", "after"]
    np.testing.assert_array_equal(x.copy_to_host(), np.full(4, 2.0, np.float32))


def test_only_first_kernel_error_is_reported(stream):
    stream.launch_kernel(failing_kernel, ("first",))
    stream.launch_kernel(failing_kernel, ("second",))
    with pytest.raises(runtime.KernelError, match="first") as ei:
        stream.synchronize(timeout=WAIT)
    assert "second" not in str(ei.value)
    stream.synchronize(timeout=WAIT)


def test_kernel_error_stays_on_its_stream(stream):
    other = runtime.Stream(0)
    log = []
    stream.launch_kernel(failing_kernel, ("mine",))
    other.launch_kernel(log.append, (1,))
    other.synchronize(timeout=WAIT)
    assert log == [1]
    with pytest.raises(runtime.KernelError):
        stream.synchronize(timeout=WAIT)
    other.destroy()


def test_kernel_error_from_non_exception_types(stream):
    def bad_args(a, b):
        return a + b

    stream.launch_kernel(bad_args, (1,))  # wrong arity: TypeError inside the executor
    with pytest.raises(runtime.KernelError) as ei:
        stream.synchronize(timeout=WAIT)
    assert isinstance(ei.value.__cause__, TypeError)
    assert ei.value.kernel.endswith("bad_args")


def test_host_func_error_surfaces_as_kernel_error(stream):
    def host_fails():
        raise KeyError("host")

    stream.launch_host_func(host_fails)
    with pytest.raises(runtime.KernelError) as ei:
        stream.synchronize(timeout=WAIT)
    assert isinstance(ei.value.__cause__, KeyError)
    assert ei.value.kernel.endswith("host_fails")


# --- back-pressure ----------------------------------------------------------------------------


def test_launch_waits_while_the_backlog_is_full(stream):
    """Behind a blocked kernel, launches stop at MAX_QUEUED pending commands (the launch that
    finds the backlog full waits, GIL released) and resume when it drains."""
    gate = threading.Event()
    stream.launch_kernel(gated(gate))
    total = 2 * runtime.MAX_QUEUED + 10
    launched = []

    def launcher():
        for i in range(total):
            stream.launch_kernel(runtime.kernels.noop)
            launched.append(i)

    t = threading.Thread(target=launcher)
    t.start()
    deadline = time.monotonic() + WAIT
    while len(launched) < runtime.MAX_QUEUED - 1 and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(0.05)
    # 1 blocked kernel + 1,024 launches pending; the 1,024th launch waits for room
    assert len(launched) == runtime.MAX_QUEUED - 1
    assert not stream.query()
    gate.set()
    t.join(WAIT)
    assert not t.is_alive()
    stream.synchronize(timeout=WAIT)
    assert launched == list(range(total))


def test_tight_loop_of_python_kernels_runs_all_in_order(stream):
    """A launch loop that holds the GIL cannot starve queued Python kernels: with the backlog
    full it waits with the GIL released, so they run."""
    out = []
    n = 3 * runtime.MAX_QUEUED
    for i in range(n):
        stream.launch_kernel(out.append, (i,))
    stream.synchronize(timeout=WAIT)
    assert out == list(range(n))


# --- issue 11, items 6, 8, 9 --------------------------------------------------------------


def test_query_is_true_once_the_last_recorded_event_has_completed(stream):
    for i in range(300):
        stream.launch_kernel(kernels.noop, ())
        e = runtime.Event(blocking=bool(i % 2))
        e.record(stream)
        e.synchronize(timeout=WAIT)
        assert stream.query(), f"round {i}: event complete, stream still busy"


def test_the_barrier_reports_every_failed_stream_once():
    streams = [runtime.Stream(i) for i in range(3)]
    for i, s in enumerate(streams[:2]):
        s.launch_kernel(failing_kernel, (f"barrier-fail-{i}",))
    with pytest.raises(runtime.KernelError) as info:
        runtime.stream_synchronize(timeout=WAIT)
    errors = info.value.errors
    assert len(errors) == 2
    assert sorted(str(e).split(": ")[-1] for e in errors) == ["barrier-fail-0", "barrier-fail-1"]
    assert all(isinstance(e, runtime.KernelError) for e in errors)
    runtime.stream_synchronize(timeout=WAIT)  # reported once
    for s in streams:
        s.synchronize(timeout=WAIT)
        s.destroy()


@pytest.mark.parametrize("pipelining", [True, False])
def test_blocking_calls_from_a_host_function_raise_promptly_never_hang(option, pipelining):
    option("enablePipelining", pipelining)
    s = runtime.Stream(0)
    buf = runtime.to_device(np.arange(4, dtype=np.int32))
    attempts = {
        "own synchronize": lambda: s.synchronize(),
        "own destroy": lambda: s.destroy(),
        "barrier": lambda: runtime.stream_synchronize(),
        "device synchronize": lambda: runtime.Device(0).synchronize(),
        "shutdown": lambda: runtime.shutdown(),
    }
    outcomes = {}

    def host():
        for name, call in attempts.items():
            try:
                call()
                outcomes[name] = "returned"
            except runtime.Error as e:
                outcomes[name] = type(e).__name__

    s.launch_host_func(host)
    s.synchronize(timeout=WAIT)
    assert outcomes == dict.fromkeys(attempts, "InvalidOperationError")
    assert runtime.is_initialized()
    # A blocking copy on an idle stream (the current one here is the default stream) works.
    got = {}
    s.launch_host_func(lambda: got.setdefault("copy", buf.copy_to_host()))
    s.synchronize(timeout=WAIT)
    np.testing.assert_array_equal(got["copy"], np.arange(4))
    s.destroy()


def test_a_synchronous_launch_on_its_own_stream_from_a_kernel_raises(option):
    s = runtime.Stream(0)

    def kernel():
        option("enableAsync", False)
        try:
            s.launch_kernel(kernels.noop, ())
        finally:
            runtime.set_option("enableAsync", True)

    s.launch_kernel(kernel)
    with pytest.raises(runtime.KernelError) as info:
        s.synchronize(timeout=WAIT)
    assert isinstance(info.value.__cause__, runtime.InvalidOperationError)
    s.destroy()
