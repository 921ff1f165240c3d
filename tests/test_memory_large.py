"""Large configurations: 8 devices x 64 GiB configure on a small machine, and host RAM is spent
only on device memory that is actually touched (RSS stays small)."""

from __future__ import annotations

import time

import numpy as np
import pytest

import runtime

GiB = 1 << 30
MiB = 1 << 20
RSS_LIMIT = GiB  # allowed RSS growth over the whole test


def rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    pytest.skip("no VmRSS in /proc/self/status")


@pytest.fixture(scope="module", autouse=True)
def big_runtime():
    runtime.shutdown()
    runtime.init(device_count=8, memory="64GiB")
    yield
    runtime.set_option("enableMemoryReuse", True)
    runtime.shutdown()
    # restore the default configuration
    runtime.init()
    runtime.shutdown()


def test_eight_devices_of_64_gib_configure():
    assert runtime.get_device_count() == 8
    for d in range(8):
        assert runtime.get_device_properties(d).total_memory == 64 * GiB
        info = runtime.get_device_memory_info(d)
        assert info.total == 64 * GiB
        assert info.used == 0
        assert info.free + info.reserved == 64 * GiB


def touch_ends(buf, seed: int) -> None:
    """Write one MiB at the start and one at the end of buf."""
    data = np.full(MiB, seed, np.uint8)
    runtime.memcpy_host_to_device(buf, data)
    runtime.memcpy_host_to_device(buf, data, dst_offset=buf.nbytes - MiB)


def check_ends(buf, seed: int) -> None:
    out = np.empty(MiB, np.uint8)
    runtime.memcpy_device_to_host(out, buf)
    assert (out == seed).all()
    runtime.memcpy_device_to_host(out, buf, src_offset=buf.nbytes - MiB)
    assert (out == seed).all()
    runtime.memcpy_device_to_host(out, buf, src_offset=buf.nbytes // 2)
    assert not out.any()  # untouched middle reads as zero


def test_4_gib_allocation_costs_only_what_is_touched():
    base = rss()
    buf = runtime.device_malloc(3, 4 * GiB)
    try:
        assert buf.nbytes == 4 * GiB
        assert runtime.get_device_memory_info(3).used == 4 * GiB
        assert rss() - base < RSS_LIMIT
        touch_ends(buf, 0x5A)
        check_ends(buf, 0x5A)
        # a zero-copy numpy view of the whole buffer does not commit it either
        view = np.asarray(buf)
        assert view.nbytes == 4 * GiB
        view[2 * GiB] = 7
        assert view[2 * GiB] == 7 and view[0] == 0x5A
        del view
        assert rss() - base < RSS_LIMIT
    finally:
        runtime.device_free(buf)
    assert runtime.get_device_memory_info(3).used == 0
    assert rss() - base < RSS_LIMIT


def test_4_gib_on_every_device():
    base = rss()
    bufs = [runtime.device_malloc(d, 4 * GiB) for d in range(8)]
    try:
        for d, b in enumerate(bufs):
            touch_ends(b, d + 1)
        for d, b in enumerate(bufs):
            check_ends(b, d + 1)
        assert rss() - base < RSS_LIMIT
    finally:
        for b in bufs:
            runtime.device_free(b)
    assert rss() - base < RSS_LIMIT


@pytest.mark.parametrize("reuse", [True, False])
def test_freed_large_block_is_reused_clean_without_committing_it(reuse):
    """Freeing a mostly untouched 4 GiB block must not commit its pages (zeroing a cached block
    by writing to it would), and the block comes back zeroed."""
    runtime.set_option("enableMemoryReuse", reuse)
    try:
        base = rss()
        for i in range(3):
            buf = runtime.device_malloc(5, 4 * GiB)
            out = np.empty(MiB, np.uint8)
            runtime.memcpy_device_to_host(out, buf)
            assert not out.any(), f"round {i}: reused block handed out dirty"
            runtime.memcpy_device_to_host(out, buf, src_offset=4 * GiB - MiB)
            assert not out.any(), f"round {i}: reused block handed out dirty"
            touch_ends(buf, 0x33)
            runtime.device_free(buf)
            # give the background scrubber time to zero the cached block; nothing here is
            # timed: it only lets a scrubber that writes the whole block show in RSS
            time.sleep(0.3)
            assert rss() - base < 256 * MiB
        runtime.empty_cache(5)
        s = runtime.memory_stats(5)
        assert s["cached"] == 0 and s["allocated"] == 0
        assert rss() - base < RSS_LIMIT
    finally:
        runtime.set_option("enableMemoryReuse", True)


def test_allocation_beyond_64_gib_is_out_of_memory():
    with pytest.raises(runtime.OutOfMemoryError, match=str(65 * GiB)):
        runtime.device_malloc(7, 65 * GiB)
    big = runtime.device_malloc(7, 32 * GiB)
    try:
        assert runtime.get_device_memory_info(7).used == 32 * GiB
    finally:
        runtime.device_free(big)
