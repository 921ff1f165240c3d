"""CuPy's CUDA-layer tests (tests/cupy_tests/cuda_tests/) translated onto ``runtime``.

CuPy's ``cuda.Stream``/``cuda.Device``/``memory.alloc``/``MemoryPool`` map onto
``runtime.Stream``/``runtime.Device``/``runtime.device_malloc``/``memory_stats``; CuPy arrays
become typed device buffers and native kernels. Each test names its upstream test.
"""

from __future__ import annotations

import ctypes
import gc
import threading

import numpy as np
import pytest
from _support import WAIT, MiB

import runtime
from runtime import kernels


def _helper_arith(a, out, stream):
    """CuPy's _helper1 in native kernels: out = (a + 3) * 7.6, squared."""
    three = runtime.to_device(np.full(a.size, 3.0, np.float64))
    kernels.add(out, a, three, stream=stream)
    kernels.scale(out, out, 7.6, stream=stream)
    kernels.mul(out, out, out, stream=stream)
    return three


def _expected_arith(a):
    return ((a + 3) * 7.6) ** 2


# ---------------------------------------------------------------- test_stream.py


# cupy: tests/cupy_tests/cuda_tests/test_stream.py::TestStream::test_eq
def test_stream_eq():
    s1, s2 = runtime.Stream(), runtime.Stream()
    assert s1 == s1
    assert s1 != s2
    assert runtime.default_stream() == runtime.default_stream()
    assert runtime.default_stream() != s1
    assert runtime.default_stream(1) != runtime.default_stream(0)


# cupy: tests/cupy_tests/cuda_tests/test_stream.py::TestStream::test_hash
def test_stream_hash():
    s1, s2 = runtime.Stream(), runtime.Stream()
    mapping = {s1: 1, s2: 2, runtime.default_stream(): 3}
    assert mapping[s1] == 1 and mapping[s2] == 2
    assert mapping[runtime.default_stream()] == 3
    assert hash(s1) == hash(s1)


# cupy: tests/cupy_tests/cuda_tests/test_stream.py::TestStream::test_del
def test_stream_del_while_current():
    with runtime.Stream() as s:
        sid = s.id
        x = runtime.to_device(np.arange(3, dtype=np.int64), stream=s)
        done = s.record_event()
        del s
        gc.collect()
        assert runtime.current_stream().id == sid
    assert runtime.current_stream() == runtime.default_stream()
    # the dropped stream still runs its queued copy; the default stream does not wait for
    # other streams (no legacy-stream implicit sync), so wait on the event recorded after it
    done.synchronize(timeout=WAIT)
    np.testing.assert_array_equal(x.copy_to_host(), [0, 1, 2])


# cupy: tests/cupy_tests/cuda_tests/test_stream.py::TestStream::test_get_and_add_callback
def test_stream_get_and_add_callback():
    n = 100
    rng = np.random.default_rng(0)
    arrays = [rng.random((2, 3)) for _ in range(n)]
    devs = [runtime.to_device(a) for a in arrays]
    s = runtime.Stream()
    out, hosts = [], []
    for i in range(n):
        h = np.empty((2, 3))
        runtime.memcpy_device_to_host(h, devs[i], s)
        hosts.append(h)
        s.launch_host_func(lambda i=i, h=h: out.append((i, h.copy())))
    s.synchronize(timeout=WAIT)
    assert [i for i, _ in out] == list(range(n))
    for i, h in out:
        np.testing.assert_array_equal(h, arrays[i])


# cupy: tests/cupy_tests/cuda_tests/test_stream.py::TestStream::test_launch_host_func
def test_stream_launch_host_func_on_default_stream():
    s = runtime.default_stream()
    out = []
    for i in range(100):
        s.launch_host_func(out.append, i)
    s.synchronize(timeout=WAIT)
    assert out == list(range(100))


# cupy: tests/cupy_tests/cuda_tests/test_stream.py::TestStream::test_with_statement
def test_stream_with_statement():
    s1, s2 = runtime.Stream(), runtime.Stream()
    assert runtime.current_stream() == runtime.default_stream()
    with s1:
        assert runtime.current_stream() == s1
        with s2:
            assert runtime.current_stream() == s2
        assert runtime.current_stream() == s1
    assert runtime.current_stream() == runtime.default_stream()


