"""PyTorch's ``test/test_cuda.py`` (and ``test/test_cuda_multigpu.py``) translated onto ``runtime``.

``torch.cuda.Stream``/``Event``/``CUDAGraph`` and the caching allocator's statistics map onto
``runtime.Stream``/``Event``/``begin_capture``-``end_capture`` and ``memory_stats``; tensors
become typed device buffers and native kernels; ``torch.cuda._sleep`` becomes a host function
that holds the stream until the test releases it (no timing assumptions).
"""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest
from _support import WAIT, MiB, gate

import runtime
from runtime import kernels

# ---------------------------------------------------------------- memory


# torch: test/test_cuda.py::TestCuda::test_memory_allocation
def test_memory_allocation():
    prev = runtime.memory_allocated()
    mem = runtime.device_malloc(0, 1)
    assert runtime.memory_allocated() > prev
    runtime.device_free(mem)
    assert runtime.memory_allocated() == prev


# torch: test/test_cuda.py::TestCuda::test_memory_stats
def test_memory_stats():
    runtime.empty_cache()
    runtime.reset_peak_memory_stats()
    before = runtime.memory_stats()
    assert before["allocated"] == before["peak_allocated"]
    assert before["reserved"] == before["peak_reserved"]
    tmp = runtime.empty(256, np.float32)  # 1 kB
    assert runtime.memory_stats()["requested"] == before["requested"] + 1024
    frees = runtime.memory_stats()["num_frees"]
    del tmp
    gc.collect()
    runtime.empty_cache()
    after = runtime.memory_stats()
    assert after["requested"] == before["requested"]
    assert after["num_frees"] == frees + 1
    assert after["peak_allocated"] >= 1024
    runtime.reset_peak_memory_stats()
    assert runtime.memory_stats()["peak_allocated"] == before["peak_allocated"]
    assert runtime.memory_stats()["peak_reserved"] == before["peak_reserved"]


# torch: test/test_cuda.py::TestCuda::test_cuda_get_device_name
def test_get_device_name():
    current = runtime.get_device()
    assert runtime.get_device_name(current) == runtime.get_device_name(None)
    assert runtime.get_device_name() == runtime.get_device_properties(current).name


# torch: test/test_cuda.py::TestCuda::test_cuda_get_device_properties
def test_get_device_properties_of_current_device():
    runtime.set_device(2)
    current = runtime.get_device()
    props = runtime.get_device_properties(current)
    assert props.index == 2
    assert props.to_dict() == runtime.Device(current).get_properties().to_dict()
    # torch: None (or no argument) means the current device
    assert runtime.get_device_properties(None).index == 2
    assert runtime.get_device_properties().to_dict() == props.to_dict()


# torch: test/test_cuda.py::TestCuda::test_out_of_memory
def test_out_of_memory():
    tensor = runtime.empty(1024, np.float32)
    with pytest.raises(runtime.OutOfMemoryError, match="tried to allocate") as info:
        runtime.device_malloc(0, 1 << 40)
    assert isinstance(info.value, MemoryError) and isinstance(info.value, RuntimeError)
    assert str(256 * MiB) in str(info.value)  # total capacity in the message
    # the failure does not disturb later work
    kernels.fill(tensor, 1.0, stream=runtime.current_stream())
    runtime.current_stream().synchronize(timeout=WAIT)
    assert (tensor.copy_to_host() == 1).all()


# torch: test/test_cuda.py::TestCuda::test_out_of_memory_retry
def test_out_of_memory_retry():
    runtime.empty_cache()
    size = runtime.get_device_properties(0).total_memory * 6 // 10
    a = runtime.device_malloc(0, size)
    with pytest.raises(runtime.OutOfMemoryError, match="tried to allocate"):
        runtime.device_malloc(0, size)
    del a
    gc.collect()
    b = runtime.device_malloc(0, size)
    assert b.nbytes == size
    assert runtime.memory_stats(0)["num_ooms"] == 1


