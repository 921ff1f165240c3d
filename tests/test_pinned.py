"""Pinned host memory: malloc_host, pinned_empty, free_host, host_memory_stats, and the
stream-ordered copies that know it (pinned sources are read when the copy runs; pageable
sources are staged when it is queued)."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
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


@pytest.fixture
def stream():
    s = runtime.Stream(0)
    yield s
    s.synchronize(timeout=WAIT)
    s.destroy()


def gate(stream):
    """Block `stream` until the returned function is called (no timing involved)."""
    ev = threading.Event()
    stream.launch_host_func(lambda: ev.wait(WAIT))
    return ev.set


def test_malloc_host_is_a_writable_uint8_array_with_ptr():
    a = runtime.malloc_host(4096)
    assert isinstance(a, runtime.PinnedArray) and isinstance(a, np.ndarray)
    assert a.dtype == np.uint8 and a.shape == (4096,) and a.nbytes == 4096
    assert a.ptr == a.ctypes.data and a.ptr % 4096 == 0
    a[:] = 7
    assert int(a.sum()) == 7 * 4096


def test_pinned_empty_shape_and_dtype():
    a = runtime.pinned_empty((3, 5), np.float64)
    assert a.shape == (3, 5) and a.dtype == np.float64
    assert a.flags["C_CONTIGUOUS"] and a.flags["WRITEABLE"]
    a[...] = np.arange(15.0).reshape(3, 5)
    assert a[2, 4] == 14.0
    assert runtime.pinned_empty(7).dtype == np.float32


@pytest.mark.parametrize("bad", [-1, 2**70])
def test_malloc_host_bad_size(bad):
    with pytest.raises((ValueError, OverflowError, runtime.OutOfMemoryError)):
        runtime.malloc_host(bad)


def test_malloc_host_zero_bytes_is_not_counted_and_can_be_freed():
    before = runtime.host_memory_stats()
    a = runtime.malloc_host(0)
    b = runtime.pinned_empty((0, 4), "float32")
    assert a.nbytes == 0 and b.nbytes == 0
    assert runtime.host_memory_stats() == before  # no memory, no live allocation
    runtime.free_host(a)
    runtime.free_host(b)
    with pytest.raises(runtime.InvalidHandleError, match="freed"):
        runtime.free_host(a)
    del a, b
    gc.collect()
    assert runtime.host_memory_stats() == before


def test_the_pinned_cache_and_its_statistics_start_over_after_shutdown():
    live = runtime.malloc_host(10000)  # alive across the shutdown: still usable memory
    live[:] = 7
    cached = runtime.malloc_host(5000)
    del cached
    gc.collect()
    s = runtime.host_memory_stats()
    assert s["reserved_bytes.current"] > 0 and s["allocations.allocated"] > 0
    runtime.shutdown()
    runtime.init(device_count=2, memory="256MiB")
    s = runtime.host_memory_stats()
    assert all(v == 0 for v in s.values()), s  # nothing cached, nothing counted
    assert (live == 7).all()
    a = runtime.malloc_host(100)
    s = runtime.host_memory_stats()
    assert (s["allocations.current"], s["num_host_alloc"], s["cache_hits"]) == (1, 1, 0)
    del live  # handed out by the previous runtime: unmapped, not cached or counted
    gc.collect()
    assert runtime.host_memory_stats() == s
    del a


def test_pinned_empty_bad_shape():
    with pytest.raises(ValueError, match="shape"):
        runtime.pinned_empty((2, -1))


def test_malloc_host_mapped_flag():
    # numba: test_cuda_memory.py::TestCudaMemory::test_host_alloc (mapped=True)
    assert runtime.malloc_host(1024, mapped=True).nbytes == 1024
    with pytest.raises(TypeError, match="mapped"):
        runtime.malloc_host(16, mapped="yes")


def test_distinct_live_blocks_do_not_overlap():
    # cupy: tests/cupy_tests/cuda_tests/test_pinned_memory.py::TestSingleDeviceMemoryPool::test_alloc
    a, b = runtime.malloc_host(4096), runtime.malloc_host(4096)
    assert a.ptr != b.ptr
    assert a.ptr + 4096 <= b.ptr or b.ptr + 4096 <= a.ptr


def test_freed_block_is_reused_from_the_cache():
    # torch: test/test_cuda.py::TestCuda::test_caching_pinned_memory (first half)
    t = runtime.malloc_host(4)
    ptr = t.ptr
    del t
    gc.collect()
    assert runtime.malloc_host(4).ptr == ptr


def test_block_in_use_by_a_queued_copy_is_not_reused(stream):
    # torch: test/test_cuda.py::TestCuda::test_caching_pinned_memory (second half): the copy
    # is held back by a gate instead of torch.cuda._sleep.
    t = runtime.pinned_empty(1, np.float32)
    t[0] = 1.0
    ptr = t.ptr
    dev = runtime.zeros(1, np.float32)
    release = gate(stream)
    runtime.memcpy_host_to_device(dev, t, stream)
    del t
    gc.collect()
    t2 = runtime.pinned_empty(1, np.float32)
    assert t2.ptr != ptr, "pinned block reused while a queued copy reads it"
    release()
    stream.synchronize(timeout=WAIT)
    assert dev.copy_to_host().tolist() == [1.0]


def later(release):
    """Open a gate from another thread while the caller is inside a call that waits for it."""
    threading.Timer(0.02, release).start()


def test_copies_queued_into_pageable_memory_are_complete_when_the_call_returns(stream):
    # CUDA's rule (cudaMemcpyAsync into pageable memory returns once the copy is done; Numba's
    # test_cuda_driver_stream_operations reads its array right after device_to_host(stream=)):
    # every device-to-host path queued behind held work returns with the bytes there.
    want = np.arange(64, dtype=np.uint8)
    dev = runtime.to_device(want)
    paths = {
        "memcpy_device_to_host": lambda out: runtime.memcpy_device_to_host(out, dev, stream),
        "_async": lambda out: runtime.memcpy_device_to_host_async(out, dev, stream),
        "copy_to_host": lambda out: dev.copy_to_host(out, stream=stream),
        "offsets": lambda out: runtime.memcpy_device_to_host(
            out, dev, stream, count=64, dst_offset=0, src_offset=0
        ),
        "memcpy_2d d2h": lambda out: runtime.memcpy_2d(out, 8, dev, 8, 8, 8, stream),
        "memcpy_2d h2h": lambda out: runtime.memcpy_2d(out, 8, want, 8, 8, 8, stream),
    }
    for name, copy in paths.items():
        out = np.zeros(64, np.uint8)
        later(gate(stream))
        copy(out)
        assert out.tolist() == want.tolist(), name
        if name != "copy_to_host":  # which takes numpy arrays only
            out = bytearray(64)  # any pageable buffer
            later(gate(stream))
            copy(out)
            assert bytes(out) == want.tobytes(), name
    # The ACL face's acl.rt.memcpy_async: test_acl.py
    # test_memcpy_async_into_pageable_host_memory_is_complete_on_return.


def test_copies_queued_into_pinned_memory_stay_asynchronous(stream):
    want = np.arange(64, dtype=np.uint8)
    dev = runtime.to_device(want)
    for name, copy in {
        "memcpy_device_to_host": lambda out: runtime.memcpy_device_to_host(out, dev, stream),
        "copy_to_host": lambda out: dev.copy_to_host(out, stream=stream),
        "memcpy_2d d2h": lambda out: runtime.memcpy_2d(out, 8, dev, 8, 8, 8, stream),
        "memcpy_2d h2h": lambda out: runtime.memcpy_2d(out, 8, want, 8, 8, 8, stream),
    }.items():
        out = runtime.malloc_host(64)
        out[:] = 0
        release = gate(stream)
        copy(out)  # returns at once: the stream is held
        assert (out == 0).all() and not stream.query(), name
        release()
        stream.synchronize(timeout=WAIT)
        assert out.tolist() == want.tolist(), name


def test_a_copy_into_pageable_memory_reports_the_streams_error_instead_of_stale_bytes(stream):
    dev = runtime.to_device(np.arange(8, dtype=np.uint8))

    def boom():
        raise ValueError("earlier work failed")

    stream.launch_kernel(boom)
    out = np.zeros(8, np.uint8)
    with pytest.raises(runtime.KernelError, match="earlier work failed"):
        runtime.memcpy_device_to_host(out, dev, stream)
    assert (out == 0).all()  # skipped behind the failure, and the caller is told
    runtime.memcpy_device_to_host(out, dev, stream)
    assert out.tolist() == list(range(8))


def test_pinned_source_is_read_when_the_copy_runs(stream):
    src = runtime.pinned_empty(256, np.int32)
    src[:] = 1
    dev = runtime.zeros(256, np.int32)
    release = gate(stream)
    runtime.memcpy_host_to_device(dev, src, stream)
    src[:] = 2  # before the stream reaches the copy: a truly asynchronous copy sees it
    release()
    stream.synchronize(timeout=WAIT)
    assert (dev.copy_to_host() == 2).all()


def test_pageable_source_is_staged_when_queued(stream):
    src = np.ones(256, np.int32)
    dev = runtime.zeros(256, np.int32)
    release = gate(stream)
    runtime.memcpy_host_to_device(dev, src, stream)
    src[:] = 2  # the call returned: the source may be reused (CUDA's rule for pageable memory)
    release()
    stream.synchronize(timeout=WAIT)
    assert (dev.copy_to_host() == 1).all()


def test_pageable_source_on_an_idle_stream_is_copied_at_once(stream):
    """On an idle stream a queued copy from pageable memory runs at once, reading the source
    where it is (no staging copy): the stream has nothing pending when the call returns, the
    trace shows the copy run by the caller, and reusing the source changes nothing."""
    src = np.ones(256, np.int32)
    dev = runtime.zeros(256, np.int32)
    stream.synchronize(timeout=WAIT)
    with runtime.profile() as records:
        runtime.memcpy_host_to_device(dev, src, stream)
        assert stream.query()
    src[:] = 2
    stream.synchronize(timeout=WAIT)
    assert (dev.copy_to_host() == 1).all()
    (run,) = [r for r in records if r["phase"] == "run" and r["name"] == "memcpy_h2d"]
    assert run["engine"] == "caller"


def test_pinned_slice_source_and_offsets(stream):
    src = runtime.pinned_empty(64, np.uint8)
    src[:] = np.arange(64, dtype=np.uint8)
    dev = runtime.zeros(16, np.uint8)
    runtime.memcpy_host_to_device(dev, src[8:24], stream)
    stream.synchronize(timeout=WAIT)
    assert dev.copy_to_host().tolist() == list(range(8, 24))


def test_device_to_pinned_copy(stream):
    dev = runtime.to_device(np.arange(32, dtype=np.float32))
    dst = runtime.pinned_empty(32, np.float32)
    runtime.memcpy_device_to_host(dst, dev, stream)
    stream.synchronize(timeout=WAIT)
    assert dst.tolist() == list(range(32))


def test_free_host_refuses_later_queued_copies_and_double_free(stream):
    a = runtime.malloc_host(64)
    dev = runtime.zeros(64, np.uint8)
    runtime.free_host(a)
    with pytest.raises(runtime.InvalidHandleError, match="free_host"):
        runtime.memcpy_host_to_device(dev, a, stream)
    with pytest.raises(runtime.InvalidHandleError):
        runtime.free_host(a)


def test_free_host_while_a_copy_is_in_flight_is_safe(stream):
    a = runtime.pinned_empty(1024, np.uint8)
    a[:] = 5
    dev = runtime.zeros(1024, np.uint8)
    release = gate(stream)
    runtime.memcpy_host_to_device(dev, a, stream)
    runtime.free_host(a)
    del a
    gc.collect()
    release()
    stream.synchronize(timeout=WAIT)
    assert (dev.copy_to_host() == 5).all()


@pytest.mark.parametrize("bad", [np.zeros(8, np.uint8), bytearray(8)])
def test_free_host_refuses_memory_that_is_not_pinned(bad):
    with pytest.raises(ValueError, match="not the start of pinned host memory"):
        runtime.free_host(bad)


def test_free_host_refuses_an_interior_slice():
    a = runtime.malloc_host(64)
    with pytest.raises(ValueError, match="not the start"):
        runtime.free_host(a[8:])


def test_free_host_wrong_type():
    with pytest.raises(TypeError):
        runtime.free_host(3)


def test_host_memory_stats_count_live_blocks_and_the_cache():
    # torch: test/test_cuda.py::TestCuda::test_host_memory_stats (counters follow allocations)
    gc.collect()
    runtime.host_empty_cache()
    before = runtime.host_memory_stats()
    a = runtime.malloc_host(3000)  # a 4 KiB block
    s = runtime.host_memory_stats()
    assert s["allocations.current"] == before["allocations.current"] + 1
    assert s["allocated_bytes.current"] == before["allocated_bytes.current"] + 4096
    assert s["allocations.allocated"] == before["allocations.allocated"] + 1
    del a
    gc.collect()
    s = runtime.host_memory_stats()
    assert s["allocations.current"] == before["allocations.current"]
    assert s["allocations.freed"] == before["allocations.freed"] + 1
    assert s["reserved_bytes.current"] >= before["reserved_bytes.current"] + 4096  # cached
    runtime.host_empty_cache()
    s = runtime.host_memory_stats()
    assert s["reserved_bytes.current"] == s["allocated_bytes.current"]


def test_is_pinned_reports_the_lock():
    a = runtime.malloc_host(4096)
    assert isinstance(a.is_pinned, bool)
    assert not runtime.PinnedArray.__new__(runtime.PinnedArray, (1,)).is_pinned


def test_mlock_refused_warns_and_still_works(tmp_path):
    # With RLIMIT_MEMLOCK at 0 the OS refuses to lock: the memory is handed out as pageable,
    # with a RuntimeWarning. A process with CAP_IPC_LOCK ignores the limit (then: skipped).
    code = textwrap.dedent(
        """
        import resource, warnings
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (0, resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]))
        import numpy as np, runtime
        runtime.init(device_count=1, memory="64MiB")
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            a = runtime.malloc_host(1 << 20)
        a[:] = 3
        d = runtime.to_device(np.zeros(1 << 20, np.uint8))
        s = runtime.Stream()
        runtime.memcpy_host_to_device(d, a, s)
        s.synchronize()
        assert (d.copy_to_host() == 3).all()
        print("LOCKED" if a.is_pinned else "UNLOCKED", [str(x.category.__name__) for x in w])
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    if out.stdout.startswith("LOCKED"):
        pytest.skip("this process may lock memory beyond RLIMIT_MEMLOCK (CAP_IPC_LOCK)")
    assert out.stdout.startswith("UNLOCKED") and "RuntimeWarning" in out.stdout


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork()")
def test_pinned_memory_works_in_a_forked_child():
    import os

    a = runtime.malloc_host(4096)
    a[:] = 4
    pid = os.fork()
    if pid == 0:  # the child: inherited arrays stay readable, new blocks can be allocated
        code = 1
        try:
            runtime.init(device_count=1, memory="64MiB")
            b = runtime.malloc_host(4096)
            b[:] = a
            d = runtime.to_device(np.zeros(4096, np.uint8))
            runtime.memcpy_host_to_device(d, b)
            code = 0 if (d.copy_to_host() == 4).all() else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