# cupy: tests/cupy_tests/cuda_tests/test_stream.py::TestStream::test_use
def test_stream_use():
    s1 = runtime.Stream().use()
    assert runtime.current_stream() == s1
    runtime.default_stream().use()
    assert runtime.current_stream() == runtime.default_stream()


# cupy: tests/cupy_tests/cuda_tests/test_stream.py::TestStream::test_mix_use_context
def test_stream_mix_use_context():
    s1, s2, s3 = runtime.Stream(), runtime.Stream(), runtime.Stream()
    with s1:
        s2.use()
        assert runtime.current_stream() == s2
        with s3:
            assert runtime.current_stream() == s3
        assert runtime.current_stream() == s1
    assert runtime.current_stream() == runtime.default_stream()


# cupy: tests/cupy_tests/cuda_tests/test_stream.py::TestStream::test_per_device
def test_stream_per_device():
    with runtime.Device(0):
        s0 = runtime.Stream()
        with s0:
            assert runtime.current_stream() == s0
            with runtime.Device(1):
                assert runtime.current_stream() != s0
                assert runtime.current_stream() == runtime.default_stream(1)
                assert runtime.current_stream(0) == s0
            assert runtime.current_stream() == s0


# cupy: tests/cupy_tests/cuda_tests/test_stream.py::TestStream::test_per_device_failure
def test_stream_of_other_device_in_with():
    # CuPy refuses a stream of another device; runtime (like torch) switches to its device.
    s0 = runtime.Stream(0)
    with runtime.Device(1):
        with s0:
            assert runtime.get_device() == 0
            assert runtime.current_stream() == s0
        assert runtime.get_device() == 1


# cupy: tests/cupy_tests/cuda_tests/test_stream.py::TestStream::test_stream_thread
def test_stream_shared_between_threads():
    holder = {"s": None}
    barrier = threading.Barrier(2, timeout=WAIT)
    results = [None, None]

    def worker(tid):
        try:
            if tid == 0:
                holder["s"] = runtime.Stream()
            barrier.wait(WAIT)
            s = holder["s"]
            with s:
                barrier.wait(WAIT)
                x = runtime.to_device(np.arange(10, dtype=np.int64), stream=s)
                s.synchronize(timeout=WAIT)
            holder["s"] = None
            del s
            gc.collect()
            barrier.wait(WAIT)
            assert runtime.current_stream() == runtime.default_stream()
            results[tid] = x.copy_to_host().tolist()
        except Exception as e:  # pragma: no cover - reported below
            results[tid] = e

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert results == [list(range(10)), list(range(10))]


# cupy: tests/cupy_tests/cuda_tests/test_stream.py::TestStream::test_create_with_flags
def test_stream_create_with_flags():
    s1 = runtime.Stream()
    s2 = runtime.Stream(non_blocking=True)
    assert s1.is_non_blocking is False
    assert s2.is_non_blocking is True


# cupy: tests/cupy_tests/cuda_tests/test_stream.py::TestStream::test_create_with_priority
def test_stream_create_with_priority():
    low, high = runtime.stream_priority_range()
    assert (low, high) == (0, -3)
    assert runtime.Stream(priority=0).priority == 0
    assert runtime.Stream(priority=-1).priority == -1
    assert runtime.Stream(priority=-3).priority == -3
    with pytest.raises(ValueError, match="priority"):
        runtime.Stream(priority=-4)


# cupy: tests/cupy_tests/cuda_tests/test_stream.py::TestCUDAStreamProtocol::test_cuda_stream_method
def test_stream_protocol_method():
    s = runtime.Stream()
    version, handle = s.__cuda_stream__()
    assert version == 0
    assert handle == s.id


# ---------------------------------------------------------------- test_graph.py


# cupy: tests/cupy_tests/cuda_tests/test_graph.py::TestGraph::test_capture_run_on_same_stream
def test_graph_capture_run_on_same_stream(stream):
    host = np.random.default_rng(1).random(100)
    a = runtime.to_device(host)
    out = runtime.empty(100, np.float64)
    stream.begin_capture()
    keep = _helper_arith(a, out, stream)
    g = stream.end_capture()
    stream.synchronize(timeout=WAIT)
    np.testing.assert_array_equal(out.copy_to_host(), np.zeros(100))  # capture ran nothing
    g.launch(stream)
    stream.synchronize(timeout=WAIT)
    np.testing.assert_allclose(out.copy_to_host(), _expected_arith(host))
    del keep


