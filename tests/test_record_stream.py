"""``DeviceBuffer.record_stream`` (torch semantics): when a buffer is freed, its block is not
reused until the work queued on the recorded streams at free time has completed. Translated
from torch's test/test_cuda.py: ``test_record_stream`` (a block used on a side stream is not
handed out again while that stream's work is pending, and is after it completed),
``test_record_stream_on_shifted_view`` and ``test_caching_allocator_record_stream_oom``."""

from __future__ import annotations

import threading

import pytest

import runtime


@pytest.fixture(scope="module", autouse=True)
def rt():
    runtime.shutdown()
    runtime.init(device_count=2, memory="64MiB")
    yield
    runtime.shutdown()


def hold(stream: runtime.Stream) -> threading.Event:
    """Block ``stream`` until the returned event is set."""
    gate = threading.Event()
    stream.launch_host_func(gate.wait)
    return gate


@pytest.mark.parametrize("size", [50, 4096, 1 << 20])
def test_record_stream(size):
    # torch test_cuda.py test_record_stream
    s = runtime.Stream()
    pool = runtime.get_default_memory_pool()
    gate = hold(s)
    buf = runtime.device_malloc(0, size)
    ptr = buf.ptr
    active = runtime.memory_stats(0)["active_allocations"]
    buf.record_stream(s)
    runtime.device_free(buf)
    # The block is still in use: it counts, and a new allocation does not get it.
    assert runtime.memory_stats(0)["active_allocations"] == active
    other = runtime.device_malloc(0, size)
    assert other.ptr != ptr
    used = pool.used_bytes()
    gate.set()
    s.synchronize()
    # Once the stream's work completed, the block goes back at the next allocator call.
    assert pool.used_bytes() < used
    if size <= 32 << 10:
        # A slab slot: the next request of its class takes the slot just freed (torch: "the
        # block will be re-used after the stream finishes").
        again = runtime.device_malloc(0, size)
        assert again.ptr == ptr
        runtime.device_free(again)
    runtime.device_free(other)
    assert runtime.memory_stats(0)["active_allocations"] == active - 1


def test_record_stream_on_shifted_view():
    # torch test_cuda.py test_record_stream_on_shifted_view
    base = runtime.empty((10,), dtype="float32")
    view = base[5:]
    assert view.offset == 20
    s = runtime.Stream()
    gate = hold(s)
    view.record_stream(s)
    data_ptr = base.ptr
    del base, view
    try_realloc = runtime.empty((10,), dtype="float32")
    assert try_realloc.ptr != data_ptr
    gate.set()
    s.synchronize()


def test_record_stream_blocks_are_freed_on_out_of_memory():
    # torch test_cuda.py test_caching_allocator_record_stream_oom: blocks held back by
    # record_stream are still freed when an allocation would otherwise fail (the allocator
    # waits for the queued work, then takes the parked blocks back). 20 x 16 MiB on a
    # 64 MiB device.
    s = runtime.Stream()
    for _ in range(20):
        x = runtime.device_malloc(0, 16 << 20)
        runtime.memset(x, 1, stream=s)
        x.record_stream(s)
        runtime.device_free(x)
    s.synchronize()
    assert runtime.memory_stats(0)["num_ooms"] == 0
    runtime.empty_cache()


def test_work_queued_after_the_free_does_not_hold_the_block():
    s = runtime.Stream()
    gate = hold(s)
    buf = runtime.device_malloc(0, 256)
    buf.record_stream(s)
    gate.set()
    s.synchronize()
    active = runtime.memory_stats(0)["active_allocations"]
    runtime.device_free(buf)  # nothing pending on s: freed at once
    later = hold(s)
    assert runtime.memory_stats(0)["active_allocations"] == active - 1
    later.set()
    s.synchronize()


def test_views_keep_the_allocation_and_share_its_streams():
    s1, s2 = runtime.Stream(), runtime.Stream()
    g1, g2 = hold(s1), hold(s2)
    buf = runtime.device_malloc(0, 1024)
    view = buf[256:512]
    view.record_stream(s1)
    buf.record_stream(s2)
    buf.record_stream(s2)  # recorded once
    active = runtime.memory_stats(0)["active_allocations"]
    runtime.device_free(buf)
    del view
    g1.set()
    s1.synchronize()
    runtime.empty_cache()
    assert runtime.memory_stats(0)["active_allocations"] == active
    g2.set()
    s2.synchronize()
    runtime.empty_cache()
    assert runtime.memory_stats(0)["active_allocations"] == active - 1


def test_record_stream_arguments():
    buf = runtime.device_malloc(0, 8)
    with pytest.raises(TypeError, match="stream must be a runtime.Stream"):
        buf.record_stream(3)
    with pytest.raises(ValueError, match="a Stream is required"):
        buf.record_stream(None)
    runtime.device_free(buf)
    with pytest.raises(runtime.InvalidHandleError):
        buf.record_stream(runtime.Stream())


def test_shutdown_releases_parked_blocks():
    s = runtime.Stream()
    gate = hold(s)
    buf = runtime.device_malloc(0, 128)
    buf.record_stream(s)
    runtime.device_free(buf)
    gate.set()
    runtime.shutdown()
    runtime.init(device_count=2, memory="64MiB")
    assert runtime.memory_stats(0)["active_allocations"] == 0


def test_a_plugged_block_goes_back_to_its_allocator_after_the_recorded_work():
    pool = runtime.get_default_memory_pool()
    freed = []
    runtime.set_allocator(lambda n, d, s: pool.malloc(n), lambda b, n, d: freed.append(n))
    try:
        s = runtime.Stream()
        gate = hold(s)
        buf = runtime.device_malloc(0, 300)
        buf.record_stream(s)
        runtime.device_free(buf)
        runtime.device_free(runtime.device_malloc(0, 1))
        assert freed == [1]
        gate.set()
        s.synchronize()
        runtime.device_free(runtime.device_malloc(0, 2))
        assert sorted(freed) == [1, 2, 300]
    finally:
        runtime.set_allocator(None)
