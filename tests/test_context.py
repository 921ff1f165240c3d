"""The context-local current device and stream: `with stream:` and `with runtime.Device(i):`.

`with stream:` makes the stream current and its device the current device (torch semantics);
`with runtime.Device(i):` makes the device current. Both live in a `contextvars.ContextVar`, so
each thread and each asyncio task sees its own, and both are restored on exit. Every call that
takes `None` for a device or stream reads the context first, then the thread's state.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading

import numpy as np
import pytest

import runtime
from runtime import kernels

WAIT = 10.0  # seconds: generous upper bound on any wait that could otherwise hang


@pytest.fixture(scope="module", autouse=True)
def _runtime():
    runtime.init(device_count=4, memory="256MiB")
    yield
    runtime.shutdown()


@pytest.fixture(autouse=True)
def _device_0():
    runtime.set_device(0)
    yield
    runtime.set_device(0)


class Gate:
    """A Python kernel (`launch(stream)`) that blocks until the caller announces (`issue()`) the
    call that must wait for it; a helper thread then opens it. It runs `write(*args)` and logs
    "kernel" when it finishes, so a blocking call that returns with an empty log did not wait
    for it."""

    def __init__(self, write=None):
        self.log: list[str] = []
        self._open, started, self._issued = threading.Event(), threading.Event(), threading.Event()

        def kernel(*args):
            started.set()
            assert self._open.wait(WAIT), "gate never opened"
            if write is not None:
                write(*args)
            self.log.append("kernel")

        self.kernel = kernel
        self.started = started

    def launch(self, stream, args=()):
        stream.launch_kernel(self.kernel, args)
        assert self.started.wait(WAIT)
        self._opener = threading.Thread(target=self._open_when_issued)
        self._opener.start()

    def _open_when_issued(self):
        if self._issued.wait(WAIT):
            self._open.set()

    def issue(self):
        self._issued.set()

    def close(self):
        self._issued.set()
        self._opener.join(WAIT)


def test_with_stream_makes_its_device_and_stream_current():
    s = runtime.Stream(2)
    with s as entered:
        assert entered is s
        assert runtime.get_device() == 2
        assert runtime.current_stream() == s
        assert runtime.current_stream(2) == s
        assert runtime.current_stream(0) == runtime.default_stream(0)
        assert runtime.default_stream() == runtime.default_stream(2)
    assert runtime.get_device() == 0
    assert runtime.current_stream() == runtime.default_stream(0)
    assert runtime.current_stream(2) == runtime.default_stream(2)
    s.destroy()


def test_blocking_copy_to_host_inside_with_waits_for_the_streams_work():
    s = runtime.Stream(2)
    gate = Gate(write=lambda v: v.__setitem__(slice(None), np.arange(64)))
    with s:
        src = runtime.empty(64, "int64")
        assert src.device.index == 2
        gate.launch(s, (src,))
        gate.issue()
        host = src.copy_to_host()  # blocking, on s: after the gated kernel wrote src
        gate.close()
    np.testing.assert_array_equal(host, np.arange(64))
    assert gate.log == ["kernel"]
    s.destroy()


def test_blocking_to_device_inside_with_waits_for_the_streams_work():
    s = runtime.Stream(2)
    gate = Gate()
    with s:
        gate.launch(s)
        gate.issue()
        x = runtime.to_device(np.arange(8, dtype=np.int32))
        assert gate.log == ["kernel"]  # the copy was queued behind the kernel and waited for
        gate.close()
    assert x.device.index == 2
    np.testing.assert_array_equal(x.copy_to_host(), np.arange(8))
    s.destroy()


def test_kernel_call_and_event_record_without_stream_use_the_with_stream():
    s = runtime.Stream(3)
    gate = Gate()
    with s:
        x = runtime.empty(16, "float32")
        gate.launch(s)
        kernels.fill(x, 5.0)  # no stream=: queued on s, behind the gate
        e = runtime.Event()
        e.record()  # no stream: recorded on s, behind the gate
        assert not e.query()
        assert not s.query()
        assert runtime.default_stream(3).query()  # nothing went to the thread's stream
        gate.close()
        s.synchronize(timeout=WAIT)
        assert e.query()
    np.testing.assert_array_equal(x.copy_to_host(), np.full(16, 5.0, np.float32))
    s.destroy()


def test_with_stream_restores_device_and_stream_on_exception():
    runtime.set_device(1)
    s = runtime.Stream(2)
    with pytest.raises(KeyError), s:
        assert runtime.get_device() == 2
        raise KeyError("x")
    assert runtime.get_device() == 1
    assert runtime.current_stream() == runtime.default_stream(1)
    assert runtime.current_stream(2) == runtime.default_stream(2)
    s.destroy()


def test_nested_withs_across_devices_restore_each_level():
    a, b = runtime.Stream(1), runtime.Stream(3)
    with a:
        with b:
            assert runtime.get_device() == 3
            assert runtime.current_stream() == b
            assert runtime.current_stream(1) == a
            with runtime.Device(0):
                assert runtime.get_device() == 0
                assert runtime.current_stream() == runtime.default_stream(0)
                assert runtime.current_stream(1) == a
                assert runtime.current_stream(3) == b
                with a:
                    assert runtime.get_device() == 1
                assert runtime.get_device() == 0
            assert runtime.get_device() == 3
            assert runtime.current_stream() == b
        assert runtime.get_device() == 1
        assert runtime.current_stream() == a
        assert runtime.current_stream(3) == runtime.default_stream(3)
    assert runtime.get_device() == 0
    assert runtime.current_stream(1) == runtime.default_stream(1)
    a.destroy()
    b.destroy()


def test_same_stream_entered_twice_restores_outer_level():
    s = runtime.Stream(2)
    with runtime.Device(1):
        with s:
            with s:
                assert runtime.current_stream() == s
            assert runtime.current_stream() == s
            assert runtime.get_device() == 2
        assert runtime.get_device() == 1
    assert runtime.get_device() == 0
    s.destroy()


def test_with_device_then_defaults_use_that_device():
    with runtime.Device(3):
        s = runtime.Stream()
        assert s.device.index == 3
        assert runtime.empty(4, "int32").device.index == 3
        assert runtime.to_device(np.zeros(4)).device.index == 3
        assert runtime.memory_stats()["device"] == 3
        assert runtime.current_stream() == runtime.default_stream(3)
    assert runtime.Stream().device.index == 0
    s.destroy()


def test_set_device_inside_with_lasts_until_its_exit():
    # As torch and CuPy: the with restores the device it saved on entry.
    runtime.set_device(1)
    with runtime.Device(2):
        runtime.set_device(3)
        assert runtime.get_device() == 3
        assert runtime.Stream().device.index == 3
    assert runtime.get_device() == 1


def test_threads_each_see_their_own_with():
    streams = [runtime.Stream(1), runtime.Stream(2)]
    both_inside = threading.Barrier(3, timeout=WAIT)
    checked = threading.Barrier(3, timeout=WAIT)
    seen = {}

    def worker(i):
        with streams[i]:
            both_inside.wait(WAIT)
            seen[i] = (runtime.get_device(), runtime.current_stream())
            checked.wait(WAIT)

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    both_inside.wait(WAIT)
    main_view = (runtime.get_device(), runtime.current_stream())
    checked.wait(WAIT)
    for t in ts:
        t.join(WAIT)
    assert seen == {0: (1, streams[0]), 1: (2, streams[1])}
    assert main_view == (0, runtime.default_stream(0))
    for s in streams:
        s.destroy()


def test_asyncio_tasks_interleaving_each_see_their_own_with():
    streams = [runtime.Stream(1), runtime.Stream(2)]

    async def task(i):
        views = []
        with streams[i]:
            for _ in range(3):
                await asyncio.sleep(0)  # the other task runs its own with in between
                views.append((runtime.get_device(), runtime.current_stream()))
        views.append((runtime.get_device(), runtime.current_stream()))
        return views

    async def main():
        return await asyncio.gather(task(0), task(1))

    v0, v1 = asyncio.run(main())
    assert v0 == [(1, streams[0])] * 3 + [(0, runtime.default_stream(0))]
    assert v1 == [(2, streams[1])] * 3 + [(0, runtime.default_stream(0))]
    for s in streams:
        s.destroy()


def test_task_created_inside_with_inherits_it():
    s = runtime.Stream(2)

    async def child():
        await asyncio.sleep(0)
        return runtime.get_device(), runtime.current_stream()

    async def main():
        with s:
            t = asyncio.create_task(child())
        return await t

    assert asyncio.run(main()) == (2, s)
    s.destroy()


def test_copied_context_carries_the_with_into_another_thread():
    s = runtime.Stream(3)
    out = []
    with s:
        ctx = contextvars.copy_context()
    t = threading.Thread(target=lambda: out.append(ctx.run(runtime.current_stream)))
    t.start()
    t.join(WAIT)
    assert out == [s]
    s.destroy()


def test_with_of_an_old_runtime_is_not_used_after_shutdown():
    s = runtime.Stream(3)
    with s:
        runtime.shutdown()
        runtime.init(device_count=4, memory="256MiB")
        assert runtime.get_device() == 0
        assert runtime.current_stream() == runtime.default_stream(0)
        assert runtime.current_stream(3) == runtime.default_stream(3)
        x = runtime.to_device(np.arange(4, dtype=np.int64))
        assert x.device.index == 0
        np.testing.assert_array_equal(x.copy_to_host(), np.arange(4))
        t = runtime.Stream(1)
        with t:
            assert runtime.get_device() == 1
            assert runtime.current_stream() == t
        assert runtime.get_device() == 0
    assert runtime.current_stream() == runtime.default_stream(0)
    t.destroy()