# cupy: tests/cupy_tests/cuda_tests/test_pinned_memory.py::TestSingleDeviceMemoryPool::test_free
def test_pool_free_reuses_the_block():
    p1 = runtime.malloc_host(1000)
    ptr1 = p1.ptr
    del p1
    assert runtime.malloc_host(1000).ptr == ptr1


# cupy: ...::TestSingleDeviceMemoryPool::test_free_different_size. CuPy's pool rounds to 512
# bytes, so 1000 and 2000 bytes differ there; here blocks are whole pages rounded to a power of
# two, so the sizes must differ in block size (4 KiB and 8 KiB).
def test_pool_free_different_block_size_is_not_reused():
    p1 = runtime.malloc_host(4000)
    ptr1 = p1.ptr
    del p1
    p2 = runtime.malloc_host(8000)
    assert p2.ptr != ptr1


# cupy: ...::TestSingleDeviceMemoryPool::test_free_all_blocks. CuPy asserts a new pointer;
# a fresh mapping may land at the address just unmapped, so what is checked is that the
# block was not served from the cache.
def test_pool_empty_cache_maps_afresh():
    p1 = runtime.malloc_host(1000)
    del p1
    runtime.host_empty_cache()
    before = runtime.host_memory_stats()
    runtime.malloc_host(1000)
    after = runtime.host_memory_stats()
    assert after["num_host_alloc"] == before["num_host_alloc"] + 1
    assert after["cache_hits"] == before["cache_hits"]


