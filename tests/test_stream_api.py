"""Streams as torch/CuPy/Numba users write them: non-blocking streams and the legacy default
stream, ``Stream.use`` / ``set_stream``, the ``__cuda_stream__`` protocol, ``add_callback``,
``record_event(event)``, ``auto_synchronize``, ``copy_to_host(out=, stream=)``,
``defer_cleanup``, device ordering and ``DeviceProperties.uuid``."""

from __future__ import annotations

import threading
import uuid

import numpy as np
import pytest

import runtime

WAIT = 10.0  # seconds: generous upper bound on any wait that could otherwise hang


@pytest.fixture(scope="module", autouse=True)
def _runtime():
    runtime.init(device_count=2, memory="256MiB")
    yield
    runtime.shutdown()


@pytest.fixture
def legacy():
    runtime.set_option("legacyDefaultStream", True)
    yield
    runtime.set_option("legacyDefaultStream", False)


def gate_on(stream, gate, log=None, name=None):
    """Queue a host function on ``stream`` that waits for ``gate`` (then logs ``name``)."""

    def body():
        assert gate.wait(WAIT), "gate never opened"
        if log is not None:
            log.append(name)

    stream.launch_host_func(body)


# ---------------------------------------------------------------- non_blocking / legacy


# cupy: tests/cupy_tests/cuda_tests/test_stream.py::TestStream::test_create_with_flags
def test_non_blocking_flag():
    assert runtime.Stream().is_non_blocking is False
    assert runtime.Stream(non_blocking=True).is_non_blocking is True
    assert runtime.Stream(non_blocking=False).is_non_blocking is False
    assert runtime.default_stream().is_non_blocking is False
    with pytest.raises(TypeError, match="non_blocking must be a bool, got int"):
        runtime.Stream(non_blocking=1)


def test_per_thread_default_stream_does_not_synchronise_by_default():
    assert runtime.get_option("legacyDefaultStream") is False
    d, s = runtime.default_stream(), runtime.Stream()
    gate, ran = threading.Event(), threading.Event()
    gate_on(d, gate)
    s.launch_host_func(ran.set)
    # The blocking stream runs while the default stream is held: no hidden barrier.
    assert ran.wait(WAIT)
    assert not d.query()
    gate.set()
    d.synchronize(WAIT)


def test_legacy_default_stream_waits_for_blocking_streams(legacy):
    d, s = runtime.default_stream(), runtime.Stream()
    gate, log = threading.Event(), []
    gate_on(s, gate, log, "blocking")
    d.launch_host_func(lambda: log.append("default"))
    assert not d.query()  # behind the barrier on the held blocking stream
    gate.set()
    d.synchronize(WAIT)
    assert log == ["blocking", "default"]


def test_legacy_blocking_stream_waits_for_default_stream(legacy):
    d, s = runtime.default_stream(), runtime.Stream()
    gate, log = threading.Event(), []
    gate_on(d, gate, log, "default")
    s.launch_host_func(lambda: log.append("blocking"))
    ev = s.record_event()
    assert not s.query()
    assert not ev.query()  # a record is ordered behind the barrier too
    gate.set()
    s.synchronize(WAIT)
    assert log == ["default", "blocking"]
    assert ev.query()


def test_legacy_non_blocking_stream_runs_beside_default(legacy):
    d, nb = runtime.default_stream(), runtime.Stream(non_blocking=True)
    gate, ran = threading.Event(), threading.Event()
    gate2 = threading.Event()
    gate_on(d, gate)
    try:
        nb.launch_host_func(ran.set)
        assert ran.wait(WAIT)  # not held by the default stream
        nb.synchronize(WAIT)  # completes while the default stream is still held
        assert not d.query()
        # ... and the default stream does not wait for it either.
        gate_on(nb, gate2)
        gate.set()
        d.synchronize(WAIT)
        assert not nb.query()
    finally:
        gate.set()
        gate2.set()
    nb.synchronize(WAIT)


def test_legacy_barrier_only_on_the_same_device(legacy):
    d0 = runtime.default_stream(0)
    s1 = runtime.Stream(1)
    gate, ran = threading.Event(), threading.Event()
    gate_on(d0, gate)
    s1.launch_host_func(ran.set)
    assert ran.wait(WAIT)
    gate.set()
    d0.synchronize(WAIT)