# cupy: tests/cupy_tests/cuda_tests/test_graph.py::TestGraph::test_capture_run_on_different_streams
def test_graph_capture_run_on_different_streams():
    s1, s2 = runtime.Stream(), runtime.Stream()
    host = np.random.default_rng(2).random(100)
    a = runtime.to_device(host)
    out = runtime.empty(100, np.float64)
    s1.begin_capture()
    keep = _helper_arith(a, out, s1)
    g = s1.end_capture()
    g.launch(s2)
    s2.synchronize(timeout=WAIT)
    np.testing.assert_allclose(out.copy_to_host(), _expected_arith(host))
    del keep


# cupy: tests/cupy_tests/cuda_tests/test_graph.py::TestGraph::test_capture_run_on_different_streams
def test_graph_launch_on_other_device_stream_raises():
    s0, s1 = runtime.Stream(0), runtime.Stream(1)
    s0.begin_capture()
    s0.launch_kernel(kernels.noop, ())
    g = s0.end_capture()
    # runtime: the same error as a direct cross-device kernel launch (ValueError).
    with pytest.raises(ValueError, match="graph"):
        g.launch(s1)
    s1.synchronize(timeout=WAIT)


# cupy: tests/cupy_tests/cuda_tests/test_graph.py::TestGraph::test_stream_is_capturing
def test_graph_stream_is_capturing(stream):
    host = np.random.default_rng(3).random(100)
    a = runtime.to_device(host)
    b = runtime.empty(100, np.float64)
    stream.begin_capture()
    assert stream.is_capturing
    assert not runtime.default_stream().is_capturing
    kernels.scale(b, a, 3.0, stream=stream)
    g = stream.end_capture()
    assert not stream.is_capturing
    assert not runtime.default_stream().is_capturing
    g.launch(stream)
    stream.synchronize(timeout=WAIT)
    np.testing.assert_allclose(b.copy_to_host(), 3 * host)


# cupy: tests/cupy_tests/cuda_tests/test_graph.py::TestGraph::test_capture_launch_host_func
def test_graph_capture_launch_host_func(stream):
    counter = {"count": 0}

    def callback(c):
        c["count"] += 1

    stream.begin_capture()
    stream.launch_host_func(callback, counter)
    g = stream.end_capture()
    assert counter["count"] == 0
    g.launch(stream)
    stream.synchronize(timeout=WAIT)
    assert counter["count"] == 1
    g.launch(stream)
    stream.synchronize(timeout=WAIT)
    assert counter["count"] == 2


# cupy: tests/cupy_tests/cuda_tests/test_graph.py::TestGraph::test_stream_fork_join
def test_graph_stream_fork_join():
    s1, s2 = runtime.Stream(), runtime.Stream()
    e1, e2 = runtime.Event(), runtime.Event()
    a = runtime.to_device(np.full(100, 2.0))
    out1 = runtime.empty(100, np.float64)
    out2 = runtime.empty(100, np.float64)
    s1.begin_capture()
    kernels.scale(out1, a, 100.0, stream=s1)
    e1.record(s1)
    s2.wait_event(e1)
    kernels.scale(out2, out1, 3.0, stream=s2)
    e2.record(s2)
    s1.wait_event(e2)
    g = s1.end_capture()
    assert not s1.is_capturing and not s2.is_capturing
    s2.synchronize(timeout=WAIT)
    np.testing.assert_array_equal(out2.copy_to_host(), np.zeros(100))  # nothing ran yet
    g.launch(s1)
    s1.synchronize(timeout=WAIT)
    np.testing.assert_array_equal(out2.copy_to_host(), np.full(100, 600.0))