# cupy: tests/cupyx_tests/test_pinned_array.py (TestBasic / TestBasicLike): the cupyx
# creation functions against numpy's, for shape, dtype, layout and values, over pinned memory.
@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int16", "complex64"])
@pytest.mark.parametrize("shape", [(), 0, 5, (2, 3), (2, 0, 4)])
def test_zeros_and_empty_pinned_match_numpy(shape, dtype, order):
    z = runtime.zeros_pinned(shape, dtype, order)
    want = np.zeros(shape, dtype, order)
    assert isinstance(z, runtime.PinnedArray)
    assert (z.shape, z.dtype) == (want.shape, want.dtype)
    assert z.flags["C_CONTIGUOUS"] == want.flags["C_CONTIGUOUS"]
    assert z.flags["F_CONTIGUOUS"] == want.flags["F_CONTIGUOUS"]
    np.testing.assert_array_equal(z, want)
    e = runtime.pinned_empty(shape, dtype, order)
    assert (e.shape, e.dtype, e.flags["F_CONTIGUOUS"]) == (
        want.shape,
        want.dtype,
        want.flags["F_CONTIGUOUS"],
    )


@pytest.mark.parametrize("order", ["C", "F", "A", "K"])
@pytest.mark.parametrize("src_order", ["C", "F"])
@pytest.mark.parametrize("shape", [None, (6,), (3, 4)])
def test_like_pinned_match_numpy(order, src_order, shape):
    a = np.asarray(np.arange(12, dtype=np.float32).reshape(3, 4), order=src_order)
    want = np.zeros_like(a, order=order, shape=shape)
    for f in (runtime.zeros_like_pinned, runtime.empty_like_pinned):
        got = f(a, order=order, shape=shape)
        assert isinstance(got, runtime.PinnedArray)
        assert (got.shape, got.dtype) == (want.shape, want.dtype)
        assert got.flags["F_CONTIGUOUS"] == want.flags["F_CONTIGUOUS"]
        assert got.flags["C_CONTIGUOUS"] == want.flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(runtime.zeros_like_pinned(a, order=order, shape=shape), want)
    assert runtime.zeros_like_pinned(a, dtype=np.int8).dtype == np.int8