# ---------------------------------------------------------------- use / set_stream


# cupy: tests/cupy_tests/cuda_tests/test_stream.py::TestStream::test_use
def test_use_returns_the_stream_and_makes_it_current():
    s = runtime.Stream()
    try:
        assert s.use() is s
        assert runtime.current_stream() == s
        assert runtime.current_stream(0) == s
    finally:
        runtime.default_stream().use()
    assert runtime.current_stream() == runtime.default_stream()


def test_use_switches_to_the_streams_device():
    s1 = runtime.Stream(1)
    try:
        s1.use()
        assert runtime.get_device() == 1
        assert runtime.current_stream() == s1
        assert runtime.current_stream(0) == runtime.default_stream(0)
    finally:
        runtime.set_stream(runtime.default_stream(1))
        runtime.set_device(0)
    assert runtime.current_stream(1) == runtime.default_stream(1)


# cupy: tests/cupy_tests/cuda_tests/test_stream.py::TestStream::test_mix_use_context
def test_use_inside_with_is_undone_by_nested_with_exit():
    s1, s2, s3 = runtime.Stream(), runtime.Stream(), runtime.Stream()
    with s1:
        s2.use()
        assert runtime.current_stream() == s2
        with s3:
            assert runtime.current_stream() == s3
        assert runtime.current_stream() == s1
        s2.use()
    # The with's exit restores what was current before it.
    assert runtime.current_stream() == runtime.default_stream()


def test_use_is_per_thread():
    s = runtime.Stream()
    seen = []
    try:
        s.use()
        t = threading.Thread(target=lambda: seen.append(runtime.current_stream()))
        t.start()
        t.join(WAIT)
    finally:
        runtime.default_stream().use()
    assert seen == [runtime.default_stream()]


# torch: test/test_cuda.py::TestCuda::test_streams (torch.cuda.set_stream)
def test_set_stream_and_none():
    s = runtime.Stream()
    runtime.set_stream(s)
    try:
        assert runtime.current_stream() == s
        runtime.set_stream(None)  # torch: does nothing
        assert runtime.current_stream() == s
    finally:
        runtime.set_stream(runtime.default_stream())
    with pytest.raises(TypeError, match="stream must be a runtime.Stream or None, got int"):
        runtime.set_stream(3)


def test_use_of_a_destroyed_stream_is_refused():
    s = runtime.Stream()
    s.destroy()
    with pytest.raises(runtime.InvalidHandleError):
        s.use()
    assert runtime.current_stream() == runtime.default_stream()


# torch: test/test_cuda.py (torch.cuda.is_current_stream_capturing in the graph tests)
def test_is_current_stream_capturing():
    s = runtime.Stream()
    assert runtime.is_current_stream_capturing() is False
    with s:
        s.begin_capture()
        assert runtime.is_current_stream_capturing() is True
        s.end_capture()
        assert runtime.is_current_stream_capturing() is False
    s.begin_capture()
    # Capturing, but not the current stream.
    assert runtime.is_current_stream_capturing() is False
    s.end_capture()


# ---------------------------------------------------------------- protocol, callbacks, events


# cupy: tests/cupy_tests/cuda_tests/test_stream.py::TestCUDAStreamProtocol::test_cuda_stream_method
def test_cuda_stream_protocol():
    s = runtime.Stream()
    result = s.__cuda_stream__()
    assert isinstance(result, tuple) and len(result) == 2
    assert result == (0, s.id)
    assert runtime.default_stream().__cuda_stream__() == (0, runtime.default_stream().id)


