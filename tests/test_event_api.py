"""User events (OpenCL's ``UserEvent``): completed by the host, waited on by streams and
callers; failure; release at shutdown."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import runtime

WAIT = 10.0  # seconds: generous upper bound on any wait that could otherwise hang


@pytest.fixture(autouse=True)
def _runtime():
    runtime.init(device_count=2, memory="256MiB")
    yield
    runtime.shutdown()


def test_user_event_basics():
    e = runtime.UserEvent()
    assert e.is_user and runtime.Event.user().is_user
    assert not runtime.Event().is_user
    assert e.query() is False  # pending from the start
    assert e.failure is None and e.device is None
    e.set()
    assert e.query() is True
    e.synchronize(WAIT)
    assert e.timestamp_ns > 0  # the time of set()


# pyopencl: test/test_wrapper.py::test_user_event
@pytest.mark.parametrize("waiter", ["synchronize", "stream"])
def test_user_event_releases_a_waiting_thread(waiter):
    evt = runtime.UserEvent()
    status = {}
    started = threading.Event()

    def wait_for_it():
        started.set()
        if waiter == "synchronize":
            evt.synchronize(timeout=WAIT)
        else:
            s = runtime.Stream()
            s.wait_event(evt)
            s.synchronize(timeout=WAIT)
        status["a"] = True

    t = threading.Thread(target=wait_for_it)
    t.start()
    assert started.wait(WAIT)
    assert "a" not in status  # cannot have finished: nothing set the event yet
    evt.set_status("complete")
    t.join(WAIT)
    assert status == {"a": True}


def test_stream_waits_for_a_user_event():
    s = runtime.Stream()
    ev = runtime.UserEvent()
    log = []
    s.launch_host_func(log.append, "before")
    s.wait_event(ev)
    s.launch_host_func(log.append, "after")
    done = s.record_event()
    with pytest.raises(runtime.WaitTimeoutError):
        s.synchronize(timeout=0.05)  # held by the unset event; the work goes on
    assert not done.query()
    assert log == ["before"]
    ev.set()
    s.synchronize(WAIT)
    assert log == ["before", "after"]
    assert done.query()


def test_user_event_set_once_and_never_recorded():
    ev = runtime.UserEvent()
    with pytest.raises(runtime.InvalidOperationError, match="cannot be recorded on a stream"):
        runtime.Stream().record_event(ev)
    ev.set()
    with pytest.raises(runtime.InvalidOperationError, match="already set"):
        ev.set()
    with pytest.raises(runtime.InvalidOperationError, match="not a user event"):
        runtime.Event().set()


@pytest.mark.parametrize(
    ("status", "message"),
    [(-5, "error status -5"), ("device lost", "device lost"), (OSError("io"), "OSError: io")],
)
def test_failed_user_event_fails_its_waiters(status, message):
    s = runtime.Stream()
    ev = runtime.UserEvent()
    buf = runtime.to_device(np.zeros(4))
    s.wait_event(ev)
    runtime.memset(buf, 1, stream=s)  # skipped: behind a failed wait
    ev.set_status(status)
    assert ev.query() is True
    assert message in ev.failure
    with pytest.raises(runtime.KernelError, match=message) as info:
        s.synchronize(WAIT)
    assert info.value.kernel == f"wait(UserEvent#{ev.id})"
    assert info.value.stream == s.id
    np.testing.assert_array_equal(buf.copy_to_host(), np.zeros(4))
    # Reported once; the stream runs normally afterwards.
    s.synchronize(WAIT)
    runtime.memset(buf, 0, stream=s)
    s.synchronize(WAIT)
    with pytest.raises(runtime.KernelError, match=message):
        ev.synchronize(WAIT)


def test_set_status_checks_its_argument():
    ev = runtime.UserEvent()
    with pytest.raises(ValueError, match="status: 3 is not a final status"):
        ev.set_status(3)
    with pytest.raises(TypeError, match="got bool"):
        ev.set_status(True)
    with pytest.raises(TypeError, match="got list"):
        ev.set_status([])
    assert ev.query() is False  # bad input changed nothing
    ev.set_status(0)
    assert ev.query() is True and ev.failure is None


def test_shutdown_releases_a_stream_waiting_on_an_unset_user_event():
    s = runtime.Stream()
    ev = runtime.UserEvent()
    log = []
    s.wait_event(ev)
    s.launch_host_func(log.append, "after")
    runtime.shutdown()  # must not hang
    assert ev.failure == "the runtime was shut down before the user event was set"
    assert log == []  # the work behind the failed wait was skipped
    runtime.init(device_count=2, memory="256MiB")
    with pytest.raises(runtime.InvalidHandleError):
        ev.set()  # it belonged to the old runtime


def test_user_event_wait_in_a_graph_capture_is_bound_at_launch():
    s = runtime.Stream()
    ev = runtime.UserEvent()
    log = []
    s.begin_capture()
    s.wait_event(ev)
    s.launch_host_func(log.append, 1)
    g = s.end_capture()
    g.launch(s)
    assert not s.query()
    ev.set()
    s.synchronize(WAIT)
    assert log == [1]