# cupy: tests/cupy_tests/cuda_tests/test_graph.py::TestGraph::test_null_stream_cannot_capture
def test_graph_default_stream_unaffected_by_capture(stream):
    # Differs from CuPy: the default stream is not CUDA's legacy stream, so asking it whether
    # it captures while another stream captures is legal and answers False.
    host = np.arange(100, dtype=np.float64)
    a = runtime.to_device(host)
    four = runtime.to_device(np.full(100, 4.0))
    b = runtime.empty(100, np.float64)
    stream.begin_capture()
    kernels.add(b, a, four, stream=stream)
    assert stream.is_capturing
    assert runtime.default_stream().is_capturing is False
    g = stream.end_capture()
    g.launch(stream)
    stream.synchronize(timeout=WAIT)
    np.testing.assert_array_equal(b.copy_to_host(), host + 4)


# cupy: tests/cupy_tests/cuda_tests/test_graph.py::TestGraph::test_stream_capture_failure1
def test_graph_synchronize_while_capturing_raises(stream):
    stream.begin_capture()
    with pytest.raises(RuntimeError):
        stream.synchronize(timeout=WAIT)
    stream.end_capture()
    assert not stream.is_capturing
    stream.synchronize(timeout=WAIT)


# cupy: tests/cupy_tests/cuda_tests/test_graph.py::TestGraph::test_stream_capture_failure2
def test_graph_end_capture_on_other_stream_raises(stream):
    other = runtime.Stream()
    stream.begin_capture()
    with pytest.raises(runtime.InvalidOperationError, match="not capturing"):
        other.end_capture()
    assert stream.is_capturing
    stream.end_capture()
    assert not stream.is_capturing and not other.is_capturing
    stream.synchronize(timeout=WAIT)
    other.synchronize(timeout=WAIT)


# cupy: tests/cupy_tests/cuda_tests/test_graph.py::TestGraph::test_stream_capture_failure3
def test_graph_begin_capture_twice_raises(stream):
    stream.begin_capture()
    with pytest.raises(runtime.InvalidOperationError, match="already capturing"):
        stream.begin_capture()
    g = stream.end_capture()
    assert len(g) == 0
    assert not stream.is_capturing


# cupy: tests/cupy_tests/cuda_tests/test_graph.py::TestGraph::test_stream_capture_failure4
def test_graph_query_while_capturing(stream):
    # Differs from CUDA/CuPy: querying a capturing stream does not invalidate the capture; it
    # reports the (empty) queue as done, and the capture stays usable.
    x = runtime.to_device(np.ones(8))
    stream.begin_capture()
    kernels.scale(x, x, 2.0, stream=stream)
    assert stream.query() is True
    g = stream.end_capture()
    g.launch(stream)
    stream.synchronize(timeout=WAIT)
    np.testing.assert_array_equal(x.copy_to_host(), np.full(8, 2.0))


# cupy: tests/cupy_tests/cuda_tests/test_graph.py::TestGraph::test_stream_capture_failure5
def test_graph_blocking_copy_while_capturing_raises():
    x = runtime.to_device(np.arange(4, dtype=np.float64))
    s = runtime.default_stream()
    host = np.zeros(4)
    s.begin_capture()
    try:
        with pytest.raises(RuntimeError):
            runtime.memcpy_device_to_host(host, x)
    finally:
        s.end_capture()


# cupy: tests/cupy_tests/cuda_tests/test_graph.py::TestGraph::test_stream_capture_failure6
def test_graph_barrier_while_capturing_raises(stream):
    with stream:
        stream.begin_capture()
        with pytest.raises(RuntimeError):
            runtime.stream_synchronize(timeout=WAIT)
        stream.end_capture()
    assert not stream.is_capturing
    stream.synchronize(timeout=WAIT)


# ---------------------------------------------------------------- test_device.py


# cupy: tests/cupy_tests/cuda_tests/test_device.py::TestDeviceComparison::test_equality
def test_device_equality():
    assert runtime.Device(0) == runtime.Device(0)
    assert runtime.Device(1) == runtime.Device(1)
    assert runtime.Device(0) != runtime.Device(1)
    assert not (runtime.Device(0) == 0)
    assert runtime.Device(0) != None  # noqa: E711 - the comparison is what is tested
    assert runtime.Device(0) != object()


# cupy: tests/cupy_tests/cuda_tests/test_device.py::TestDeviceComparison::test_lt_device
def test_device_lt():
    assert runtime.Device(0) < runtime.Device(1)
    assert not (runtime.Device(0) < runtime.Device(0))