# cupy: tests/cupy_tests/cuda_tests/test_stream.py::TestExternalStream (test_get_and_add_callback,
# test_launch_host_func): a stream made elsewhere (here: a runtime.Stream, by its handle),
# used through the wrapper; the owner destroys it, the wrapper never does.
def test_external_stream_runs_work_on_the_wrapped_stream():
    owner = runtime.Stream()
    stream = runtime.ExternalStream(owner.id)
    assert stream.is_external and not owner.is_external
    assert stream == owner and stream.id == owner.id and stream.device == owner.device
    n = 100
    bufs = [runtime.to_device(np.full((2, 3), float(i))) for i in range(n)]
    out, hosts = [], []
    for i in range(n):
        host = np.empty((2, 3))
        runtime.memcpy_device_to_host_async(host, bufs[i], stream)
        hosts.append(host)
        stream.add_callback(lambda _, __, t: out.append(t[0]), (i, host))
    stream.synchronize(WAIT)
    assert out == list(range(n))
    assert [h[0, 0] for h in hosts] == [float(i) for i in range(n)]
    out.clear()
    for i in range(n):
        stream.launch_host_func(lambda t: out.append(t[0]), (i, None))
    stream.synchronize(WAIT)
    assert out == list(range(n))
    with pytest.raises(runtime.InvalidOperationError, match="never destroys"):
        stream.destroy()
    owner.destroy()


def test_external_stream_is_the_same_queue():
    owner = runtime.Stream(1)
    gate = threading.Event()
    log = []
    gate_on(owner, gate, log, "owner")
    ext = runtime.Stream.from_external(owner, device="npu:1")
    ext.launch_host_func(log.append, "wrapper")
    # Queued behind the owner's held work on the one stream: nothing ran yet.
    assert not ext.query() and not owner.query()
    gate.set()
    owner.synchronize(WAIT)
    assert log == ["owner", "wrapper"]
    assert ext.query()
    # CuPy's Stream.from_external(obj) with the __cuda_stream__ protocol.
    assert runtime.Stream.from_external(owner).id == owner.id

    class Foreign:
        def __cuda_stream__(self):
            return (0, owner.id)

    assert runtime.Stream.from_external(Foreign()) == owner
    owner.destroy()


# cupy: tests/cupy_tests/cuda_tests/test_stream.py::TestCUDAStreamProtocol
# (test_from_external_without_protocol, test_from_external_invalid_returns)
@pytest.mark.parametrize(
    "bad_return, match",
    [
        (123, "must return a 2-tuple"),
        ((0,), "must return a 2-tuple"),
        (("not_an_int", 0), r"must return \(int, int\)"),
        ((0, "not_an_int"), r"must return \(int, int\)"),
        ((1, 12345), "unsupported version"),
        ((-1, 12345), "unsupported version"),
    ],
)
def test_from_external_invalid_protocol_returns(bad_return, match):
    class Bad:
        def __cuda_stream__(self):
            return bad_return

    with pytest.raises(TypeError, match=match):
        runtime.Stream.from_external(Bad())


def test_from_external_refuses_unknown_handles_and_wrong_devices():
    with pytest.raises(TypeError, match="does not implement"):
        runtime.Stream.from_external(object())
    with pytest.raises(runtime.InvalidHandleError, match="no live stream"):
        runtime.ExternalStream(2**62)
    dead = runtime.Stream()
    dead.destroy()
    with pytest.raises(runtime.InvalidHandleError):
        runtime.ExternalStream(dead.id)
    s = runtime.Stream(0)
    with pytest.raises(ValueError, match="device"):
        runtime.ExternalStream(s.id, device=1)
    assert runtime.ExternalStream(s.id, device=0) == s


# cupy: tests/cupy_tests/cuda_tests/test_stream.py::TestStream::test_get_and_add_callback
def test_add_callback_runs_in_order_with_stream_and_status():
    n = 100
    s = runtime.Stream()
    out, streams, statuses = [], [], []

    def callback(stream, status, arg):
        out.append(arg[0])
        streams.append(stream)
        statuses.append(status)

    bufs = [runtime.to_device(np.full(6, float(i))) for i in range(n)]
    for i in range(n):
        host = np.empty(6)
        runtime.memcpy_device_to_host_async(host, bufs[i], s)
        s.add_callback(callback, (i, host))
    s.synchronize(WAIT)
    assert out == list(range(n))
    assert all(x is s for x in streams)
    assert statuses == [0] * n


# numba: numba/cuda/tests/cudadrv/test_streams.py::TestCudaStream::test_add_callback
def test_add_callback_numba_style():
    done = threading.Event()
    runtime.Stream().add_callback(lambda stream, status, ev: ev.set(), done)
    assert done.wait(WAIT)


