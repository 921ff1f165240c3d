"""Events: recording, waiting, querying, timing, destruction."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import runtime

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
    s.synchronize(timeout=WAIT)
    s.destroy()


def gated(gate):
    def kernel():
        assert gate.wait(WAIT), "gate never opened"

    return kernel


def sleeper(seconds):
    def kernel():
        time.sleep(seconds)

    return kernel


# --- construction -----------------------------------------------------------------------------


def test_event_defaults():
    e = runtime.Event()
    assert e.enable_timing is True
    assert e.blocking is False
    assert "enable_timing=True" in repr(e)


@pytest.mark.parametrize("timing", [True, False])
@pytest.mark.parametrize("blocking", [True, False])
def test_event_flags(timing, blocking):
    e = runtime.Event(enable_timing=timing, blocking=blocking)
    assert e.enable_timing is timing
    assert e.blocking is blocking
    e2 = runtime.Event(timing, blocking)
    assert (e2.enable_timing, e2.blocking) == (timing, blocking)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"enable_timing": 1},
        {"enable_timing": "yes"},
        {"enable_timing": 0.0},
        {"blocking": 0},
        {"blocking": "no"},
        {"blocking": []},
    ],
)
def test_event_bad_arg_types(kwargs):
    (name,) = kwargs
    with pytest.raises(TypeError, match=name):
        runtime.Event(**kwargs)


def test_event_ids_unique_and_equality():
    a, b = runtime.Event(), runtime.Event()
    assert a.id != b.id
    assert a != b and a == a
    assert len({a, b, a}) == 2


# --- record / query / synchronize -------------------------------------------------------------


def test_query_before_record_is_true():
    e = runtime.Event()
    assert e.query() is True
    e.synchronize(timeout=WAIT)  # never recorded: returns at once
    assert e.query() is True


def test_record_synchronize_query(stream):
    gate = threading.Event()
    e = runtime.Event()
    stream.launch_kernel(gated(gate))
    e.record(stream)
    assert e.query() is False
    with pytest.raises(runtime.WaitTimeoutError) as ei:
        e.synchronize(timeout=0.05)
    assert isinstance(ei.value, TimeoutError)
    assert e.query() is False
    gate.set()
    e.synchronize(timeout=WAIT)
    assert e.query() is True


def test_record_on_idle_stream_completes_at_once(stream):
    e = runtime.Event()
    e.record(stream)
    assert e.query() is True
    assert e.timestamp_ns > 0


def test_record_without_stream_uses_current_stream():
    s = runtime.Stream(0)
    gate = threading.Event()
    e = runtime.Event()
    s.launch_kernel(gated(gate))
    with s:
        e.record()  # on s, behind the gate
    assert not e.query()
    gate.set()
    e.synchronize(timeout=WAIT)
    assert e.query()
    e2 = runtime.Event()
    e2.record()  # the default stream (idle)
    assert e2.query()
    s.destroy()


def test_record_bad_stream_type():
    e = runtime.Event()
    with pytest.raises(TypeError, match="stream"):
        e.record(0)
    with pytest.raises(TypeError, match="stream"):
        e.record(e)


def test_rerecord_refers_to_latest_record(stream):
    gate = threading.Event()
    e = runtime.Event()
    e.record(stream)
    assert e.query()
    first = e.timestamp_ns
    stream.launch_kernel(gated(gate))
    e.record(stream)
    assert not e.query()
    with pytest.raises(runtime.NotReadyError):
        _ = e.timestamp_ns
    gate.set()
    e.synchronize(timeout=WAIT)
    assert e.query()
    assert e.timestamp_ns >= first


def test_blocking_event_synchronize(stream):
    e = runtime.Event(blocking=True)
    log = []
    stream.launch_kernel(sleeper(0.05))
    stream.launch_kernel(log.append, (1,))
    e.record(stream)
    e.synchronize(timeout=WAIT)
    assert e.query()
    assert log == [1]  # everything before the record has run


def test_event_synchronize_bad_timeout():
    e = runtime.Event()
    with pytest.raises(ValueError, match="timeout"):
        e.synchronize(timeout=-1)


def test_event_recorded_on_several_streams(stream):
    other = runtime.Stream(1)
    gate = threading.Event()
    e = runtime.Event()
    e.record(stream)
    other.launch_kernel(gated(gate))
    e.record(other)  # the latest record is the one that counts
    assert not e.query()
    gate.set()
    e.synchronize(timeout=WAIT)
    assert e.query()
    other.synchronize(timeout=WAIT)
    other.destroy()


# --- timing -----------------------------------------------------------------------------------


def test_elapsed_time_covers_a_sleeping_kernel(stream):
    start, end = runtime.Event(), runtime.Event()
    sleep_s = 0.1
    start.record(stream)
    stream.launch_kernel(sleeper(sleep_s))
    end.record(stream)
    stream.synchronize(timeout=WAIT)
    ms = start.elapsed_time(end)
    assert isinstance(ms, float)
    # timestamps are taken when the stream reaches each event, so they bracket the kernel
    assert ms >= sleep_s * 1000 * 0.9
    assert end.elapsed_time(start) == pytest.approx(-ms)
    assert start.elapsed_time(start) == 0.0
    assert (end.timestamp_ns - start.timestamp_ns) / 1e6 == pytest.approx(ms)


def test_elapsed_time_not_before_record_call(stream):
    """The start timestamp is taken when the stream reaches the event, not at record()."""
    gate = threading.Event()
    start, end = runtime.Event(), runtime.Event()
    stream.launch_kernel(gated(gate))
    start.record(stream)
    stream.launch_kernel(sleeper(0.02))
    end.record(stream)
    time.sleep(0.5)  # the stream is held at the gate: start has not been reached yet
    gate.set()
    stream.synchronize(timeout=WAIT)
    ms = start.elapsed_time(end)
    assert ms >= 20 * 0.9
    assert ms < 450  # the 0.5 s spent before `start` was reached is not counted


def test_elapsed_time_is_nonnegative_for_back_to_back_records(stream):
    start, end = runtime.Event(), runtime.Event()
    start.record(stream)
    stream.launch_kernel(runtime.kernels.noop)
    end.record(stream)
    stream.synchronize(timeout=WAIT)
    assert start.elapsed_time(end) >= 0.0


def test_elapsed_time_never_recorded_raises(stream):
    start, end = runtime.Event(), runtime.Event()
    start.record(stream)
    stream.synchronize(timeout=WAIT)
    with pytest.raises(runtime.Error, match="never recorded"):
        start.elapsed_time(end)
    with pytest.raises(runtime.Error, match="never recorded"):
        end.elapsed_time(start)
    with pytest.raises(runtime.Error):
        _ = end.timestamp_ns


def test_elapsed_time_timing_disabled_raises(stream):
    timed, untimed = runtime.Event(), runtime.Event(enable_timing=False)
    timed.record(stream)
    untimed.record(stream)
    stream.synchronize(timeout=WAIT)
    assert untimed.query()
    with pytest.raises(runtime.Error, match="enable_timing"):
        timed.elapsed_time(untimed)
    with pytest.raises(runtime.Error, match="enable_timing"):
        untimed.elapsed_time(timed)
    with pytest.raises(runtime.Error):
        _ = untimed.timestamp_ns


def test_elapsed_time_pending_raises_not_ready(stream):
    gate = threading.Event()
    start, end = runtime.Event(), runtime.Event()
    start.record(stream)
    stream.launch_kernel(gated(gate))
    end.record(stream)
    with pytest.raises(runtime.NotReadyError):
        start.elapsed_time(end)
    with pytest.raises(runtime.NotReadyError):
        end.elapsed_time(start)
    assert issubclass(runtime.NotReadyError, runtime.Error)
    gate.set()
    end.synchronize(timeout=WAIT)
    assert start.elapsed_time(end) >= 0.0


def test_elapsed_time_bad_arg():
    e = runtime.Event()
    with pytest.raises(TypeError, match="event"):
        e.elapsed_time(1.0)


def test_cross_device_timing():
    s0, s1 = runtime.Stream(0), runtime.Stream(1)
    start, end = runtime.Event(), runtime.Event()
    s0.launch_kernel(sleeper(0.02))
    start.record(s0)
    s1.wait_event(start)
    s1.launch_kernel(sleeper(0.05))
    end.record(s1)
    end.synchronize(timeout=WAIT)
    start.synchronize(timeout=WAIT)
    ms = start.elapsed_time(end)
    assert ms >= 50 * 0.9
    assert end.elapsed_time(start) == pytest.approx(-ms)
    s0.destroy()
    s1.destroy()


def test_timestamps_follow_stream_order(stream):
    events = [runtime.Event() for _ in range(5)]
    for e in events:
        stream.launch_kernel(runtime.kernels.noop)
        e.record(stream)
    stream.synchronize(timeout=WAIT)
    stamps = [e.timestamp_ns for e in events]
    assert stamps == sorted(stamps)


# --- waiting across streams -------------------------------------------------------------------


def test_wait_event_on_never_recorded_event_is_noop(stream):
    e = runtime.Event()
    log = []
    stream.wait_event(e)
    stream.launch_kernel(log.append, (1,))
    stream.synchronize(timeout=WAIT)
    assert log == [1]
    e.wait(stream)  # the Event-side spelling
    stream.launch_kernel(log.append, (2,))
    stream.synchronize(timeout=WAIT)
    assert log == [1, 2]


def test_event_wait_method_orders_streams():
    producer, consumer = runtime.Stream(0), runtime.Stream(0)
    gate = threading.Event()
    log = []
    producer.launch_kernel(gated(gate))
    producer.launch_kernel(log.append, ("producer",))
    e = runtime.Event(enable_timing=False)
    e.record(producer)
    e.wait(consumer)
    consumer.launch_kernel(log.append, ("consumer",))
    assert not consumer.query()
    gate.set()
    consumer.synchronize(timeout=WAIT)
    assert log == ["producer", "consumer"]
    producer.destroy()
    consumer.destroy()


def test_wait_refers_to_record_at_wait_time():
    """A wait binds to the latest record when it is queued; later records don't matter."""
    producer, consumer = runtime.Stream(0), runtime.Stream(0)
    gate = threading.Event()
    e = runtime.Event()
    e.record(producer)  # completes at once (idle)
    consumer.wait_event(e)
    producer.launch_kernel(gated(gate))
    e.record(producer)  # a newer record, pending behind the gate
    log = []
    consumer.launch_kernel(log.append, (1,))
    consumer.synchronize(timeout=WAIT)  # does not wait for the newer record
    assert log == [1]
    assert not e.query()
    gate.set()
    e.synchronize(timeout=WAIT)
    producer.destroy()
    consumer.destroy()