# cupy: tests/cupy_tests/cuda_tests/test_device.py::TestDeviceComparison::test_le_device
def test_device_le():
    assert runtime.Device(0) <= runtime.Device(1)
    assert runtime.Device(0) <= runtime.Device(0)


# cupy: tests/cupy_tests/cuda_tests/test_device.py::TestDeviceComparison::test_gt_device
def test_device_gt():
    assert runtime.Device(1) > runtime.Device(0)
    assert not (runtime.Device(0) > runtime.Device(0))


# cupy: tests/cupy_tests/cuda_tests/test_device.py::TestDeviceComparison::test_ge_device
def test_device_ge():
    assert runtime.Device(1) >= runtime.Device(0)
    assert runtime.Device(0) >= runtime.Device(0)


# cupy: tests/cupy_tests/cuda_tests/test_device.py::TestDeviceComparison::test_comparison_other_type
@pytest.mark.parametrize("other", [0, 1, None, object()])
def test_device_comparison_other_type(other):
    d = runtime.Device(1)
    for op in ("__lt__", "__le__", "__gt__", "__ge__"):
        with pytest.raises(TypeError):
            getattr(__import__("operator"), op.strip("_"))(d, other)
        with pytest.raises(TypeError):
            getattr(__import__("operator"), op.strip("_"))(other, d)


# cupy: tests/cupy_tests/cuda_tests/test_device.py::TestDeviceAttributes::test_device_attributes
def test_device_attributes():
    props = runtime.Device(0).get_properties().to_dict()
    assert isinstance(props, dict)
    for key in ("name", "total_memory", "clock_rate", "cores", "fpeak", "memory_bandwidth"):
        assert key in props
    assert props["total_memory"] == 256 * MiB
    assert "Virtual" in props["name"]
    assert all(isinstance(props[k], int) for k in ("total_memory", "clock_rate", "cores"))


# cupy: tests/cupy_tests/cuda_tests/test_device.py::TestDeviceAttributes::test_device_attributes_error
def test_device_attributes_error():
    n = runtime.get_device_count()
    with pytest.raises(runtime.InvalidDeviceError):
        runtime.get_device_properties(n)
    with pytest.raises(RuntimeError):
        runtime.Device(n)


# cupy: tests/cupy_tests/cuda_tests/test_device.py::TestDeviceFromPointer::test_from_pointer
def test_device_from_buffer():
    assert runtime.empty(1, np.float64).device == runtime.Device(0)
    assert runtime.device_malloc(2, 16).device.index == 2


# cupy: tests/cupy_tests/cuda_tests/test_device.py::TestDeviceSwitch::test_use
def test_device_switch_use():
    runtime.set_device(1)
    assert runtime.get_device() == 1
    runtime.set_device(runtime.Device(0))
    assert runtime.get_device() == 0


# cupy: tests/cupy_tests/cuda_tests/test_device.py::TestDeviceSwitch::test_context
def test_device_switch_context():
    with runtime.Device(0):
        assert runtime.get_device() == 0
        with runtime.Device(1):
            assert runtime.get_device() == 1
        assert runtime.get_device() == 0


# cupy: tests/cupy_tests/cuda_tests/test_device.py::TestDeviceSwitch::test_context_and_use
def test_device_switch_context_and_use():
    runtime.set_device(1)
    with runtime.Device(0):
        assert runtime.get_device() == 0
        runtime.set_device(1)
        with runtime.Device(1):
            assert runtime.get_device() == 1
        assert runtime.get_device() == 1
    assert runtime.get_device() == 1


# cupy: tests/cupy_tests/cuda_tests/test_device.py::TestDeviceSwitch::test_thread_safe
def test_device_switch_thread_safe():
    t0_setup, t1_setup, t0_first_exit = threading.Event(), threading.Event(), threading.Event()
    t0_exit, t1_exit = [], []

    def t0_seq():
        with runtime.Device(0):
            with runtime.Device(0):
                t0_setup.set()
                t1_setup.wait(WAIT)
            t0_exit.append(runtime.get_device())
            t0_first_exit.set()

    def t1_seq():
        t0_setup.wait(WAIT)
        with runtime.Device(1):
            with runtime.Device(0):
                t1_setup.set()
                t0_first_exit.wait(WAIT)
            t1_exit.append(runtime.get_device())

    t1 = threading.Thread(target=t1_seq)
    t1.start()
    t0_seq()
    t1.join(WAIT)
    assert t0_exit == [0]
    assert t1_exit == [1]