def test_pinned_creation_counts_in_the_host_statistics_and_refuses_bad_arguments():
    before = runtime.host_memory_stats()["allocated_bytes.current"]
    z = runtime.zeros_pinned((4, 4), "float64")
    assert runtime.host_memory_stats()["allocated_bytes.current"] >= before + z.nbytes
    with pytest.raises(ValueError, match="order"):
        runtime.zeros_pinned(4, order="X")
    with pytest.raises(ValueError, match="order"):
        runtime.empty_like_pinned(z, order="Z")
    with pytest.raises(ValueError, match="shape"):
        runtime.zeros_pinned((2, -1))


def test_a_queued_copy_into_zeros_pinned_is_asynchronous(stream):
    # pinned destinations are written when the stream gets there (pageable ones on return)
    src = runtime.to_device(np.arange(1000, dtype=np.float32))
    dst = runtime.zeros_like_pinned(np.empty(1000, np.float32))
    gate = threading.Event()
    stream.launch_host_func(gate.wait, WAIT)
    runtime.memcpy_device_to_host(dst, src, stream)
    assert not stream.query()
    assert not dst.any()
    gate.set()
    stream.synchronize(WAIT)
    np.testing.assert_array_equal(dst, np.arange(1000, dtype=np.float32))


# --------------------------------------------------------- registered memory (host_register)


