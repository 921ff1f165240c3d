"""Allocator policy: capacity is enforced by bytes, not by buddy block boundaries; freed
memory still used by queued work is waited for rather than reported as out of memory; fault
injection leaves the allocator usable; shutdown closes the allocator."""

from __future__ import annotations

import time

import pytest

import runtime


@pytest.fixture(autouse=True)
def rt():
    runtime.shutdown()
    runtime.init(device_count=2, memory="1GiB")
    yield
    runtime.shutdown()


def test_small_allocation_does_not_split_capacity_in_half():
    small = runtime.device_malloc(0, 100)
    stats = runtime.memory_stats(0)
    assert stats["fragmentation"] == 0.0
    assert stats["largest_free_block"] == stats["free"]
    big = runtime.device_malloc(0, 900 << 20)  # more than half of the device
    assert runtime.get_device_memory_info(0).used >= 900 << 20
    with pytest.raises(runtime.OutOfMemoryError, match="209715200"):
        runtime.device_malloc(0, 200 << 20)  # capacity, not address space, is the limit
    runtime.device_free(big)
    runtime.device_free(small)


def test_capacity_is_enforced_exactly_in_reserved_bytes():
    bufs = [runtime.device_malloc(1, 256 << 20) for _ in range(4)]
    assert runtime.get_device_memory_info(1).free == 0
    with pytest.raises(runtime.OutOfMemoryError):
        runtime.device_malloc(1, 4096)
    runtime.device_free(bufs.pop())
    runtime.device_malloc(1, 4096)


def test_injected_allocation_failure_then_recovery():
    before = runtime.memory_stats(0)
    runtime._runtime._inject_alloc_failure(0, 3)
    a = runtime.device_malloc(0, 64)
    b = runtime.device_malloc(0, 1 << 20)
    with pytest.raises(runtime.OutOfMemoryError, match="tried to allocate 4096 bytes"):
        runtime.device_malloc(0, 4096)
    c = runtime.device_malloc(0, 4096)
    for x in (a, b, c):
        runtime.device_free(x)
    runtime.empty_cache(0)
    after = runtime.memory_stats(0)
    assert after["allocated"] == before["allocated"] == 0
    assert after["reserved"] == before["reserved"]
    assert after["num_ooms"] == before["num_ooms"] + 1


def test_native_fault_kernels_surface_as_kernel_errors():
    runtime._runtime._register_test_kernels()
    s = runtime.Stream(0)
    for name in ("test_panic", "test_error"):
        s.launch_kernel(name)
        with pytest.raises(runtime.KernelError, match=name):
            s.synchronize()
        s.launch_kernel(runtime.kernels.noop)
        s.synchronize()


def test_allocation_waits_for_queued_work_that_holds_a_freed_buffer():
    # issue 11 item 16: as torch's caching allocator, wait for the work before raising OOM.
    runtime.shutdown()
    runtime.init(device_count=1, memory="64MiB")
    big = 40 << 20  # only one fits on the device
    buf = runtime.device_malloc(0, big)
    seen = []

    def slow(view):
        time.sleep(0.05)
        seen.append(view.nbytes)

    stream = runtime.Stream(0)
    stream.launch_kernel(slow, (buf,))
    runtime.device_free(buf)  # the queued kernel still uses the memory
    again = runtime.device_malloc(0, big)
    stream.synchronize()
    assert seen == [big]
    stats = runtime.memory_stats(0)
    assert stats["num_ooms"] == 0
    assert stats["allocated"] == big
    runtime.device_free(again)


def test_zero_byte_allocations_count_no_bytes():
    before = runtime.memory_stats(0)
    bufs = [runtime.device_malloc(0, 0) for _ in range(100)]
    stats = runtime.memory_stats(0)
    assert stats["allocated"] == before["allocated"]
    assert stats["reserved"] == before["reserved"]
    assert stats["active_allocations"] == before["active_allocations"] + 100
    assert stats["num_allocs"] == before["num_allocs"] + 100
    for b in bufs:
        runtime.device_free(b)
    after = runtime.memory_stats(0)
    assert after["active_allocations"] == before["active_allocations"]
    assert after["num_frees"] == before["num_frees"] + 100