# cupy: tests/cupy_tests/cuda_tests/test_device.py::TestDeviceSwitch::test_invalid
def test_device_switch_invalid():
    # Differs from CuPy: Device(100) is refused when constructed, not when first used.
    with pytest.raises(runtime.InvalidDeviceError):
        runtime.Device(100)
    with pytest.raises(runtime.InvalidDeviceError):
        runtime.set_device(100)
    with runtime.Device(0):
        assert runtime.get_device() == 0


# ---------------------------------------------------------------- test_memory.py


# cupy: tests/cupy_tests/cuda_tests/test_memory.py::TestMemoryPointer::test_int
def test_memory_pointer_int():
    buf = runtime.device_malloc(0, 1)
    assert isinstance(buf.ptr, int) and buf.ptr != 0


# cupy: tests/cupy_tests/cuda_tests/test_memory.py::TestMemoryPointer::test_add
def test_memory_pointer_add():
    buf = runtime.device_malloc(0, 8)
    part = buf.view(np.uint8, 4, offset=4)
    assert part.ptr == buf.ptr + 4
    assert part.offset == 4 and part.nbytes == 4
    for moved in (buf + 4, 4 + buf):
        assert moved.ptr == buf.ptr + 4 and moved.nbytes == 4
    assert ((buf + 4) - 4).ptr == buf.ptr


# cupy: tests/cupy_tests/cuda_tests/test_memory.py::TestMemoryPointer::test_copy_to_and_from_host
def test_memory_copy_to_and_from_host():
    a_gpu = runtime.device_malloc(0, 4)
    a_cpu = ctypes.c_int(100)
    runtime.memcpy_host_to_device(a_gpu, a_cpu, count=4)
    b_cpu = ctypes.c_int()
    runtime.memcpy_device_to_host(b_cpu, a_gpu, count=4)
    assert b_cpu.value == 100


# cupy: tests/cupy_tests/cuda_tests/test_memory.py::TestMemoryPointer::test_copy_from_device
def test_memory_copy_from_device():
    a_gpu = runtime.device_malloc(0, 4)
    runtime.memcpy_host_to_device(a_gpu, ctypes.c_int(100), count=4)
    b_gpu = runtime.device_malloc(0, 4)
    runtime.memcpy_d2d(b_gpu, a_gpu, count=4)
    b_cpu = ctypes.c_int()
    runtime.memcpy_device_to_host(b_cpu, b_gpu, count=4)
    assert b_cpu.value == 100


# cupy: tests/cupy_tests/cuda_tests/test_memory.py::TestMemoryPointer::test_memset
def test_memory_memset():
    a_gpu = runtime.device_malloc(0, 4)
    runtime.memset(a_gpu, 1, 4)
    for i in range(4):
        one = bytearray(1)
        runtime.memcpy_device_to_host(one, a_gpu, count=1, src_offset=i)
        assert one[0] == 1


# cupy: tests/cupy_tests/cuda_tests/test_memory.py::TestMemoryPointerAsync::test_copy_to_and_from_host_async
@pytest.mark.parametrize("use_streams", [True, False])
def test_memory_copy_to_and_from_host_async(use_streams):
    s = runtime.Stream() if use_streams else runtime.current_stream()
    a_gpu = runtime.device_malloc(0, 4)
    a_cpu = ctypes.c_int(100)
    runtime.memcpy_host_to_device_async(a_gpu, a_cpu, s, count=4)
    b_cpu = ctypes.c_int()
    runtime.memcpy_device_to_host_async(b_cpu, a_gpu, s, count=4)
    s.synchronize(timeout=WAIT)
    assert b_cpu.value == 100