# torch: test/test_cuda.py::TestCuda::test_set_per_process_memory_fraction
def test_set_per_process_memory_fraction():
    runtime.set_per_process_memory_fraction(0.5, 0)
    with pytest.raises(runtime.OutOfMemoryError):
        runtime.device_malloc(0, runtime.get_device_properties(0).total_memory // 2 + 1)


# torch: test/test_cuda.py::TestCuda::test_mem_get_info
def test_mem_get_info():
    free0, total0 = runtime.mem_get_info(0)
    buf = runtime.device_malloc(0, 8 * MiB)
    free1, total1 = runtime.mem_get_info(0)
    assert total0 == total1 and free1 == free0 - 8 * MiB
    del buf


# torch: test/test_cuda.py::TestCuda::test_host_memory_stats
def test_host_memory_stats():
    assert runtime.host_memory_stats()["allocations.current"] == 0


# torch: test/test_cuda.py::TestCuda::test_caching_pinned_memory
def test_caching_pinned_memory():
    t = runtime.malloc_host(4)
    ptr = t.ptr
    del t
    assert runtime.malloc_host(4).ptr == ptr


# torch: test/test_cuda.py::TestCuda::test_record_stream
def test_record_stream_freed_block_not_reused_while_queued():
    # runtime needs no record_stream: a freed buffer that queued work still reads is kept
    # until that work ran.
    s = runtime.Stream()
    hold, release = gate()
    tmp = runtime.to_device(np.array([1, 2, 3, 4], np.float32))
    result = runtime.empty(4, np.float32)
    ptr = tmp.ptr
    s.launch_host_func(hold)
    runtime.memcpy_d2d(result, tmp, s)
    runtime.device_free(tmp)
    tmp2 = runtime.empty(4, np.float32)
    assert tmp2.ptr != ptr, "allocation reused too soon"
    release()
    s.synchronize(timeout=WAIT)
    assert result.copy_to_host().tolist() == [1, 2, 3, 4]


# torch: test/test_cuda.py::TestCuda::test_record_stream_on_shifted_view
def test_record_stream_on_shifted_view():
    s = runtime.Stream()
    hold, release = gate()
    base = runtime.to_device(np.arange(10, dtype=np.float32))
    view = base.view(np.float32, 5, offset=20)
    assert view.offset > 0
    out = runtime.empty(5, np.float32)
    s.launch_host_func(hold)
    runtime.memcpy_d2d(out, view, s)
    lo, hi = base.ptr, base.ptr + base.nbytes
    del base, view
    gc.collect()
    again = runtime.empty(10, np.float32)
    assert not (lo <= again.ptr < hi)
    release()
    s.synchronize(timeout=WAIT)
    assert out.copy_to_host().tolist() == [5, 6, 7, 8, 9]


# torch: test/test_cuda.py::TestCuda::test_caching_allocator_record_stream_oom
def test_caching_allocator_record_stream_oom():
    s = runtime.Stream()
    y = runtime.empty(8 * MiB, np.float32)  # 32 MiB
    try:
        for _ in range(60):  # 60 x 32 MiB through a 256 MiB device
            x = runtime.empty(8 * MiB, np.float32)
            kernels.add(y, y, x, stream=s)
            runtime.device_free(x)
    finally:
        s.synchronize(timeout=WAIT)
    assert (y.copy_to_host() == 0).all()


# ---------------------------------------------------------------- copies


# torch: test/test_cuda.py::TestCuda::test_copy_non_blocking
def test_copy_non_blocking():
    s = runtime.current_stream()
    n = 10_000_000
    x = runtime.empty(n, np.uint8)
    y = np.ones(n, np.uint8)
    event = runtime.Event()
    runtime.memcpy_host_to_device_async(x, y, s)
    event.record(s)
    event.synchronize(timeout=WAIT)
    assert (x.copy_to_host() == 1).all()

    back = np.zeros(n, np.uint8)
    runtime.memcpy_device_to_host_async(back, x, s)
    event.record(s)
    event.synchronize(timeout=WAIT)
    assert (back == 1).all()

    # a host destination starting one byte into its base array
    base = np.zeros(n, np.uint8)
    runtime.memcpy_device_to_host_async(base[1:], x, s, count=n - 1)
    event.record(s)
    event.synchronize(timeout=WAIT)
    assert base[0] == 0 and (base[1:] == 1).all()


# torch: test/test_cuda.py::TestCuda::test_to_non_blocking
def test_to_non_blocking():
    s = runtime.Stream()
    hold, release = gate()
    src = runtime.to_device(np.random.default_rng(0).standard_normal(100_000))
    # torch's non_blocking copy to the CPU lands in pinned memory; into pageable memory a
    # queued copy is complete on return (CUDA's rule, test_copy.py).
    dst = runtime.pinned_empty(100_000, "float64")
    s.launch_host_func(hold)
    runtime.memcpy_device_to_host_async(dst, src, s)
    assert s.query() is False
    release()
    s.synchronize(timeout=WAIT)
    np.testing.assert_array_equal(dst, src.copy_to_host())


# torch: test/test_cuda.py::TestCuda::test_to_cpu_blocking_by_default
def test_to_cpu_blocking_by_default():
    src = runtime.to_device(np.random.default_rng(1).standard_normal(100_000))
    dst = np.zeros(100_000)
    runtime.memcpy_device_to_host(dst, src)
    assert runtime.current_stream().query() is True
    np.testing.assert_array_equal(dst, np.asarray(src))


# ---------------------------------------------------------------- streams


# torch: test/test_cuda.py::TestCuda::test_streams
def test_streams():
    default = runtime.current_stream()
    user = runtime.Stream()
    assert runtime.current_stream() == default
    assert default != user
    assert default.is_default and not user.is_default
    with user:
        assert runtime.current_stream() == user
    assert user.query()
    default.synchronize(timeout=WAIT)
    assert default.query()


# torch: test/test_cuda.py::TestCuda::test_stream_event_repr
def test_stream_event_repr():
    s = runtime.current_stream()
    assert "runtime.Stream" in repr(s)
    e = runtime.Event()
    assert "runtime.Event" in repr(e)
    e.record(s)
    assert "runtime.Event" in repr(e)


# torch: test/test_cuda.py::TestCuda::test_stream_compatibility
def test_stream_current_of_invalid_device():
    with pytest.raises(runtime.InvalidDeviceError, match="out of range"):
        runtime.current_stream(runtime.get_device_count())


# torch: test/test_cuda.py::TestCuda::test_device_context_manager
def test_device_context_manager():
    prev = runtime.get_device()
    with runtime.Device(0):
        assert runtime.get_device() == 0
    assert runtime.get_device() == prev


# torch: test/test_cuda.py::TestCuda::test_multi_device_context_manager
def test_multi_device_context_manager():
    runtime.set_device(0)
    with runtime.Device(1):
        assert runtime.get_device() == 1
    assert runtime.get_device() == 0


# torch: test/test_cuda.py::TestCuda::test_stream_context_manager
def test_stream_context_manager():
    prev = runtime.current_stream()
    with runtime.Stream() as s:
        assert runtime.current_stream() == s
    assert runtime.current_stream() == prev


# torch: test/test_cuda.py::TestCuda::test_multi_device_stream_context_manager
def test_multi_device_stream_context_manager():
    runtime.set_device(0)
    src_prev = runtime.current_stream(0)
    dst_prev = runtime.current_stream(1)
    with runtime.Stream(1) as dst:
        assert runtime.get_device() == 1
        assert runtime.current_stream() == dst
        assert runtime.current_stream(0) == src_prev
    assert runtime.get_device() == 0
    assert runtime.current_stream() == src_prev
    assert runtime.current_stream(1) == dst_prev


# torch: test/test_cuda_multigpu.py::TestCudaMultiGPU::test_current_stream
def test_current_stream_per_device():
    d0_default, d1_default = runtime.default_stream(0), runtime.default_stream(1)
    assert runtime.current_stream(0) == d0_default
    assert runtime.current_stream(1) == d1_default
    assert d0_default.device.index == 0 and d1_default.device.index == 1
    with runtime.Device(1):
        assert runtime.current_stream() == d1_default
        assert runtime.current_stream(0) == d0_default
    with pytest.raises(runtime.InvalidDeviceError):
        runtime.current_stream(runtime.get_device_count())


# torch: test/test_cuda_multigpu.py::TestCudaMultiGPU::test_default_stream
def test_default_stream_per_device():
    with runtime.Device(0):
        s0 = runtime.Stream()
    with runtime.Device(1):
        s1 = runtime.Stream()
    assert s0.device.index == 0 and s1.device.index == 1
    with runtime.Device(1):
        assert runtime.default_stream() == runtime.default_stream(1)
        assert runtime.default_stream() != s1
    assert runtime.default_stream(0).is_default


# torch: test/test_cuda.py::TestCuda::test_cuda_synchronize
def test_synchronize():
    runtime.synchronize()
    runtime.synchronize(0)
    runtime.synchronize(runtime.Device(1))
    # torch raises ValueError ("Expected a cuda device, but got: cpu") from _get_device_index.
    with pytest.raises(ValueError, match="cpu"):
        runtime.synchronize("cpu")
    runtime.synchronize("cuda:0")
    with pytest.raises(runtime.InvalidDeviceError):
        runtime.synchronize(runtime.get_device_count())


# torch: test/test_cuda.py::TestCuda::test_streams (query/synchronize after completion)
def test_stream_query_after_last_event_completed():
    # Before the fix the race showed in about 1 of 60 rounds on one reused stream (2-core
    # machine); 10,000 rounds keep it caught while costing about a second.
    s = runtime.Stream()
    for _ in range(10_000):
        s.launch_kernel(kernels.noop, ())
        e = runtime.Event()
        e.record(s)
        e.synchronize(timeout=WAIT)
        assert e.query()
        assert s.query(), "stream not done although the event it recorded last has completed"


# ---------------------------------------------------------------- events


# torch: test/test_cuda.py::TestCuda::test_events
def test_events():
    s = runtime.current_stream()
    event = runtime.Event(enable_timing=True)
    assert event.query()
    start = runtime.Event(enable_timing=True)
    start.record(s)
    hold, release = gate()
    s.launch_host_func(hold)
    event.record(s)
    assert not event.query()
    release()
    event.synchronize(timeout=WAIT)
    assert event.query()
    assert start.elapsed_time(event) >= 0


# torch: test/test_cuda.py::TestCuda::test_events_elapsedtime
def test_events_elapsedtime():
    e1, e2 = runtime.Event(enable_timing=False), runtime.Event(enable_timing=False)
    e1.record()
    e2.record()
    e2.synchronize(timeout=WAIT)
    with pytest.raises(runtime.InvalidOperationError, match="enable_timing"):
        e1.elapsed_time(e2)
    t1, t2 = runtime.Event(enable_timing=True), runtime.Event(enable_timing=True)
    with pytest.raises(runtime.InvalidOperationError, match="never recorded"):
        t1.elapsed_time(t2)
    # Differs from torch (default enable_timing=False): runtime's Event() times by default.
    d1, d2 = runtime.Event(), runtime.Event()
    assert d1.enable_timing and d2.enable_timing
    d1.record()
    d2.record()
    d2.synchronize(timeout=WAIT)
    assert d1.elapsed_time(d2) >= 0


# torch: test/test_cuda.py::TestCuda::test_generic_stream_event
def test_generic_stream_event():
    s = runtime.Stream()
    assert s.device.index == runtime.get_device()
    assert s.id != runtime.current_stream().id
    e1, e2 = runtime.Event(), runtime.Event()
    a_host = np.random.default_rng(2).standard_normal(1000)
    b_host = np.random.default_rng(3).standard_normal(1000)
    with s:
        a = runtime.to_device(a_host, stream=s)
        b = runtime.to_device(b_host, stream=s)
        assert runtime.current_stream().id == s.id
    e1.record(s)
    e1.synchronize(timeout=WAIT)
    assert e1.query()
    c = runtime.empty(1000, np.float64)
    kernels.add(c, a, b, stream=runtime.current_stream())
    e2.record()
    e2.synchronize(timeout=WAIT)
    assert e2.query()
    assert e1.id != e2.id
    np.testing.assert_allclose(c.copy_to_host(), a_host + b_host)
    assert e1.elapsed_time(e2) >= 0


# torch: test/test_cuda_multigpu.py::TestCudaMultiGPU::test_events_wait
def test_events_wait():
    s0, s1 = runtime.default_stream(0), runtime.default_stream(1)
    hold, release = gate()
    s0.launch_host_func(hold)
    e0 = runtime.Event()
    e0.record(s0)
    assert not s0.query()
    assert s1.query()
    s1.wait_event(e0)
    release()
    s1.synchronize(timeout=WAIT)
    assert e0.query()
    assert s0.query()
    assert s1.query()


# torch: test/test_cuda_multigpu.py::TestCudaMultiGPU::test_events_multi_gpu_query
def test_events_multi_gpu_query():
    s0, s1 = runtime.Stream(0), runtime.Stream(1)
    e0 = s0.record_event()
    e0.synchronize(timeout=WAIT)
    hold, release = gate()
    s1.launch_host_func(hold)
    e1 = s1.record_event()
    assert e0.query()
    assert not e1.query()
    release()
    e1.synchronize(timeout=WAIT)
    assert e0.query() and e1.query()


# torch: test/test_cuda_multigpu.py::TestCudaMultiGPU::test_events_multi_gpu_elapsed_time
def test_events_multi_gpu_elapsed_time():
    # Differs from CUDA/torch (which refuse): all devices share one clock, so events of
    # different devices can be compared.
    e0 = runtime.Stream(0).record_event()
    e0.synchronize(timeout=WAIT)
    s1 = runtime.Stream(1)
    s1.launch_host_func(lambda: None)
    e1 = s1.record_event()
    e1.synchronize(timeout=WAIT)
    assert e0.elapsed_time(e1) >= 0
    assert e1.elapsed_time(e0) == pytest.approx(-e0.elapsed_time(e1))


# ---------------------------------------------------------------- graphs


# torch: test/test_cuda.py::TestCuda::test_graph_capture_simple
def test_graph_capture_simple():
    s = runtime.Stream()
    a = runtime.to_device(np.ones(1000, np.float32))
    one = runtime.to_device(np.ones(1000, np.float32))
    b = runtime.empty(1000, np.float32)
    kernels.copy(b, a, stream=s)
    s.synchronize(timeout=WAIT)
    s.begin_capture()
    for _ in range(10):
        kernels.add(b, b, one, stream=s)
    g = s.end_capture()
    runtime.current_stream().wait_stream(s)
    g.replay(s)
    s.synchronize(timeout=WAIT)
    assert b.copy_to_host().sum() == 11000.0


# torch: test/test_cuda.py::TestCuda::test_graph_is_current_stream_capturing
def test_graph_is_current_stream_capturing():
    assert not runtime.current_stream().is_capturing
    s = runtime.Stream()
    with s:
        assert not runtime.current_stream().is_capturing
        s.begin_capture()
        assert runtime.current_stream().is_capturing
        s.end_capture()
    assert not runtime.current_stream().is_capturing


# torch: test/test_cuda.py::TestCuda::test_graph_two_successive
def test_graph_two_successive():
    s = runtime.Stream()
    a = runtime.to_device(np.full(1000, 1.0, np.float32))
    b = runtime.empty(1000, np.float32)
    c = runtime.empty(1000, np.float32)
    s.begin_capture()
    kernels.add(b, a, a, stream=s)  # b = 2a
    g1 = s.end_capture()
    s.begin_capture()
    kernels.add(c, b, b, stream=s)  # c = 2b
    g2 = s.end_capture()
    g1.replay(s)
    g2.replay(s)
    s.synchronize(timeout=WAIT)
    assert b.copy_to_host().sum() == 2000.0
    assert c.copy_to_host().sum() == 4000.0
    kernels.fill(a, 3.0, stream=s)
    g1.replay(s)
    g2.replay(s)
    s.synchronize(timeout=WAIT)
    assert c.copy_to_host().sum() == 12000.0


# torch: test/test_cuda.py::TestCuda::test_graph_concurrent_replay
def test_graph_concurrent_replay():
    size = 100_000
    s1, s2 = runtime.Stream(), runtime.Stream()
    a = runtime.to_device(np.full(size, 1.0, np.float32))
    b = runtime.to_device(np.full(size, 1.0, np.float32))
    one = runtime.to_device(np.ones(size, np.float32))
    s1.begin_capture()
    for _ in range(10):
        kernels.add(a, a, one, stream=s1)
    g1 = s1.end_capture()
    s2.begin_capture()
    for _ in range(5):
        kernels.scale(b, b, 2.0, stream=s2)
    g2 = s2.end_capture()
    g1.replay(s1)
    g2.replay(s2)
    s1.synchronize(timeout=WAIT)
    s2.synchronize(timeout=WAIT)
    assert (a.copy_to_host() == 11.0).all()
    assert (b.copy_to_host() == 32.0).all()


# torch: test/test_cuda.py::TestCuda::test_graph_memory_stats_and_use_result_after_destroy_graph
def test_graph_use_result_after_destroy_graph():
    s = runtime.Stream()
    x = runtime.to_device(np.arange(64, dtype=np.float64))
    out = runtime.empty(64, np.float64)
    s.begin_capture()
    kernels.scale(out, x, 2.0, stream=s)
    g = s.end_capture()
    g.replay(s)
    del g
    gc.collect()
    s.synchronize(timeout=WAIT)
    np.testing.assert_array_equal(out.copy_to_host(), 2 * np.arange(64))
    assert runtime.memory_stats(0)["allocated"] >= 2 * 64 * 8


# torch: test/test_cuda.py::TestCuda::test_lazy_init
def test_calls_before_init_raise():
    # Differs from torch (lazy initialisation): runtime raises until init().
    runtime.shutdown()
    with pytest.raises(runtime.NotInitializedError):
        runtime.get_device_count()
    with pytest.raises(runtime.NotInitializedError):
        runtime.Stream()
    runtime.init(device_count=2, memory="64MiB")
    assert runtime.get_device_count() == 2


# torch: test/test_cuda.py::TestCuda::test_stream_event_nogil (threads sync their own streams)
def test_stream_sync_in_threads():
    results = {}

    def worker(dev):
        s = runtime.Stream(dev)
        x = runtime.to_device(np.full(1000, float(dev)), device=dev, stream=s)
        kernels.scale(x, x, 2.0, stream=s)
        s.synchronize(timeout=WAIT)
        results[dev] = x.copy_to_host().sum()

    threads = [threading.Thread(target=worker, args=(d,)) for d in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert results == {0: 0.0, 1: 2000.0, 2: 4000.0, 3: 6000.0}
