"""Capture and replay: stream.begin_capture() / end_capture() -> Graph, graph.launch(stream)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import runtime
from runtime import kernels

WAIT = 10.0


@pytest.fixture(scope="module", autouse=True)
def _runtime():
    runtime.init(device_count=4, memory="1GiB")
    yield
    runtime.shutdown()


@pytest.fixture
def stream():
    s = runtime.Stream(0)
    yield s
    if s.is_capturing:
        s.end_capture()
    s.synchronize(timeout=WAIT)
    s.destroy()


def snapshot(log, tag):
    def kernel(v):
        log.append((tag, v.copy()))

    return kernel


def test_capture_then_replay_twice(stream):
    log = []
    x = runtime.to_device(np.ones(4, np.float32))
    ev = runtime.Event()
    stream.begin_capture()
    assert stream.is_capturing
    stream.launch_kernel(snapshot(log, "A"), (x,))
    stream.launch_kernel(kernels.scale, (x, x, 2.0))
    kernels.add(x, x, x, stream=stream)  # call form, captured too
    ev.record(stream)
    stream.launch_kernel(snapshot(log, "B"), (x,))
    stream.launch_host_func(log.append, "host")
    g = stream.end_capture()
    assert not stream.is_capturing

    # nothing ran during capture
    stream.synchronize(timeout=WAIT)
    assert log == []
    np.testing.assert_array_equal(x.copy_to_host(), np.ones(4, np.float32))
    assert ev.query()  # never recorded: capture does not record

    assert isinstance(g, runtime.Graph)
    assert len(g) == 6
    nodes = g.nodes
    assert nodes[0].endswith("kernel")
    assert nodes[1:3] == ["scale", "add"]
    assert nodes[3] == f"record(Event#{ev.id})"
    assert nodes[4].endswith("kernel")
    assert nodes[5] == "list.append"  # the callable's __qualname__
    assert "6 nodes" in repr(g)

    g.launch(stream)
    g.launch(stream)
    stream.synchronize(timeout=WAIT)
    tags = [t if isinstance(t, str) else t[0] for t in log]
    assert tags == ["A", "B", "host", "A", "B", "host"]
    values = [t[1][0] for t in log if not isinstance(t, str)]
    assert values == [1.0, 4.0, 4.0, 16.0]
    np.testing.assert_array_equal(x.copy_to_host(), np.full(4, 16.0, np.float32))
    assert ev.query()
    assert ev.timestamp_ns > 0


def test_replay_on_another_stream_and_replay_alias(stream):
    log = []
    stream.begin_capture()
    stream.launch_kernel(log.append, (1,))
    stream.launch_kernel(log.append, (2,))
    g = stream.end_capture()
    other = runtime.Stream(0)
    g.launch(other)
    g.replay(other)
    other.synchronize(timeout=WAIT)
    assert log == [1, 2, 1, 2]
    with other:
        g.launch()  # the current stream
    other.synchronize(timeout=WAIT)
    assert log == [1, 2, 1, 2, 1, 2]
    other.destroy()


def test_replay_ordered_with_other_work(stream):
    log = []
    stream.begin_capture()
    stream.launch_kernel(log.append, ("g",))
    g = stream.end_capture()
    stream.launch_kernel(log.append, ("before",))
    g.launch(stream)
    stream.launch_kernel(log.append, ("after",))
    stream.synchronize(timeout=WAIT)
    assert log == ["before", "g", "after"]


def test_graph_events_time_each_replay(stream):
    start, end = runtime.Event(), runtime.Event()
    stream.begin_capture()
    start.record(stream)
    stream.launch_kernel(kernels.noop)
    end.record(stream)
    g = stream.end_capture()
    for _ in range(2):
        g.launch(stream)
        stream.synchronize(timeout=WAIT)
        assert start.query() and end.query()
        assert start.elapsed_time(end) >= 0.0


def test_graph_wait_event_orders_replay_after_producer(stream):
    producer = runtime.Stream(0)
    gate = threading.Event()
    e = runtime.Event()
    buf = runtime.empty(8, "int64")
    seen = []
    stream.begin_capture()
    stream.wait_event(e)
    stream.launch_kernel(lambda v: seen.append(v.copy()), (buf,))
    g = stream.end_capture()
    assert g.nodes[0] == f"wait(Event#{e.id})"

    def produce(v):
        assert gate.wait(WAIT)
        v[:] = np.arange(8)

    producer.launch_kernel(produce, (buf,))
    e.record(producer)
    g.launch(stream)  # waits for the record that is latest now
    assert not stream.query()
    gate.set()
    stream.synchronize(timeout=WAIT)
    np.testing.assert_array_equal(seen[0], np.arange(8))
    producer.destroy()


def test_graph_kernel_error_surfaces_at_synchronize(stream):
    log = []

    def boom():
        raise ValueError("graph boom")

    stream.begin_capture()
    stream.launch_kernel(boom)
    stream.launch_kernel(log.append, (1,))
    g = stream.end_capture()
    g.launch(stream)
    with pytest.raises(runtime.KernelError, match="graph boom") as ei:
        stream.synchronize(timeout=WAIT)
    assert isinstance(ei.value.__cause__, ValueError)
    assert log == []
    stream.launch_kernel(log.append, (2,))
    stream.synchronize(timeout=WAIT)
    assert log == [2]


def test_empty_graph(stream):
    stream.begin_capture()
    g = stream.end_capture()
    assert len(g) == 0
    assert g.nodes == []
    g.launch(stream)
    stream.synchronize(timeout=WAIT)
    assert stream.query()


def test_launch_graph_while_capturing_extends_capture(stream):
    log = []
    stream.begin_capture()
    stream.launch_kernel(log.append, (1,))
    inner = stream.end_capture()
    stream.begin_capture()
    inner.launch(stream)
    stream.launch_kernel(log.append, (2,))
    outer = stream.end_capture()
    assert len(outer) == 2
    assert log == []
    outer.launch(stream)
    stream.synchronize(timeout=WAIT)
    assert log == [1, 2]


def test_end_capture_without_begin_raises(stream):
    with pytest.raises(runtime.InvalidOperationError, match="not capturing"):
        stream.end_capture()
    assert issubclass(runtime.InvalidOperationError, runtime.Error)


def test_double_begin_raises(stream):
    log = []
    stream.begin_capture()
    with pytest.raises(runtime.InvalidOperationError, match="already capturing"):
        stream.begin_capture()
    assert stream.is_capturing  # the first capture goes on
    stream.launch_kernel(log.append, (1,))
    g = stream.end_capture()
    assert len(g) == 1
    with pytest.raises(runtime.InvalidOperationError):
        stream.end_capture()
    g.launch(stream)
    stream.synchronize(timeout=WAIT)
    assert log == [1]


def test_capture_is_per_stream(stream):
    other = runtime.Stream(0)
    log = []
    stream.begin_capture()
    other.launch_kernel(log.append, ("other",))  # not captured: runs
    other.synchronize(timeout=WAIT)
    assert log == ["other"]
    assert not other.is_capturing
    g = stream.end_capture()
    assert len(g) == 0
    other.destroy()


def test_graph_launch_sync_mode(stream):
    log = []
    stream.begin_capture()
    stream.launch_kernel(log.append, (1,))
    g = stream.end_capture()
    saved = runtime.get_option("enableAsync")
    runtime.set_option("enableAsync", False)
    try:
        g.launch(stream)
        assert log == [1]  # ran before launch returned
    finally:
        runtime.set_option("enableAsync", saved)


def test_graph_launch_on_destroyed_stream_raises(stream):
    stream.begin_capture()
    stream.launch_kernel(kernels.noop)
    g = stream.end_capture()
    other = runtime.Stream(0)
    other.destroy()
    with pytest.raises(runtime.InvalidHandleError):
        g.launch(other)
    with pytest.raises(TypeError, match="stream"):
        g.launch(0)


# --- issue 11, items 1-4: capture as in CUDA ----------------------------------------------


def test_blocking_copies_and_memset_during_capture_raise_and_never_return_stale_data():
    # The blocking calls use the current stream; while it captures they would return before
    # the captured work ran (CUDA: cudaErrorStreamCaptureImplicit).
    buf = runtime.to_device(np.arange(8, dtype=np.float32))
    host = np.zeros(8, dtype=np.float32)
    s = runtime.current_stream()
    s.begin_capture()
    try:
        for call in (
            lambda: buf.copy_to_host(),
            lambda: runtime.memcpy_device_to_host(host, buf),
            lambda: runtime.memcpy_host_to_device(buf, host),
            lambda: runtime.to_device(np.ones(4, dtype=np.float32)),
            lambda: runtime.memset(buf, 0),
        ):
            with pytest.raises(runtime.InvalidOperationError, match="capturing"):
                call()
        with pytest.raises(RuntimeError):  # the hierarchy: a RuntimeError subclass
            buf.copy_to_host()
    finally:
        s.end_capture()
    np.testing.assert_array_equal(buf.copy_to_host(), np.arange(8, dtype=np.float32))
    assert not host.any()


def test_synchronize_and_barriers_on_a_capturing_stream_raise(stream):
    stream.begin_capture()
    with pytest.raises(runtime.InvalidOperationError, match="capturing"):
        stream.synchronize()
    with pytest.raises(runtime.InvalidOperationError, match="capturing"):
        runtime.stream_synchronize()
    with pytest.raises(runtime.InvalidOperationError, match="capturing"):
        runtime.Device(0).synchronize()
    graph = stream.end_capture()
    assert len(graph) == 0
    stream.synchronize(timeout=WAIT)
    runtime.stream_synchronize(timeout=WAIT)


def test_cross_stream_capture_fork_join_replays_with_correct_results(stream):
    other = runtime.Stream(0)
    x = runtime.zeros((16,), np.float32)
    fork, join = runtime.Event(), runtime.Event()
    stream.begin_capture()
    stream.launch_kernel(kernels.fill, (x, 2.0))
    fork.record(stream)
    other.wait_event(fork)  # fork: `other` joins the capture
    assert other.is_capturing
    other.launch_kernel(kernels.axpy, (x, x, 3.0))  # x = 3x + x = 8
    join.record(other)
    stream.wait_event(join)  # join
    stream.launch_kernel(kernels.scale, (x, x, 0.25))  # x = 2
    graph = stream.end_capture()
    assert not other.is_capturing
    np.testing.assert_array_equal(x.copy_to_host(), np.zeros(16, np.float32))
    for _ in range(3):
        graph.launch(stream)
        stream.synchronize(timeout=WAIT)
        np.testing.assert_array_equal(x.copy_to_host(), np.full(16, 2.0, np.float32))
    other.destroy()


def test_capture_with_an_unjoined_fork_fails_and_ends(stream):
    other = runtime.Stream(0)
    fork = runtime.Event()
    stream.begin_capture()
    fork.record(stream)
    other.wait_event(fork)
    other.launch_kernel(kernels.noop, ())
    with pytest.raises(runtime.InvalidOperationError, match="not joined back"):
        stream.end_capture()
    assert not stream.is_capturing and not other.is_capturing
    other.destroy()


def test_a_captured_wait_on_an_outside_event_is_an_ordinary_dependency(stream):
    producer = runtime.Stream(0)
    gate, started = threading.Event(), threading.Event()
    log = []

    def held():
        started.set()
        assert gate.wait(WAIT)
        log.append("producer")

    ready = runtime.Event()
    stream.begin_capture()
    stream.wait_event(ready)
    stream.launch_host_func(log.append, "consumer")
    graph = stream.end_capture()
    producer.launch_host_func(held)
    ready.record(producer)
    graph.launch(stream)
    assert started.wait(WAIT)
    assert not stream.query()
    gate.set()
    stream.synchronize(timeout=WAIT)
    assert log == ["producer", "consumer"]
    producer.destroy()


def test_a_graph_belongs_to_its_runtime_and_device():
    stream = runtime.Stream(0)
    stream.begin_capture()
    stream.launch_kernel(kernels.noop, ())
    graph = stream.end_capture()
    with pytest.raises(ValueError, match="graph"):
        graph.launch(runtime.Stream(1))
    runtime.shutdown()
    runtime.init(device_count=4, memory="1GiB")
    with pytest.raises(runtime.InvalidHandleError):
        graph.launch(runtime.Stream(0))


def test_destroying_a_capturing_stream_while_another_thread_launches_does_not_deadlock():
    # issue 11 item 10: the captured steps own Python callables; destroy drops them after
    # releasing the capture lock, so a launcher holding the GIL and wanting that lock, and a
    # destroy dropping Python objects, never wait for each other.
    import faulthandler

    faulthandler.dump_traceback_later(60, exit=True)  # a deadlock fails the run, not hangs it
    try:
        for _ in range(20):
            s = runtime.Stream(0)
            s.begin_capture()
            for _ in range(50):
                s.launch_kernel(lambda: None)
            stop = threading.Event()
            seen = []

            def launcher(s=s, stop=stop, seen=seen):
                while not stop.is_set():
                    try:
                        s.launch_kernel(lambda: None)
                    except runtime.Error as e:
                        seen.append(type(e).__name__)
                        return

            t = threading.Thread(target=launcher)
            t.start()
            s.destroy()
            stop.set()
            t.join(WAIT)
            assert not t.is_alive()
            assert seen in ([], ["InvalidHandleError"])
    finally:
        faulthandler.cancel_dump_traceback_later()