# cupy: tests/cupy_tests/cuda_tests/test_memory.py::TestMemoryPointerAsync::test_copy_from_device_async
@pytest.mark.parametrize("use_streams", [True, False])
def test_memory_copy_from_device_async(use_streams):
    s = runtime.Stream() if use_streams else runtime.current_stream()
    a_gpu = runtime.device_malloc(0, 4)
    runtime.memcpy_host_to_device_async(a_gpu, ctypes.c_int(100), s, count=4)
    b_gpu = runtime.device_malloc(0, 4)
    runtime.memcpy_d2d_async(b_gpu, a_gpu, s, count=4)
    b_cpu = ctypes.c_int()
    runtime.memcpy_device_to_host_async(b_cpu, b_gpu, s, count=4)
    s.synchronize(timeout=WAIT)
    assert b_cpu.value == 100


# cupy: tests/cupy_tests/cuda_tests/test_memory.py::TestSingleDeviceMemoryPool::test_alloc
def test_pool_alloc_distinct():
    unit = MiB
    p1 = runtime.device_malloc(0, 4 * unit)
    p2 = runtime.device_malloc(0, 4 * unit)
    p3 = runtime.device_malloc(0, 8 * unit)
    assert len({p1.ptr, p2.ptr, p3.ptr}) == 3


# cupy: tests/cupy_tests/cuda_tests/test_memory.py::TestSingleDeviceMemoryPool::test_free
def test_pool_free_reuses_cached_blocks():
    # Differs from CuPy: the next same-size request may get another cached block, not the one
    # just freed; reuse shows in cache_hits and a bounded reserved size, not pointer equality.
    runtime.set_option("enableMemoryReuse", True)
    for _ in range(64):
        p = runtime.device_malloc(0, 4 * MiB)
        runtime.device_free(p)
    stats = runtime.memory_stats(0)
    assert stats["cache_hits"] > 0
    assert stats["num_ooms"] == 0
    assert stats["reserved"] < 64 * 4 * MiB
    assert stats["allocated"] == 0


# cupy: tests/cupy_tests/cuda_tests/test_memory.py::TestSingleDeviceMemoryPool::test_free_different_size
def test_pool_free_different_size():
    runtime.set_option("enableMemoryReuse", True)
    p1 = runtime.device_malloc(0, 4 * MiB)
    ptr1 = p1.ptr
    runtime.device_free(p1)
    p2 = runtime.device_malloc(0, 8 * MiB)
    assert p2.ptr != ptr1


# cupy: tests/cupy_tests/cuda_tests/test_memory.py::TestSingleDeviceMemoryPool::test_free_all_blocks
def test_pool_free_all_blocks():
    runtime.set_option("enableMemoryReuse", True)
    p1 = runtime.device_malloc(0, 4 * MiB)
    runtime.device_free(p1)
    assert runtime.memory_stats(0)["cached"] == 4 * MiB
    runtime.empty_cache(0)
    stats = runtime.memory_stats(0)
    assert stats["cached"] == 0 and stats["reserved"] == 0


# cupy: tests/cupy_tests/cuda_tests/test_memory.py::TestSingleDeviceMemoryPool::test_used_bytes
def test_pool_used_bytes():
    def used():
        return runtime.memory_stats(0)["allocated"]

    p1 = runtime.device_malloc(0, 2 * MiB)
    assert used() == 2 * MiB
    p2 = runtime.device_malloc(0, 4 * MiB)
    assert used() == 6 * MiB
    runtime.device_free(p2)
    assert used() == 2 * MiB
    runtime.device_free(p1)
    assert used() == 0
    p3 = runtime.device_malloc(0, MiB)
    assert used() == MiB
    del p3


# cupy: tests/cupy_tests/cuda_tests/test_memory.py::TestSingleDeviceMemoryPool::test_free_bytes
def test_pool_free_bytes():
    runtime.set_option("enableMemoryReuse", True)

    def cached():
        return runtime.memory_stats(0)["cached"]

    p1 = runtime.device_malloc(0, 2 * MiB)
    assert cached() == 0
    p2 = runtime.device_malloc(0, 4 * MiB)
    assert cached() == 0
    runtime.device_free(p2)
    assert cached() == 4 * MiB
    runtime.device_free(p1)
    assert cached() == 6 * MiB


