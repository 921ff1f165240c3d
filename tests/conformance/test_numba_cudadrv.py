"""Numba's CUDA driver and kernel tests (numba/cuda/tests/cudadrv/, cudapy/) translated onto
``runtime``.

``cuda.to_device``/``device_array``/``copy_to_host`` map onto ``runtime.to_device``/``empty``/
``copy_to_host``; ``cuda.stream()``/``cuda.event()`` onto ``runtime.Stream``/``Event``; the
driver's ``host_to_device``/``device_memset`` onto ``memcpy_*``/``memset``; ``@cuda.jit``
kernels onto native kernels or Python callables launched on a stream.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import threading

import numpy as np
import pytest
from _support import WAIT, MiB

import runtime
from runtime import kernels

# ---------------------------------------------------------------- cudadrv/test_events.py


# numba: numba/cuda/tests/cudadrv/test_events.py::TestCudaEvent::test_event_elapsed
def test_event_elapsed():
    n = 32
    dary = runtime.empty(n, np.float64)
    start, end = runtime.Event(), runtime.Event()
    start.record()
    runtime.memcpy_host_to_device(dary, np.arange(n, dtype=np.float64))
    end.record()
    end.wait()
    end.synchronize(timeout=WAIT)
    assert start.elapsed_time(end) >= 0
    np.testing.assert_array_equal(dary.copy_to_host(), np.arange(n))


# numba: numba/cuda/tests/cudadrv/test_events.py::TestCudaEvent::test_event_elapsed_stream
def test_event_elapsed_stream():
    n = 32
    s = runtime.Stream()
    dary = runtime.empty(n, np.float64)
    start, end = runtime.Event(), runtime.Event()
    start.record(s)
    runtime.memcpy_host_to_device_async(dary, np.arange(n, dtype=np.float64), s)
    end.record(s)
    end.wait(s)
    end.synchronize(timeout=WAIT)
    assert start.elapsed_time(end) >= 0
    assert end.timestamp_ns >= start.timestamp_ns
    np.testing.assert_array_equal(dary.copy_to_host(), np.arange(n))


# ---------------------------------------------------------------- cudadrv/test_cuda_memory.py


# numba: numba/cuda/tests/cudadrv/test_cuda_memory.py::TestCudaMemory::test_device_memory
def test_device_memory():
    devmem = runtime.device_malloc(0, 1024)
    assert isinstance(devmem, runtime.DeviceBuffer)
    assert devmem.nbytes == 1024 and devmem.ptr != 0 and not devmem.freed


# numba: numba/cuda/tests/cudadrv/test_cuda_memory.py::TestCudaMemory::test_device_view
def test_device_view():
    devmem = runtime.device_malloc(0, 1024)
    view = devmem.view(np.uint8, 1014, offset=10)
    assert isinstance(view, runtime.DeviceBuffer)
    assert view.ptr == devmem.ptr + 10 and view.nbytes == 1014


# numba: numba/cuda/tests/cudadrv/test_cuda_memory.py::TestCudaMemory::test_host_alloc
def test_host_alloc():
    mem = runtime.malloc_host(1024, mapped=True)
    assert mem.nbytes == 1024


# numba: numba/cuda/tests/cudadrv/test_cuda_memory.py::TestCudaMemory::test_managed_memory
def test_managed_memory():
    mem = runtime.malloc_managed(1024)
    assert mem.nbytes == 1024


# numba: numba/cuda/tests/cudadrv/test_cuda_memory.py::TestCudaMemory::test_derived_pointer
@pytest.mark.parametrize("offset", [0, 1])
def test_derived_pointer(offset):
    m = runtime.device_malloc(0, 1024)
    v1 = m.view(np.uint8, 1024 - offset, offset=offset)
    assert v1.ptr - offset == m.ptr
    v2 = v1.view(np.uint8, 1024 - 2 * offset, offset=offset)
    assert v2.ptr - 2 * offset == m.ptr
    assert v2.offset == 2 * offset
    # a view keeps its allocation alive: the owner is freed only when the last one goes
    allocated = runtime.memory_stats(0)["allocated"]
    del m, v1
    gc.collect()
    assert runtime.memory_stats(0)["allocated"] == allocated
    del v2
    gc.collect()
    assert runtime.memory_stats(0)["allocated"] == allocated - 1024


# numba: numba/cuda/tests/cudadrv/test_cuda_memory.py::TestCudaMemoryFunctions::test_memcpy
def test_memcpy():
    hst = np.arange(100, dtype=np.uint32)
    hst2 = np.zeros(100, dtype=np.uint32)
    dev = runtime.device_malloc(0, hst.nbytes)
    runtime.memcpy_host_to_device(dev, hst, count=hst.nbytes)
    runtime.memcpy_device_to_host(hst2, dev, count=hst.nbytes)
    np.testing.assert_array_equal(hst, hst2)


# numba: numba/cuda/tests/cudadrv/test_cuda_driver.py::TestCudaDriver::test_cuda_driver_stream_operations
def test_cuda_driver_stream_operations():
    # host_to_device, a kernel writing each index, then device_to_host(stream=) into a ctypes
    # array that is read at once: into pageable memory the queued copy is complete on return.
    array = (ctypes.c_int * 100)()
    stream = runtime.Stream()
    with stream.auto_synchronize():
        memory = runtime.device_malloc(0, ctypes.sizeof(array))
        runtime.memcpy_host_to_device(memory, array, stream, count=ctypes.sizeof(array))

        def helloworld(a):
            a[:] = np.arange(100, dtype=np.int32)

        stream.launch_kernel(helloworld, (memory.view("int32"),))
    stream.launch_kernel(lambda: threading.Event().wait(0.05))  # still busy at the copy
    runtime.memcpy_device_to_host(array, memory, stream, count=ctypes.sizeof(array))
    for i, v in enumerate(array):
        assert i == v


# numba: numba/cuda/tests/cudadrv/test_cuda_memory.py::TestCudaMemoryFunctions::test_memset
def test_memset():
    n = 10
    dev = runtime.device_malloc(0, 4 * n)
    runtime.memset(dev, 0xAB, 4 * n)
    hst = np.zeros(n, dtype=np.uint32)
    runtime.memcpy_device_to_host(hst, dev)
    np.testing.assert_array_equal(hst, np.full(n, 0xABABABAB, np.uint32))


# numba: numba/cuda/tests/cudadrv/test_cuda_memory.py::TestCudaMemoryFunctions::test_d2d
def test_d2d():
    hst = np.arange(100, dtype=np.uint32)
    hst2 = np.empty_like(hst)
    dev1 = runtime.device_malloc(0, hst.nbytes)
    dev2 = runtime.device_malloc(1, hst.nbytes)  # across devices too
    runtime.memcpy_host_to_device(dev1, hst)
    runtime.memcpy_d2d(dev2, dev1)
    runtime.memcpy_device_to_host(hst2, dev2)
    np.testing.assert_array_equal(hst, hst2)


# numba: numba/cuda/tests/cudadrv/test_cuda_memory.py::TestMVExtent::test_f_contiguous_array
def test_host_extent_f_contiguous():
    # Differs from Numba: an F-ordered source is copied in C order (the logical array, as
    # to_device does), not as its raw F-ordered bytes.
    ary = np.asfortranarray(np.arange(100, dtype=np.int64).reshape(2, 50))
    dev = runtime.device_malloc(0, ary.nbytes)
    runtime.memcpy_host_to_device(dev, ary)
    np.testing.assert_array_equal(dev.view(np.int64, (2, 50)).copy_to_host(), ary)
    np.testing.assert_array_equal(runtime.to_device(ary).copy_to_host(), ary)


# numba: numba/cuda/tests/cudadrv/test_cuda_memory.py::TestMVExtent::test_single_element_array
def test_host_extent_single_element():
    ary = np.asarray(np.uint32(1234))
    dev = runtime.device_malloc(0, 16)
    runtime.memcpy_host_to_device(dev, ary)
    back = np.zeros((), np.uint32)
    runtime.memcpy_device_to_host(back, dev)
    assert back == 1234


# numba: numba/cuda/tests/cudadrv/test_cuda_memory.py::TestMVExtent::test_ctypes_struct
def test_host_extent_ctypes_struct():
    class MyStruct(ctypes.Structure):
        _fields_ = [("x", ctypes.c_int), ("y", ctypes.c_int)]

    data = MyStruct(x=123, y=432)
    dev = runtime.device_malloc(0, ctypes.sizeof(data))
    runtime.memcpy_host_to_device(dev, data)
    back = MyStruct()
    runtime.memcpy_device_to_host(back, dev)
    assert (back.x, back.y) == (123, 432)


# numba: numba/cuda/tests/cudadrv/test_cuda_memory.py::TestMVExtent::test_ctypes_double
def test_host_extent_ctypes_double():
    data = ctypes.c_double(1.234)
    dev = runtime.device_malloc(0, ctypes.sizeof(data))
    runtime.memcpy_host_to_device(dev, data)
    assert dev.view(np.float64).copy_to_host()[0] == 1.234


# ---------------------------------------------------------------- cudadrv/test_cuda_ndarray.py


# numba: numba/cuda/tests/cudadrv/test_cuda_ndarray.py::TestCudaNDArray::test_device_array_interface
def test_device_array_interface():
    dary = runtime.empty(100, np.float64)
    assert dary.shape == (100,) and dary.ndim == 1
    assert np.asarray(dary).shape == (100,)
    scalar = runtime.to_device(np.asarray(1.234))
    assert scalar.ndim == 0 and scalar.shape == ()
    assert scalar.copy_to_host() == 1.234


# numba: numba/cuda/tests/cudadrv/test_cuda_ndarray.py::TestCudaNDArray::test_device_array_from_readonly
def test_device_array_from_readonly():
    ary = np.arange(100, dtype=np.float32)
    ary.flags.writeable = False
    np.testing.assert_array_equal(runtime.to_device(ary).copy_to_host(), ary)


# numba: numba/cuda/tests/cudadrv/test_cuda_ndarray.py::TestCudaNDArray::test_devicearray_dtype
def test_devicearray_dtype():
    assert runtime.empty((100,), "f4").dtype == np.dtype("f4")


# numba: numba/cuda/tests/cudadrv/test_cuda_ndarray.py::TestCudaNDArray::test_devicearray_shape
def test_devicearray_shape():
    ary = np.arange(2 * 3 * 4).reshape(2, 3, 4)
    dary = runtime.to_device(ary)
    assert dary.shape == ary.shape
    assert dary.shape[1:] == ary.shape[1:]


# numba: numba/cuda/tests/cudadrv/test_cuda_ndarray.py::TestCudaNDArray::test_devicearray
def test_devicearray_roundtrip():
    array = np.arange(100, dtype=np.int32)
    original = array.copy()
    gpumem = runtime.to_device(array)
    array[:] = 0
    runtime.memcpy_device_to_host(array, gpumem)
    np.testing.assert_array_equal(array, original)


# numba: numba/cuda/tests/cudadrv/test_cuda_ndarray.py::TestCudaNDArray::test_len_1d
# numba: numba/cuda/tests/cudadrv/test_cuda_ndarray.py::TestCudaNDArray::test_len_2d
# numba: numba/cuda/tests/cudadrv/test_cuda_ndarray.py::TestCudaNDArray::test_len_3d
@pytest.mark.parametrize("shape", [(3,), (3, 5), (3, 5, 7)])
def test_len(shape):
    assert len(runtime.empty(shape, np.float64)) == len(np.empty(shape))


# numba: numba/cuda/tests/cudadrv/test_cuda_ndarray.py::TestCudaNDArray::test_devicearray_partition
def test_devicearray_partition():
    n = 100
    array = np.arange(n, dtype=np.int32)
    original = array.copy()
    gpumem = runtime.to_device(array)
    left = gpumem.view(np.int32, n // 2, offset=0)
    right = gpumem.view(np.int32, n // 2, offset=(n // 2) * 4)
    array[:] = 0
    runtime.memcpy_device_to_host(array[n // 2 :], right)
    runtime.memcpy_device_to_host(array[: n // 2], left)
    np.testing.assert_array_equal(array, original)


# numba: numba/cuda/tests/cudadrv/test_cuda_ndarray.py::TestCudaNDArray::test_devicearray_replace
def test_devicearray_replace():
    array = np.arange(100, dtype=np.int32)
    gpumem = runtime.to_device(array)
    runtime.memcpy_host_to_device(gpumem, array * 2)
    np.testing.assert_array_equal(gpumem.copy_to_host(), array * 2)


# numba: numba/cuda/tests/cudadrv/test_cuda_ndarray.py::TestCudaNDArray::test_devicearray_view_ok
@pytest.mark.parametrize("dtype", ["i4", "i8", "f8"])
def test_devicearray_view_ok(dtype):
    original = np.arange(24, dtype="i4").reshape(4, 6)
    array = runtime.to_device(original)
    np.testing.assert_array_equal(array.view(dtype).copy_to_host(), original.view(dtype))


# numba: numba/cuda/tests/cudadrv/test_cuda_ndarray.py::TestCudaNDArray::test_devicearray_view_ok
def test_devicearray_view_ok_int16_source():
    original = np.arange(12, dtype="i2").reshape(3, 4)
    array = runtime.to_device(original)
    np.testing.assert_array_equal(array.view("u4").copy_to_host(), original.view("u4"))


# numba: numba/cuda/tests/cudadrv/test_cuda_ndarray.py::TestCudaNDArray::test_devicearray_view_bad_itemsize
def test_devicearray_view_bad_size():
    array = runtime.to_device(np.arange(12, dtype=np.int32))  # 48 bytes
    with pytest.raises(ValueError, match="does not fit"):
        array.view(np.int64, (7,))


# numba: numba/cuda/tests/cudadrv/test_cuda_ndarray.py::TestCudaNDArray::test_devicearray_contiguous_copy_host_1d
# numba: numba/cuda/tests/cudadrv/test_cuda_ndarray.py::TestCudaNDArray::test_devicearray_contiguous_copy_host_3d
@pytest.mark.parametrize("shape", [(5,), (5, 5, 5)])
def test_devicearray_contiguous_copy_host(shape):
    a_c = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    a_f = np.array(a_c, order="F")
    for original in (a_c, a_f):
        d = runtime.to_device(original)
        np.testing.assert_array_equal(d.copy_to_host(), a_c)
        np.testing.assert_array_equal(d.copy_to_host(), a_f)


# numba: numba/cuda/tests/cudadrv/test_cuda_ndarray.py::TestCudaNDArray::test_devicearray_broadcast_host_copy
def test_devicearray_broadcast_host_copy():
    core = np.arange(6, dtype=np.int64).reshape(2, 3)
    for dim in range(2):
        index = (slice(None),) * dim + (np.newaxis,)
        shape = core.shape[:dim] + (4,) + core.shape[dim:]
        broad = np.broadcast_to(core[index], shape)
        np.testing.assert_array_equal(runtime.to_device(broad).copy_to_host(), broad)


# numba: numba/cuda/tests/cudadrv/test_cuda_ndarray.py::TestCudaNDArray::test_devicearray_contiguous_host_strided
def test_devicearray_contiguous_host_strided():
    arr = np.arange(20, dtype=np.int64)[::2]
    d = runtime.to_device(arr)
    np.testing.assert_array_equal(d.copy_to_host(), arr)


# numba: numba/cuda/tests/cudadrv/test_cuda_ndarray.py::TestCudaNDArray::test_bug6697
def test_asarray_keeps_dtype():
    dary = runtime.to_device(np.arange(10, dtype=np.int32))
    assert np.asarray(dary).dtype == dary.dtype == np.int32


# numba: numba/cuda/tests/cudadrv/test_cuda_ndarray.py::TestCudaNDArray::test_bug6697
def test_asarray_keeps_dtype_int16():
    dary = runtime.to_device(np.arange(10, dtype=np.int16))
    assert np.asarray(dary).dtype == np.int16


# numba: numba/cuda/tests/cudadrv/test_cuda_ndarray.py::TestCudaNDArray::test_devicearray (big-endian host data)
def test_devicearray_big_endian():
    # The runtime's documented choice (README, "byte order"): to_device converts data in the
    # other byte order to the device's (native) order, values kept; an allocation dtype in the
    # other order is refused. One answer, checked exactly.
    ary = np.arange(4, dtype=">i4")
    d = runtime.to_device(ary)
    assert d.dtype == np.dtype("int32")  # native order on the device
    got = d.copy_to_host()
    assert got.dtype == np.dtype("int32")
    np.testing.assert_array_equal(got, [0, 1, 2, 3])
    with pytest.raises(ValueError, match="dtype"):
        runtime.empty(4, ">i4")


# ---------------------------------------------------------------- cudadrv/test_array_attr.py


# numba: numba/cuda/tests/cudadrv/test_array_attr.py::TestArrayAttr::test_contigous_2d
def test_contiguous_flags_2d():
    fary = np.asfortranarray(np.arange(10).reshape(2, 5))
    assert runtime.to_device(fary).flags["F_CONTIGUOUS"]


# numba: numba/cuda/tests/cudadrv/test_array_attr.py::TestArrayAttr::test_reshape_c
def test_reshape_c():
    ary = np.arange(10, dtype=np.int64)
    dary = runtime.to_device(ary)
    got = dary.view(np.int64, (2, 5)).copy_to_host()
    np.testing.assert_array_equal(got, ary.reshape(2, 5))


# numba: numba/cuda/tests/cudadrv/test_array_attr.py::TestArrayAttr::test_ravel_c
def test_ravel_c():
    reshaped = np.arange(60, dtype=np.int64).reshape(2, 5, 2, 3)
    dflat = runtime.to_device(reshaped).view(np.int64, reshaped.size)
    flat = dflat.copy_to_host()
    assert flat.ndim == 1
    np.testing.assert_array_equal(flat, reshaped.ravel(order="C"))


# ---------------------------------------------------------------- cudadrv/test_deallocations.py


# numba: numba/cuda/tests/cudadrv/test_deallocations.py::TestDeallocation::test_max_pending_count
def test_dropped_buffers_are_freed():
    before = runtime.memory_stats(0)
    for _ in range(20):
        runtime.to_device(np.arange(1, dtype=np.int64))
    gc.collect()
    after = runtime.memory_stats(0)
    assert after["num_frees"] - before["num_frees"] == 20
    assert after["active_allocations"] == before["active_allocations"]
    assert after["allocated"] == before["allocated"]


# numba: numba/cuda/tests/cudadrv/test_deallocations.py::TestDeferCleanup::test_basic
def test_deferred_free_while_queued():
    # numba defers deallocation explicitly; runtime defers a free until queued work that uses
    # the buffer has run.
    s = runtime.Stream()
    release = threading.Event()
    src = runtime.to_device(np.arange(5, dtype=np.int64))
    dst = runtime.empty(5, np.int64)
    s.launch_host_func(release.wait, WAIT)
    runtime.memcpy_d2d(dst, src, s)
    runtime.device_free(src)
    assert src.freed
    assert runtime.memory_stats(0)["active_allocations"] == 2  # src still held by the copy
    release.set()
    s.synchronize(timeout=WAIT)
    np.testing.assert_array_equal(dst.copy_to_host(), np.arange(5))
    assert runtime.memory_stats(0)["active_allocations"] == 1


# numba: numba/cuda/tests/cudadrv/test_deallocations.py::TestDeferCleanupAvail::test_context_manager
def test_defer_cleanup_available():
    # Numba's test only enters the context; here it must also defer: a buffer dropped inside
    # keeps its memory until the block ends.
    runtime.synchronize()
    active = lambda: runtime.memory_stats(0)["active_allocations"]  # noqa: E731
    before = active()
    with runtime.defer_cleanup():
        b = runtime.device_malloc(0, 64)
        del b
        gc.collect()
        assert active() == before + 1
    assert active() == before


# ---------------------------------------------------------------- cudadrv/test_streams.py


# numba: numba/cuda/tests/cudadrv/test_streams.py::TestCudaStream::test_add_callback
def test_add_callback():
    s = runtime.Stream()
    done = threading.Event()
    s.launch_host_func(done.set)
    assert done.wait(WAIT)


# numba: numba/cuda/tests/cudadrv/test_streams.py::TestCudaStream::test_async_done
def test_async_done():
    async def main():
        s = runtime.Stream()
        await s.async_done()

    asyncio.run(main())


# numba: numba/cuda/tests/cudadrv/test_streams.py::TestCudaStream::test_parallel_tasks
def test_parallel_tasks_each_with_its_stream():
    async def one(value):
        s = runtime.Stream()
        src = np.full(8, float(value))
        dst = np.zeros(8)
        d = runtime.to_device(src, stream=s)
        runtime.memcpy_device_to_host_async(dst, d, s)
        await asyncio.to_thread(s.synchronize, WAIT)
        return dst.mean()

    async def main():
        return await asyncio.gather(*(one(v) for v in (1, 2, 3, 4)))

    assert asyncio.run(main()) == [1.0, 2.0, 3.0, 4.0]


# numba: numba/cuda/tests/cudadrv/test_streams.py::TestCudaStream::test_parallel_tasks
def test_current_stream_per_asyncio_task():
    s = runtime.Stream()

    async def main():
        entered = asyncio.Event()
        seen = {}

        async def user():
            with s:
                entered.set()
                await asyncio.sleep(0.01)
                seen["user"] = runtime.current_stream() == s

        async def other():
            await entered.wait()
            seen["other"] = runtime.current_stream() == runtime.default_stream()

        await asyncio.gather(user(), other())
        return seen

    assert asyncio.run(main()) == {"user": True, "other": True}


# ---------------------------------------------------------------- cudadrv: devices and contexts


# numba: numba/cuda/tests/cudadrv/test_select_device.py::TestSelectDevice::test_select_device
def test_select_device_in_threads():
    results = []

    def newthread():
        runtime.set_device(0)
        s = runtime.Stream()
        d = runtime.to_device(np.arange(100, dtype=np.int64), stream=s)
        s.synchronize(timeout=WAIT)
        results.append(int(d.copy_to_host().sum()))

    for _ in range(10):
        t = threading.Thread(target=newthread)
        t.start()
        t.join(WAIT)
    assert results == [4950] * 10


# numba: numba/cuda/tests/cudadrv/test_context_stack.py::TestContextStack::test_gpus_len
def test_gpus_len_and_iter():
    devices = runtime.get_available_devices()
    assert len(devices) == runtime.get_device_count() == 4
    assert [d.index for d in devices] == [0, 1, 2, 3]


# numba: numba/cuda/tests/cudadrv/test_reset_device.py::TestResetDevice::test_reset_device
def test_reset_device_resets_current_device():
    runtime.set_device(2)
    runtime.shutdown()
    runtime.init(device_count=4, memory="256MiB")
    assert runtime.get_device() == 0
    assert runtime.current_stream().device.index == 0


# numba: numba/cuda/tests/cudadrv/test_reset_device.py::TestResetDevice::test_reset_device
def test_reset_device_invalidates_old_handles():
    s = runtime.Stream()
    buf = runtime.device_malloc(0, 64)
    runtime.shutdown()
    runtime.init(device_count=4, memory="256MiB")
    runtime.set_device(0)
    with pytest.raises(runtime.InvalidHandleError):
        s.synchronize(timeout=WAIT)
    with pytest.raises(runtime.InvalidHandleError):
        buf.copy_to_host()
    assert runtime.memory_stats(0)["allocated"] == 0


# numba: numba/cuda/tests/cudadrv/test_managed_alloc.py::TestManagedAlloc::test_managed_alloc_driver_undersubscribe
def test_large_alloc_capacity_enforced():
    buf = runtime.device_malloc(0, 128 * MiB)  # lazily committed: costs no RAM until touched
    assert runtime.get_device_memory_info(0).used >= 128 * MiB
    with pytest.raises(runtime.OutOfMemoryError):
        runtime.device_malloc(0, 200 * MiB)
    del buf


# ---------------------------------------------------------------- cudapy (kernels)


# numba: numba/cuda/tests/cudapy/test_reduction.py::TestReduction::test_sum_reduce
@pytest.mark.parametrize("n", [1, 15, 16, 17, 127, 128, 129, 1023, 1024, 1025, 34567])
def test_sum_reduce(n):
    a = np.arange(n, dtype=np.float64) + 1
    out = runtime.empty(1, np.float64)
    s = runtime.current_stream()
    kernels.sum(out, runtime.to_device(a), stream=s)
    s.synchronize(timeout=WAIT)
    assert out.copy_to_host()[0] == a.sum()


# numba: numba/cuda/tests/cudapy/test_reduction.py::TestReduction::test_empty_array_device
def test_sum_reduce_empty_device_array():
    out = runtime.to_device(np.full(1, 7.0))
    s = runtime.current_stream()
    kernels.sum(out, runtime.empty(0, np.float64), stream=s)
    s.synchronize(timeout=WAIT)
    assert out.copy_to_host()[0] == 0.0


# numba: numba/cuda/tests/cudapy/test_matmul.py::TestCudaMatMul::test_func
def test_matmul():
    rng = np.random.default_rng(4)
    a = rng.random((32, 48)).astype(np.float32)
    b = rng.random((48, 16)).astype(np.float32)
    c = runtime.empty((32, 16), np.float32)
    s = runtime.Stream()
    kernels.matmul(c, runtime.to_device(a), runtime.to_device(b), stream=s)
    s.synchronize(timeout=WAIT)
    np.testing.assert_allclose(c.copy_to_host(), a @ b, rtol=1e-5)


# numba: numba/cuda/tests/cudapy/test_exception.py::TestException::test_user_exception
def test_user_exception_in_kernel():
    s = runtime.Stream()

    def bad(x):
        raise ValueError("bad kernel input")

    s.launch_kernel(bad, (runtime.empty(4, np.float32),))
    with pytest.raises(runtime.KernelError) as info:
        s.synchronize(timeout=WAIT)
    assert isinstance(info.value.__cause__, ValueError)
    assert "bad" in info.value.kernel
    # the stream works again afterwards
    x = runtime.to_device(np.ones(4, np.float32))
    kernels.scale(x, x, 3.0, stream=s)
    s.synchronize(timeout=WAIT)
    np.testing.assert_array_equal(x.copy_to_host(), np.full(4, 3.0))


# numba: numba/cuda/tests/cudapy/test_array.py::TestCudaArray::test_array_local (Python kernel views)
def test_python_kernel_sees_zero_copy_views():
    s = runtime.Stream()
    x = runtime.to_device(np.arange(6, dtype=np.float64).reshape(2, 3))

    def kernel(v):
        assert v.shape == (2, 3)
        v += 10

    s.launch_kernel(kernel, (x,))
    s.synchronize(timeout=WAIT)
    np.testing.assert_array_equal(x.copy_to_host(), np.arange(6).reshape(2, 3) + 10)


# numba: numba/cuda/tests/cudapy/test_array.py (integer scalars passed to a kernel)
def test_numpy_integer_scalar_exact_in_native_kernel():
    x = runtime.to_device(np.zeros(2, np.int64))
    s = runtime.current_stream()
    kernels.fill(x, np.int64(2**53 + 1), stream=s)
    s.synchronize(timeout=WAIT)
    assert x.copy_to_host()[0] == 2**53 + 1