# --- destroy ----------------------------------------------------------------------------------


def test_destroy_then_use_raises(stream):
    e = runtime.Event()
    other = runtime.Event()
    other.record(stream)
    e.record(stream)
    stream.synchronize(timeout=WAIT)
    e.destroy()
    for call in (
        lambda: e.record(stream),
        e.query,
        e.synchronize,
        lambda: e.elapsed_time(other),
        lambda: other.elapsed_time(e),
        lambda: e.timestamp_ns,
        lambda: stream.wait_event(e),
        lambda: e.wait(stream),
        e.destroy,
    ):
        with pytest.raises(runtime.InvalidHandleError):
            call()
    assert other.query()


def test_destroy_pending_event_lets_stream_continue(stream):
    gate = threading.Event()
    e = runtime.Event()
    stream.launch_kernel(gated(gate))
    e.record(stream)
    e.destroy()  # records already queued still complete: nothing waiting on them hangs
    log = []
    stream.launch_kernel(log.append, (1,))
    gate.set()
    stream.synchronize(timeout=WAIT)
    assert log == [1]


def test_destroy_event_a_stream_waits_on():
    producer, consumer = runtime.Stream(0), runtime.Stream(0)
    gate = threading.Event()
    e = runtime.Event()
    producer.launch_kernel(gated(gate))
    e.record(producer)
    consumer.wait_event(e)
    e.destroy()
    log = []
    consumer.launch_kernel(log.append, (1,))
    gate.set()
    consumer.synchronize(timeout=WAIT)
    assert log == [1]
    producer.destroy()
    consumer.destroy()


# --- the seed's example 3 ---------------------------------------------------------------------


def test_seed_example_3_flow():
    device = runtime.Device(0)
    stream = runtime.Stream(device)
    start_event = runtime.Event()
    end_event = runtime.Event()
    data = runtime.device_malloc(device, 1024 * 1024 * 4)
    result = runtime.device_malloc(device, 1024 * 1024 * 4)
    pattern = np.random.default_rng(3).integers(0, 255, 1024 * 1024 * 4, dtype=np.uint8)
    runtime.memcpy_host_to_device(data, pattern)

    start_event.record(stream)
    runtime.memcpy_d2d(result, data, stream)
    end_event.record(stream)
    stream.synchronize()

    elapsed_ms = start_event.elapsed_time(end_event)
    assert isinstance(elapsed_ms, float)
    assert elapsed_ms >= 0.0
    out = np.empty_like(pattern)
    runtime.memcpy_device_to_host(out, result)
    np.testing.assert_array_equal(out, pattern)

    start_event.destroy()
    end_event.destroy()
    stream.destroy()
    runtime.device_free(data)
    runtime.device_free(result)