# cupy: tests/cupy_tests/cuda_tests/test_memory.py::TestSingleDeviceMemoryPool::test_total_bytes
def test_pool_total_bytes():
    runtime.set_option("enableMemoryReuse", True)

    def stats():
        return runtime.memory_stats(0)

    p1 = runtime.device_malloc(0, 2 * MiB)
    assert stats()["reserved"] == 2 * MiB
    p2 = runtime.device_malloc(0, 4 * MiB)
    assert stats()["reserved"] == 6 * MiB
    runtime.device_free(p1)
    assert stats()["reserved"] == 6 * MiB
    runtime.device_free(p2)
    assert stats()["reserved"] == 6 * MiB
    s = stats()
    assert s["allocated"] + s["cached"] == s["reserved"]
    runtime.empty_cache(0)
    assert stats()["reserved"] == 0


# cupy: tests/cupy_tests/cuda_tests/test_memory.py::TestSingleDeviceMemoryPool::test_alloc_limit
def test_pool_alloc_limit():
    # The device capacity (256 MiB here) plays the pool limit.
    p1 = runtime.device_malloc(0, 160 * MiB)
    p2 = runtime.device_malloc(0, 64 * MiB)
    with pytest.raises(runtime.OutOfMemoryError):
        runtime.device_malloc(0, 64 * MiB)
    runtime.device_free(p2)
    p3 = runtime.device_malloc(0, 64 * MiB)
    assert p3.nbytes == 64 * MiB
    del p1


# cupy: tests/cupy_tests/cuda_tests/test_memory.py::TestSingleDeviceMemoryPool::test_alloc_limit_fragmented
def test_pool_alloc_limit_fragmented():
    a = runtime.device_malloc(0, 100 * MiB)
    b = runtime.device_malloc(0, 100 * MiB)
    runtime.device_free(a)
    stats = runtime.memory_stats(0)
    # The freed block may stay cached (reserved); free + cached is what an allocation can use.
    assert stats["free"] + stats["cached"] >= 150 * MiB
    c = runtime.device_malloc(0, 150 * MiB)
    assert c.nbytes == 150 * MiB
    del b


# cupy: tests/cupy_tests/cuda_tests/test_memory.py::TestMemoryPool::test_zero_size_alloc
def test_pool_zero_size_alloc():
    buf = runtime.device_malloc(0, 0)
    assert buf.nbytes == 0
    assert buf.device.index == 0
    runtime.device_free(buf)


# cupy: tests/cupy_tests/cuda_tests/test_memory.py::TestMemoryPool::test_double_free
def test_pool_double_free_raises():
    # Differs from CuPy (a second free is a no-op): runtime refuses it.
    buf = runtime.device_malloc(0, 1)
    runtime.device_free(buf)
    with pytest.raises(runtime.InvalidHandleError, match="freed"):
        runtime.device_free(buf)
    assert buf.freed


# cupy: tests/cupy_tests/cuda_tests/test_memory.py::TestMemoryPool::test_free_all_blocks_without_malloc
def test_pool_free_all_blocks_without_malloc():
    runtime.empty_cache()
    stats = runtime.memory_stats(0)
    # free_blocks counts blocks held free in the caches: none after empty_cache.
    assert stats["cached"] == 0 and stats["free_blocks"] == 0
    assert stats["largest_free_block"] == stats["free"]


# cupy: tests/cupy_tests/cuda_tests/test_memory.py::TestMemoryPool::test_used_bytes
def test_pool_fresh_counters_are_zero():
    stats = runtime.memory_stats(0)
    assert stats["allocated"] == 0
    assert stats["cached"] == 0
    assert stats["reserved"] == 0
    assert stats["free"] == stats["total"] == 256 * MiB


# cupy: tests/cupy_tests/cuda_tests/test_memory.py::TestMemInfo::test_mem_info
def test_mem_info():
    info = runtime.get_device_memory_info(0)
    assert isinstance(info.free, int) and isinstance(info.total, int)
    assert info.total == 256 * MiB
    assert 0 < info.free <= info.total
    buf = runtime.device_malloc(0, 16 * MiB)
    assert runtime.get_device_memory_info(0).free == info.free - 16 * MiB
    del buf


# cupy: tests/cupy_tests/cuda_tests/test_pinned_memory.py::TestSingleDeviceMemoryPool::test_alloc
def test_pinned_alloc():
    p1 = runtime.malloc_host(4096)
    p2 = runtime.malloc_host(4096)
    assert p1.ptr != p2.ptr