# numba: numba/cuda/tests/cudadrv/test_streams.py::TestCudaStream::test_add_callback
# (``stream.add_callback(callback)`` with ``arg`` left out: the callback gets None)
def test_add_callback_without_its_argument_passes_none():
    got = []
    s = runtime.Stream()
    s.add_callback(lambda stream, status, arg: got.append((stream, status, arg)))
    s.synchronize(WAIT)
    assert got == [(s, 0, None)]


def test_add_callback_refuses_a_non_callable():
    with pytest.raises(TypeError, match="callback must be callable, got int"):
        runtime.Stream().add_callback(3, None)


# torch: test/test_cuda.py::TestCuda::test_stream_event_device
def test_record_event_given_or_new_and_event_device():
    e0 = runtime.Event()
    assert e0.device is None
    with runtime.Device(0):
        s0 = runtime.current_stream()
        assert s0.record_event(e0) is e0
    with runtime.Device(1):
        s1 = runtime.Stream()
        e1 = s1.record_event()
    assert s0.device == runtime.Device(0)
    assert e0.device == runtime.Device(0)
    assert s1.device == runtime.Device(1)
    assert e1.device == runtime.Device(1)
    assert e1.enable_timing is True
    assert s1.record_event(enable_timing=False).enable_timing is False


def test_record_event_orders_and_refuses_non_events():
    s = runtime.Stream()
    gate = threading.Event()
    gate_on(s, gate)
    e = runtime.Event()
    assert s.record_event(e) is e
    assert not e.query()
    gate.set()
    e.synchronize(WAIT)
    assert e.query()
    with pytest.raises(TypeError, match="event must be a runtime.Event or None"):
        s.record_event("x")


# numba: numba/cuda/cudadrv/driver.py Stream.auto_synchronize (context manager)
def test_auto_synchronize_waits_at_exit():
    s = runtime.Stream()
    gate, log = threading.Event(), []
    with s.auto_synchronize() as entered:
        assert entered is s
        gate_on(s, gate, log, "ran")
        assert not s.query()
        gate.set()
    assert log == ["ran"]
    assert s.query()


def test_auto_synchronize_skips_the_wait_when_the_block_raised():
    s = runtime.Stream()
    gate = threading.Event()
    with pytest.raises(ZeroDivisionError):
        with s.auto_synchronize():
            gate_on(s, gate)
            raise ZeroDivisionError
    assert not s.query()  # not waited for: the exception propagated at once
    gate.set()
    s.synchronize(WAIT)


def test_auto_synchronize_reports_a_kernel_error():
    s = runtime.Stream()

    def boom():
        raise ValueError("bad")

    with pytest.raises(runtime.KernelError, match="bad"):
        with s.auto_synchronize():
            s.launch_host_func(boom)


# ---------------------------------------------------------------- copy_to_host(out=, stream=)


# numba: numba/cuda/tests/cudadrv/test_cuda_ndarray.py::TestCudaNDArray::test_devicearray (copy_to_host into an array)
def test_copy_to_host_into_out():
    host = np.arange(12, dtype=np.float32).reshape(3, 4)
    d = runtime.to_device(host)
    out = np.zeros((3, 4), np.float32)
    got = d.copy_to_host(out)
    assert got is out
    np.testing.assert_array_equal(out, host)
    flat = np.zeros(12, np.float32)  # same element count, other shape: accepted
    d.copy_to_host(out=flat)
    np.testing.assert_array_equal(flat, host.ravel())
    assert d.to_host(np.zeros((3, 4), np.float32)).sum() == host.sum()


def test_copy_to_host_out_is_checked_and_left_alone_on_error():
    d = runtime.to_device(np.arange(4, dtype=np.float64))
    out = np.full(4, 7.0, np.float32)
    with pytest.raises(TypeError, match="dtype float32 does not match the buffer's dtype float64"):
        d.copy_to_host(out)
    assert (out == 7.0).all()
    with pytest.raises(ValueError, match="has 5 elements, the buffer has 4"):
        d.copy_to_host(np.zeros(5))
    with pytest.raises(ValueError, match="C-contiguous"):
        d.copy_to_host(np.zeros(8)[::2])
    ro = np.zeros(4)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        d.copy_to_host(ro)
    with pytest.raises(TypeError, match="out must be a numpy.ndarray, got list"):
        d.copy_to_host([0.0] * 4)


