"""Managed memory: malloc_managed, DeviceBuffer.host_view, prefetch, mem_advise,
mem_range_attributes."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import runtime

WAIT = 10.0


@pytest.fixture(scope="module", autouse=True)
def rt():
    runtime.shutdown()
    runtime.init(device_count=2, memory="256MiB")
    yield
    runtime.shutdown()


def test_malloc_managed_is_a_device_buffer():
    # numba: numba/cuda/tests/cudadrv/test_cuda_memory.py::TestCudaMemory::test_managed_memory
    m = runtime.malloc_managed(1024)
    assert isinstance(m, runtime.DeviceBuffer)
    assert m.nbytes == 1024 and m.is_managed and m.device.index == runtime.get_device()
    assert not runtime.device_malloc(0, 16).is_managed


def test_malloc_managed_device_and_none_is_current():
    assert runtime.malloc_managed(8, 1).device.index == 1
    with runtime.Device(1):
        assert runtime.malloc_managed(8).device.index == 1
    with pytest.raises(runtime.InvalidDeviceError):
        runtime.malloc_managed(8, 9)
    with pytest.raises(ValueError):
        runtime.malloc_managed(-1)


def test_host_view_is_zero_copy_both_ways():
    m = runtime.malloc_managed(16 * 4).view(np.float32, 16)
    h = m.host_view()
    assert isinstance(h, np.ndarray) and h.shape == (16,) and h.dtype == np.float32
    assert h.ctypes.data == m.ptr
    h[:] = np.arange(16, dtype=np.float32)  # host writes, device reads
    out = runtime.empty(16, np.float32)
    runtime.kernels.add(out, m, m)
    runtime.synchronize()
    assert out.copy_to_host().tolist() == [2.0 * i for i in range(16)]
    runtime.kernels.add(m, out, out)  # device writes, host reads after synchronising
    runtime.synchronize()
    assert h.tolist() == [4.0 * i for i in range(16)]


def test_host_view_refuses_device_memory():
    with pytest.raises(ValueError, match="not managed"):
        runtime.empty(4).host_view()


def test_managed_buffer_in_copies():
    m = runtime.malloc_managed(8)
    runtime.memcpy_host_to_device(m, np.arange(8, dtype=np.uint8))
    assert m.host_view().tolist() == list(range(8))
    d = runtime.device_malloc(0, 8)
    runtime.memcpy_d2d(d, m)
    assert d.copy_to_host().tolist() == list(range(8))


def test_prefetch_is_stream_ordered_recorded_and_traced():
    m = runtime.malloc_managed(4096)
    s = runtime.Stream(0)
    runtime._runtime.trace_start()
    try:
        runtime.prefetch(m, 1, stream=s)
        runtime.prefetch(m, "cpu", stream=s)
        s.synchronize(timeout=WAIT)
    finally:
        records = runtime._runtime.trace_stop()
    names = [r["name"] for r in records if r["phase"] == "run"]
    assert "prefetch 4096 B to device 1" in names and "prefetch 4096 B to host" in names
    assert names.index("prefetch 4096 B to device 1") < names.index("prefetch 4096 B to host")
    assert runtime.mem_range_attributes(m)["last_prefetch_location"] == -1
    runtime.prefetch(m)  # device None: the current device, on the current stream
    runtime.synchronize()
    assert runtime.mem_range_attributes(m)["last_prefetch_location"] == 0


def test_prefetch_refuses_device_memory_and_bad_devices():
    with pytest.raises(ValueError, match="not managed"):
        runtime.prefetch(runtime.empty(4), 0)
    m = runtime.malloc_managed(64)
    with pytest.raises(runtime.InvalidDeviceError):
        runtime.prefetch(m, 5)
    # A device string of an unknown type ("gpu") is a bad value; "npu:N" names a device.
    with pytest.raises(ValueError, match="gpu"):
        runtime.prefetch(m, "gpu")
    with pytest.raises(TypeError, match="device"):
        runtime.prefetch(m, "0")
    runtime.prefetch(m, "npu:1")
    runtime.synchronize()
    with pytest.raises(TypeError):
        runtime.prefetch(np.zeros(4), 0)


def test_mem_advise_records_each_advice():
    m = runtime.malloc_managed(64)
    attrs = runtime.mem_range_attributes(m)
    assert attrs == {
        "read_mostly": False,
        "preferred_location": None,
        "accessed_by": [],
        "last_prefetch_location": None,
    }
    runtime.mem_advise(m, "set_read_mostly")
    runtime.mem_advise(m, 3, 1)  # cudaMemAdviseSetPreferredLocation
    runtime.mem_advise(m, "cudaMemAdviseSetAccessedBy", 0)
    runtime.mem_advise(m, "set_accessed_by", -1)
    attrs = runtime.mem_range_attributes(m)
    assert attrs["read_mostly"] and attrs["preferred_location"] == 1
    assert attrs["accessed_by"] == [0, -1]
    runtime.mem_advise(m, "unset_read_mostly")
    runtime.mem_advise(m, "unset_preferred_location")
    runtime.mem_advise(m, 6, 0)
    attrs = runtime.mem_range_attributes(m)
    assert not attrs["read_mostly"] and attrs["preferred_location"] is None
    assert attrs["accessed_by"] == [-1]


def test_mem_advise_is_traced():
    m = runtime.malloc_managed(64)
    runtime._runtime.trace_start()
    try:
        runtime.mem_advise(m, "set_read_mostly", 0)
    finally:
        records = runtime._runtime.trace_stop()
    adv = [r for r in records if r["phase"] == "advise"]
    assert [r["name"] for r in adv] == ["mem_advise set_read_mostly device 0 (64 B)"]
    assert adv[0]["bytes"] == 64


@pytest.mark.parametrize(
    ("advice", "exc", "match"),
    [
        (0, ValueError, "unknown advice"),
        (7, ValueError, "set_read_mostly"),
        ("read_lots", ValueError, "unknown advice"),
        (1.5, TypeError, "advice"),
    ],
)
def test_mem_advise_bad_advice(advice, exc, match):
    m = runtime.malloc_managed(64)
    with pytest.raises(exc, match=match):
        runtime.mem_advise(m, advice, 0)


def test_mem_advise_refuses_device_memory():
    with pytest.raises(ValueError, match="not managed"):
        runtime.mem_advise(runtime.empty(4), "set_read_mostly", 0)
    with pytest.raises(ValueError, match="not managed"):
        runtime.mem_range_attributes(runtime.empty(4))


def test_views_of_managed_memory_are_managed():
    m = runtime.malloc_managed(64)
    v = m.view(np.uint8, 32, offset=16)
    assert v.is_managed
    assert v.host_view().ctypes.data == m.ptr + 16


def test_freed_managed_handle_is_refused():
    m = runtime.malloc_managed(64)
    runtime.device_free(m)
    with pytest.raises(runtime.InvalidHandleError):
        runtime.prefetch(m, 0)


def test_queued_copy_from_a_host_view_follows_stream_order():
    # A managed buffer is device-accessible: a queued copy from its host view reads it when the
    # stream gets there (after the kernel before it), not when the copy was queued.
    s = runtime.Stream(0)
    m = runtime.malloc_managed(16).view(np.float32, 4)
    m.host_view()[:] = 1.0
    out = runtime.zeros(4, np.float32)
    ev = threading.Event()
    s.launch_host_func(lambda: ev.wait(WAIT))  # nothing below runs before ev is set
    s.launch_kernel(runtime.kernels.scale, (m, m, 3.0))
    runtime.memcpy_host_to_device(out, m.host_view(), s)
    runtime.memcpy_2d(out, 8, m.host_view(), 8, 8, 2, s)
    ev.set()
    s.synchronize(timeout=WAIT)
    assert out.copy_to_host().tolist() == [3.0] * 4