# numba: numba/cuda/tests/cudadrv/test_pinned.py::TestPinned::test_pinned (cuda.pinned(A):
# to_device, copy_to_device and copy_to_host of A on a stream, then synchronize).
def test_pinned_context_round_trip(stream):
    a = np.arange(2 * 1024 * 1024 // 8, dtype=np.int64)
    a0 = a.copy()
    with runtime.pinned(a):
        assert runtime.host_is_registered(a)
        dev = runtime.to_device(a, stream=stream)
        runtime.memcpy_host_to_device(dev, a, stream)
        dev.copy_to_host(a, stream=stream)
        stream.synchronize(timeout=WAIT)
    assert not runtime.host_is_registered(a)
    assert (a == a0).all()


def test_registered_source_is_read_when_the_copy_runs(stream):
    # As malloc_host memory (test_pinned_source_is_read_when_the_copy_runs): no staging.
    src = np.ones(256, np.int32)
    dev = runtime.zeros(256, np.int32)
    runtime.host_register(src)
    release = gate(stream)
    runtime.memcpy_host_to_device(dev, src, stream)
    src[:] = 2  # before the stream reaches the copy: the copy sees it
    release()
    stream.synchronize(timeout=WAIT)
    runtime.host_unregister(src)
    assert (dev.copy_to_host() == 2).all()


def test_copies_into_registered_memory_stay_asynchronous(stream):
    want = np.arange(64, dtype=np.uint8)
    dev = runtime.to_device(want)
    out = np.zeros(64, np.uint8)
    with runtime.pinned(out):
        release = gate(stream)
        runtime.memcpy_device_to_host(out, dev, stream)  # returns at once: the stream is held
        assert (out == 0).all() and not stream.query()
        release()
        stream.synchronize(timeout=WAIT)
    assert out.tolist() == want.tolist()


def test_unregister_is_refused_while_a_queued_copy_uses_the_memory(stream):
    # The choice: refuse (NotReadyError, nothing changes), not wait.
    for direction in ("h2d", "d2h"):
        host = np.zeros(1024, np.uint8)
        dev = runtime.zeros(1024, np.uint8)
        runtime.host_register(host)
        release = gate(stream)
        if direction == "h2d":
            runtime.memcpy_host_to_device(dev, host, stream)
        else:
            runtime.memcpy_device_to_host(host, dev, stream)
        with pytest.raises(runtime.NotReadyError, match="registered host memory"):
            runtime.host_unregister(host)
        assert runtime.host_is_registered(host)
        release()
        stream.synchronize(timeout=WAIT)
        runtime.host_unregister(host)
        assert not runtime.host_is_registered(host)


def test_registration_keeps_the_array_alive_until_unregistered():
    import weakref

    a = np.ones(4096, np.float32)
    ref = weakref.ref(a)
    runtime.host_register(a)
    del a
    gc.collect()
    a = ref()
    assert a is not None, "the registration must hold the array"
    with pytest.raises(ValueError):
        a.resize(8192, refcheck=False)  # exported: numpy refuses to move its memory
    runtime.host_unregister(a)
    del a
    gc.collect()
    assert ref() is None


def test_register_misuse_is_refused_and_changes_nothing():
    a = np.ones(64, np.uint8)
    runtime.host_register(a)
    with pytest.raises(ValueError, match="overlaps the registered range"):
        runtime.host_register(a)
    with pytest.raises(ValueError, match="overlaps the registered range"):
        runtime.host_register(a[8:16])  # inside a registered range
    runtime.host_unregister(a)
    with pytest.raises(ValueError, match="no memory is registered"):
        runtime.host_unregister(a)
    with pytest.raises(ValueError, match="no memory is registered"):
        runtime.host_unregister(np.ones(8))
    with pytest.raises(ValueError, match="empty"):
        runtime.host_register(np.ones(0))
    p = runtime.malloc_host(64)
    with pytest.raises(ValueError, match="malloc_host"):
        runtime.host_register(p)
    runtime.free_host(p)
    # A numpy view of device memory: the buffer's own tracker orders it, not a registration.
    d = runtime.to_device(np.ones(64, np.uint8))
    with pytest.raises(ValueError, match="overlaps device memory"):
        runtime.host_register(np.asarray(d))
    with pytest.raises(ValueError, match="C-contiguous"):
        runtime.host_register(np.ones((4, 4))[:, ::2])
    with pytest.raises(TypeError, match="arr"):
        runtime.host_register(3)
    with pytest.raises(ValueError, match="flags"):
        runtime.host_register(np.ones(8), flags=0x100)
    with pytest.raises(TypeError, match="flags"):
        runtime.host_register(np.ones(8), flags="portable")


def test_pinned_context_unregisters_what_it_registered_on_failure():
    a, b = np.ones(16), np.ones(16)
    runtime.host_register(b)
    with pytest.raises(ValueError, match="overlaps"):
        with runtime.pinned(a, b):
            pass
    assert not runtime.host_is_registered(a)  # undone
    runtime.host_unregister(b)


# ------------------------------------------------------------------- alloc_pinned_memory
# Translated from CuPy tests/cupy_tests/cuda_tests/test_pinned_memory.py, TestMemoryPointer
# (test_int, test_add, test_sub; rewritten here over real pinned blocks instead of CuPy's
# MockMemory), with the semantics of cupy/cuda/pinned_memory.pyx's PinnedMemoryPointer:
# `+`/`-` make new pointers into the same block, `+=`/`-=` move the pointer itself, size() is
# the bytes to the block's end, and the buffer protocol starts at the pointer.


def test_pinned_pointer_int():
    p = runtime.alloc_pinned_memory(1)
    assert isinstance(p, runtime.PinnedMemoryPointer)
    assert isinstance(p.mem, runtime.PinnedMemory)
    assert int(p) == p.ptr == p.mem.ptr and p.ptr % 4096 == 0
    assert p.size() == p.mem.size == p.mem.nbytes == 1


def test_pinned_pointer_add():
    p = runtime.alloc_pinned_memory(8)
    base = p.ptr
    p2 = p + 4
    assert isinstance(p2, runtime.PinnedMemoryPointer)
    assert int(p2) == base + 4 and p2.mem is p.mem and p2.size() == 4
    p3 = 4 + p
    assert isinstance(p3, runtime.PinnedMemoryPointer) and int(p3) == base + 4
    same = p
    p += 4
    assert p is same  # in place, as CuPy's __iadd__
    assert isinstance(p, runtime.PinnedMemoryPointer) and int(p) == base + 4
    assert p.size() == 4
    assert int(p + np.int64(2)) == base + 6  # any int-like count


def test_pinned_pointer_sub():
    p = runtime.alloc_pinned_memory(8) + 4
    base = p.ptr - 4
    p2 = p - 4
    assert isinstance(p2, runtime.PinnedMemoryPointer) and int(p2) == base
    p -= 4
    assert isinstance(p, runtime.PinnedMemoryPointer) and int(p) == base
    assert p.size() == 8


def test_pinned_pointer_compares_by_address():
    p = runtime.alloc_pinned_memory(16)
    q = p + 8
    assert p == p.ptr and q == p.ptr + 8 and q != p.ptr
    assert p < q and q > p and p <= p + 0 and q >= p.ptr + 8
    assert p + 8 == q and p + 8 is not q
    assert (p == "x") is False and p != None  # noqa: E711 - other types are unequal
    with pytest.raises(TypeError):
        _ = p < "x"


def test_pinned_pointer_is_a_writable_buffer_from_the_pointer_on():
    p = runtime.alloc_pinned_memory(64)
    whole = np.frombuffer(p, dtype=np.uint8)
    assert whole.shape == (64,) and whole.flags["WRITEABLE"]
    whole[:] = np.arange(64, dtype=np.uint8)
    tail = np.frombuffer(p + 16, dtype=np.int32, count=2)
    assert tail.tolist() == np.arange(16, 24, dtype=np.uint8).view(np.int32).tolist()
    tail[:] = [-1, -2]
    assert whole[16:24].view(np.int32).tolist() == [-1, -2]
    mv = memoryview(p + 60)
    assert mv.nbytes == 4 and not mv.readonly and bytes(mv) == bytes(whole[60:])
    assert memoryview(p + 64).nbytes == 0  # one past the end: empty


def test_pinned_pointer_buffer_keeps_the_block_alive():
    gc.collect()
    before = runtime.host_memory_stats()["allocations.current"]
    p = runtime.alloc_pinned_memory(32)
    view = np.frombuffer(p + 8, dtype=np.uint8)
    view[:] = 5
    del p
    gc.collect()
    # the block is still in use through the array over the pointer
    assert runtime.host_memory_stats()["allocations.current"] == before + 1
    assert (view == 5).all() and view.size == 24
    del view
    gc.collect()
    assert runtime.host_memory_stats()["allocations.current"] == before


def test_pinned_pointer_stays_within_its_block():
    p = runtime.alloc_pinned_memory(8)
    with pytest.raises(ValueError, match=r"by 9 .*8-byte pinned block"):
        p + 9
    with pytest.raises(ValueError, match=r"by -1 .*8-byte"):
        p - 1
    q = p + 8
    with pytest.raises(ValueError, match="at byte 8 by 1"):
        q += 1
    assert int(q) == p.ptr + 8  # a refused move changes nothing
    with pytest.raises(ValueError, match="offset"):
        runtime.PinnedMemoryPointer(p.mem, 9)
    with pytest.raises(TypeError):
        p + 1.5
    with pytest.raises(TypeError):
        p + True
    with pytest.raises(TypeError):
        p - p
    with pytest.raises(TypeError):
        q -= "1"


def test_pinned_pointer_source_is_read_when_the_copy_runs(stream):
    # A copy from a pointer into pinned memory is a pinned copy: read when the stream runs it.
    p = runtime.alloc_pinned_memory(256 * 4 + 64)
    src = np.frombuffer(p + 64, dtype=np.int32, count=256)
    src[:] = 1
    dev = runtime.zeros(256, np.int32)
    release = gate(stream)
    runtime.memcpy_host_to_device(dev, p + 64, stream)
    src[:] = 2
    release()
    stream.synchronize(timeout=WAIT)
    assert (dev.copy_to_host() == 2).all()


def test_alloc_pinned_memory_zero_and_bad_sizes():
    p = runtime.alloc_pinned_memory(0)
    assert p.size() == 0 and memoryview(p).nbytes == 0 and p + 0 == p
    with pytest.raises(ValueError, match="nbytes"):
        runtime.alloc_pinned_memory(-1)
    with pytest.raises(TypeError, match="nbytes"):
        runtime.alloc_pinned_memory("8")
