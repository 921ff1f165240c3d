"""asyncio: ``await stream.async_done()`` and ``await event``, resolved from the engine (or the
thread that sets a user event) through ``loop.call_soon_threadsafe``."""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
import weakref

import numpy as np
import pytest

import runtime
from runtime import _aio

WAIT = 10.0  # seconds: generous upper bound on any wait that could otherwise hang


@pytest.fixture(scope="module", autouse=True)
def _runtime():
    runtime.init(device_count=2, memory="256MiB")
    yield
    runtime.shutdown()


@pytest.fixture
def unraisable(monkeypatch):
    """Exceptions swallowed by the completion callbacks (must stay empty)."""
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_value))
    return seen


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, WAIT))


# numba: numba/cuda/tests/cudadrv/test_streams.py::TestCudaStream::test_async_done
def test_async_done_on_an_idle_stream():
    async def main():
        s = runtime.Stream()
        assert await s.async_done() is s

    run(main())


def test_async_done_waits_for_the_queued_work(unraisable):
    async def main():
        s = runtime.Stream()
        gate, log = threading.Event(), []
        s.launch_host_func(lambda: (gate.wait(WAIT), log.append("ran")))
        fut = s.async_done()
        for _ in range(20):
            await asyncio.sleep(0)
        assert not fut.done()  # held by the gate
        gate.set()
        assert await fut is s
        assert log == ["ran"]
        assert s.query()

    run(main())
    assert unraisable == []


# numba: numba/cuda/tests/cudadrv/test_streams.py::TestCudaStream::test_parallel_tasks
def test_parallel_tasks():
    async def one(value):
        s = runtime.Stream()
        d = runtime.to_device(np.full(8, float(value)), stream=s)
        out = d.copy_to_host(np.zeros(8), stream=s)
        await s.async_done()
        return out.mean()

    async def main():
        return await asyncio.gather(*(one(v) for v in (1, 2, 3, 4)))

    assert run(main()) == [1.0, 2.0, 3.0, 4.0]


# numba: numba/cuda/tests/cudadrv/test_streams.py::TestCudaStream::test_multiple_async_done
def test_multiple_async_done():
    async def main():
        s = runtime.Stream()
        return await asyncio.gather(*(s.async_done() for _ in range(4)))

    assert len(run(main())) == 4


# numba: numba/cuda/tests/cudadrv/test_streams.py::TestCudaStream::test_cancelled_future
def test_cancelled_future(unraisable):
    async def main():
        s = runtime.Stream()
        gate = threading.Event()
        s.launch_host_func(gate.wait, WAIT)
        done1, done2 = s.async_done(), s.async_done()
        done1.cancel()
        gate.set()
        await done2
        assert done1.cancelled()
        assert done2.done()

    run(main())
    assert unraisable == []


def test_await_event():
    async def main():
        s = runtime.Stream()
        gate = threading.Event()
        s.launch_host_func(gate.wait, WAIT)
        e = s.record_event()
        task = asyncio.ensure_future(_await(e))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not task.done()
        gate.set()
        assert await task is None
        assert e.query()
        # Never recorded: complete at once, as query() says.
        await runtime.Event()

    run(main())


async def _await(e):
    return await e


def test_await_user_event_set_from_another_thread():
    async def main():
        ev = runtime.UserEvent()
        threading.Timer(0.01, ev.set).start()
        await ev
        assert ev.query()

    run(main())


def test_await_failed_user_event_raises():
    async def main():
        ev = runtime.UserEvent()
        asyncio.get_running_loop().call_soon(ev.set_status, "lost")
        with pytest.raises(runtime.KernelError, match="lost"):
            await ev

    run(main())


def test_cancelled_await_of_a_user_event_is_safe(unraisable):
    async def main():
        ev = runtime.UserEvent()
        task = asyncio.ensure_future(_await(ev))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        ev.set()  # completes after the cancel: nothing to resolve, nothing raised
        await asyncio.sleep(0)

    run(main())
    assert unraisable == []


def test_event_completing_after_its_loop_closed_is_harmless(unraisable):
    ev = runtime.UserEvent()
    loop = asyncio.new_event_loop()

    async def start():
        return _aio.event_future(ev)  # what `await ev` awaits

    fut = loop.run_until_complete(start())
    loop.run_until_complete(asyncio.sleep(0))
    assert not fut.done()
    loop.close()
    ev.set()  # the callback finds the loop closed and lets go
    assert unraisable == []


def test_async_done_needs_a_running_loop():
    with pytest.raises(RuntimeError, match="no running event loop"):
        runtime.Stream().async_done()


# -- issue 22: cancellation, timeouts, many awaiters --------------------------------------


def test_cancelled_and_timed_out_awaits_let_go_of_their_callbacks_at_once(unraisable):
    # Each pending `await` parks a callback on the event; a cancel or a wait_for timeout must
    # take it back (it held ~700 B and the future until the event completed).
    async def main():
        ev = runtime.UserEvent()
        for _ in range(300):
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(ev, 0.0001)
        tasks = [asyncio.ensure_future(_await(ev)) for _ in range(300)]
        await asyncio.sleep(0)
        assert ev._parked_callbacks == 300
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert ev._parked_callbacks == 0
        fut = _aio.event_future(ev)
        ref = weakref.ref(fut)
        fut.cancel()
        del fut
        await asyncio.sleep(0)
        gc.collect()
        assert ref() is None  # nothing holds the cancelled future
        ev.set()
        await ev

    run(main())
    assert unraisable == []


def test_many_awaiters_of_one_event_all_resolve_once(unraisable):
    async def main():
        s = runtime.Stream()
        gate = threading.Event()
        s.launch_host_func(gate.wait, WAIT)
        ev = s.record_event()
        results = asyncio.gather(*(_await(ev) for _ in range(2000)))
        dones = asyncio.gather(*(s.async_done() for _ in range(200)))
        await asyncio.sleep(0)
        assert ev._parked_callbacks == 2000
        gate.set()
        assert await results == [None] * 2000
        assert await dones == [s] * 200
        assert ev._parked_callbacks == 0

    run(main())
    assert unraisable == []


def test_awaiters_on_two_loops_in_two_threads(unraisable):
    ev = runtime.UserEvent()
    got = []

    def loop_thread():
        got.append(asyncio.run(asyncio.wait_for(_await(ev), WAIT)))

    threads = [threading.Thread(target=loop_thread) for _ in range(4)]
    for t in threads:
        t.start()
    while ev._parked_callbacks < 4:
        threading.Event().wait(0.001)
    ev.set()
    for t in threads:
        t.join(WAIT)
    assert got == [None] * 4
    assert unraisable == []