# numba: numba/cuda/tests/cudadrv/test_streams.py::TestCudaStream::test_parallel_tasks
def test_copy_to_host_on_a_stream_is_stream_ordered_and_asynchronous_into_pinned_memory():
    # CUDA's rule: into pageable memory the stream-ordered copy is complete when the call
    # returns (it waits for the held host function ahead of it); into pinned memory the call
    # returns at once and the stream writes the array when it reaches the copy.
    s = runtime.Stream()
    d = runtime.to_device(np.full(8, 3.0), stream=s)
    gate = threading.Event()
    gate_on(s, gate)
    threading.Timer(0.05, gate.set).start()
    out = np.zeros(8)
    assert d.copy_to_host(out, stream=s) is out
    np.testing.assert_array_equal(out, np.full(8, 3.0))
    fresh = d.copy_to_host(stream=s)
    np.testing.assert_array_equal(fresh, np.full(8, 3.0))

    pinned_gate = threading.Event()
    gate_on(s, pinned_gate)
    pinned = runtime.pinned_empty(8, "float64")
    pinned[:] = 0
    assert d.copy_to_host(pinned, stream=s) is pinned  # queued behind the held host function
    assert (pinned == 0).all()
    pinned_gate.set()
    s.synchronize(WAIT)
    np.testing.assert_array_equal(pinned, np.full(8, 3.0))


# ---------------------------------------------------------------- defer_cleanup


def _active():
    return runtime.memory_stats(0)["active_allocations"]


# numba: numba/cuda/tests/cudadrv/test_deallocations.py::TestDeferCleanup::test_context_manager
def test_defer_cleanup_holds_memory_until_the_outermost_exit():
    runtime.synchronize()
    base = _active()
    with runtime.defer_cleanup():
        a = runtime.empty(1024, np.float32)
        b = runtime.empty(1024, np.float32)
        assert _active() == base + 2
        del a
        runtime.device_free(b)
        with pytest.raises(runtime.InvalidHandleError):
            b.copy_to_host()  # the handle is freed at once
        assert _active() == base + 2  # the memory is not
        assert runtime._runtime._defer_state() == (1, 2)
        with runtime.defer_cleanup():
            c = runtime.empty(16)
            del c
            assert runtime._runtime._defer_state() == (2, 3)
        assert _active() == base + 3  # an inner exit frees nothing
    assert _active() == base
    assert runtime._runtime._defer_state() == (0, 0)
    # Outside any scope, deallocation is immediate again.
    x = runtime.empty(16)
    assert _active() == base + 1
    del x
    assert _active() == base


def test_defer_cleanup_exit_on_exception_still_frees():
    base = _active()
    with pytest.raises(KeyError):
        with runtime.defer_cleanup():
            a = runtime.empty(64)
            del a
            raise KeyError("x")
    assert _active() == base


# ---------------------------------------------------------------- Device ordering, uuid


# cupy: tests/cupy_tests/cuda_tests/test_device.py::TestDeviceComparison
def test_device_ordering_and_hashing():
    d0, d1 = runtime.Device(0), runtime.Device(1)
    assert d0 < d1 and d0 <= d1 and d1 > d0 and d1 >= d0
    assert not (d1 < d0) and d0 <= runtime.Device(0) and d0 >= runtime.Device(0)
    assert sorted([d1, d0, d1]) == [d0, d1, d1]
    assert max(runtime.get_available_devices()) == d1
    assert {d0: "a", runtime.Device(0): "b"} == {d0: "b"}
    assert hash(d0) == hash(runtime.Device(0))
    with pytest.raises(TypeError):
        _ = d0 < 1


# torch: test/test_cuda.py::TestCuda::test_uuid (torch.cuda.get_device_properties(i).uuid)
def test_device_uuid_is_stable_and_distinct():
    props = [runtime.get_device_properties(i) for i in range(2)]
    for i, p in enumerate(props):
        expect = uuid.uuid5(uuid.NAMESPACE_URL, f"runtime://{p.profile}/{i}")
        assert p.uuid == str(expect)
        assert uuid.UUID(p.uuid).version == 5
        assert p.to_dict()["uuid"] == p.uuid
    assert props[0].uuid != props[1].uuid
    assert runtime.Device(1).get_properties().uuid == props[1].uuid
