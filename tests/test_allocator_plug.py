"""Pluggable allocation: ``set_allocator(alloc, free)`` routes every allocation of the Python
API through a Python allocator, which hands back ``DeviceBuffer`` objects the runtime made
(from ``MemoryPool.malloc`` or a slice of one); the runtime validates them. Translated from
CuPy's tests/cupy_tests/cuda_tests/test_memory.py (TestAllocator.test_set_allocator,
test_reuse_between_thread; TestAllocatorDefault.test / test_none) and modelled on torch's
``CUDAPluggableAllocator`` (alloc/free pairs, test_cuda.py test_pluggable_allocator)."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

import runtime

KiB = 1 << 10


@pytest.fixture(scope="module", autouse=True)
def rt():
    runtime.shutdown()
    runtime.init(device_count=2, memory="64MiB")
    yield
    runtime.set_allocator(None)
    runtime.shutdown()


@pytest.fixture
def pool():
    p = runtime.get_default_memory_pool()
    yield p
    runtime.set_allocator(None)
    p.free_all_blocks()


class Recorder:
    """A plugged allocator that takes its memory from the pool and records the calls."""

    def __init__(self, pool):
        self.pool = pool
        self.allocs: list[tuple[int, int, object]] = []
        self.frees: list[tuple[int, int]] = []
        self.out: dict[int, object] = {}

    def alloc(self, nbytes, device, stream):
        self.allocs.append((nbytes, device, stream))
        buf = runtime.get_default_memory_pool(device).malloc(nbytes)
        self.out[id(buf)] = buf
        return buf

    def free(self, buf, nbytes, device):
        assert self.out.pop(id(buf)) is buf
        self.frees.append((nbytes, device))


def test_set_allocator_routes_every_allocation(pool):
    # CuPy TestAllocator.test_set_allocator
    rec = Recorder(pool)
    runtime.set_allocator(rec.alloc, rec.free)
    assert runtime.get_allocator() == (rec.alloc, rec.free)
    used = pool.used_bytes()
    a = runtime.device_malloc(0, 1000)
    b = runtime.empty((128,), dtype=np.int64)
    c = runtime.to_device(np.arange(10, dtype=np.float32))
    d = runtime.zeros((4, 4), device=1)
    assert [x[:2] for x in rec.allocs] == [(1000, 0), (1024, 0), (40, 0), (64, 1)]
    assert all(isinstance(x[2], runtime.Stream) for x in rec.allocs)
    assert rec.allocs[0][2] == runtime.current_stream(0)
    assert pool.used_bytes() - used == 1024 + 1024 + 64
    np.testing.assert_array_equal(c.copy_to_host(), np.arange(10, dtype=np.float32))
    assert b.nbytes == 1024 and d.shape == (4, 4)
    runtime.device_free(a)
    assert rec.frees == [(1000, 0)]
    del b, c, d
    runtime.device_free(runtime.device_malloc(0, 1))
    assert sorted(rec.frees) == sorted([(1000, 0), (1024, 0), (40, 0), (64, 1), (1, 0)])
    assert rec.out == {}


def test_set_allocator_none_restores_the_pool(pool):
    # CuPy TestAllocatorDefault.test / test_none: after set_allocator() the plugged function
    # is no longer called.
    rec = Recorder(pool)
    runtime.set_allocator(rec.alloc)
    runtime.set_allocator()
    assert runtime.get_allocator() is None
    runtime.device_malloc(0, 100)
    runtime.set_allocator(rec.alloc, rec.free)
    runtime.set_allocator(None)
    runtime.device_malloc(0, 100)
    assert rec.allocs == []


def test_allocator_without_free_lets_the_object_go(pool):
    # CuPy's style: no free function; the block lives as long as the runtime uses it.
    before = pool.used_bytes()
    runtime.set_allocator(lambda n, dev, s: pool.malloc(n))
    a = runtime.device_malloc(0, 5000)
    assert pool.used_bytes() == before + 5120  # its slab class
    runtime.device_free(a)
    assert pool.used_bytes() == before


def test_sub_allocating_from_one_buffer(pool):
    # A bump allocator carving blocks out of one pool buffer by slicing it.
    arena = pool.malloc(64 * KiB)
    state = {"next": 0, "freed": []}

    def alloc(n, dev, stream):
        off = state["next"]
        state["next"] += (n + 255) // 256 * 256
        return arena[off : off + n]

    def free(buf, n, dev):
        state["freed"].append(buf.offset)

    runtime.set_allocator(alloc, free)
    x = runtime.device_malloc(0, 100)
    y = runtime.to_device(np.full(50, 7, np.uint8))
    assert x.ptr == arena.ptr and y.ptr == arena.ptr + 256
    # Handed out zeroed and bounded by the request.
    arena_host = np.asarray(arena)
    arena_host[:100] = 1
    runtime.device_free(x)
    z = runtime.device_malloc(0, 10)
    np.testing.assert_array_equal(np.asarray(z), np.zeros(10, np.uint8))
    np.testing.assert_array_equal(arena_host[256:306], np.full(50, 7, np.uint8))
    with pytest.raises(ValueError):
        runtime.memset(y, 1, 51)
    del y, z
    runtime.device_free(runtime.device_malloc(0, 1))
    assert sorted(state["freed"]) == [0, 256, 512, 768]


def test_reuse_between_threads(pool):
    # CuPy TestAllocator.test_reuse_between_thread
    rec = Recorder(pool)
    runtime.set_allocator(rec.alloc, rec.free)
    errors = []

    def job():
        try:
            runtime.device_free(runtime.device_malloc(0, 16))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    job()
    t = threading.Thread(target=job)
    t.start()
    t.join()
    assert errors == []
    assert len(rec.allocs) == 2 and len(rec.frees) == 2


def test_allocations_inside_the_allocator_use_the_pool(pool):
    calls = []

    def alloc(n, dev, stream):
        calls.append(n)
        return runtime.device_malloc(dev, n)  # not routed back into alloc

    runtime.set_allocator(alloc)
    runtime.device_malloc(0, 33)
    assert calls == [33]


def test_exceptions_and_bad_blocks(pool):
    class Boom(Exception):
        pass

    def raising(n, dev, stream):
        raise Boom("no memory for you")

    runtime.set_allocator(raising)
    with pytest.raises(Boom, match="no memory for you"):
        runtime.device_malloc(0, 10)

    freed = []
    runtime.set_allocator(lambda n, d, s: 1234, lambda *a: freed.append(a))
    with pytest.raises(TypeError, match="must return a DeviceBuffer.*got int"):
        runtime.device_malloc(0, 10)

    small = pool.malloc(8)
    runtime.set_allocator(lambda n, d, s: small, lambda *a: freed.append(a))
    with pytest.raises(ValueError, match="returned 8 bytes for a request of 9"):
        runtime.device_malloc(0, 9)
    # The refused block is given back to free.
    runtime.device_free(pool.malloc(1))
    assert freed == [(small, 8, 0)]

    other = runtime.get_default_memory_pool(1).malloc(64)
    runtime.set_allocator(lambda n, d, s: other)
    with pytest.raises(ValueError, match="not memory of that device"):
        runtime.device_malloc(0, 10)

    dead = pool.malloc(64)
    runtime.device_free(dead)
    runtime.set_allocator(lambda n, d, s: dead)
    with pytest.raises(runtime.InvalidHandleError):
        runtime.device_malloc(0, 10)


def test_an_allocator_exception_left_by_the_acl_face_is_not_raised_later(pool):
    """`acl.rt.malloc` answers a failing plugged allocator with an error code and leaves its
    exception unread; a later failure the allocator did not cause raises its own error."""
    from runtime import acl

    class Boom(Exception):
        pass

    def raising(n, dev, stream):
        raise Boom("no memory for you")

    runtime.set_allocator(raising)
    assert acl.init() == 0
    try:
        assert acl.rt.set_device(0) == 0
        _, ret = acl.rt.malloc(10, 0)
        assert ret != 0
    finally:
        assert acl.finalize() == 0
    assert runtime.is_initialized()  # acl.init found it started: finalize leaves it
    small = pool.malloc(8)
    runtime.set_allocator(lambda n, d, s: small)
    with pytest.raises(ValueError, match="returned 8 bytes for a request of 9"):
        runtime.device_malloc(0, 9)


def test_set_allocator_argument_errors(pool):
    with pytest.raises(TypeError, match="alloc must be callable"):
        runtime.set_allocator(3)
    with pytest.raises(TypeError, match="free must be callable"):
        runtime.set_allocator(lambda *a: None, "x")
    with pytest.raises(ValueError, match="free: given without alloc"):
        runtime.set_allocator(None, lambda *a: None)
    assert runtime.get_allocator() is None


def test_reinit_restores_the_pool(pool):
    runtime.set_allocator(lambda n, d, s: 1)
    runtime.shutdown()
    runtime.init(device_count=2, memory="64MiB")
    assert runtime.get_allocator() is None
    runtime.device_malloc(0, 10)


def test_our_own_memory_pool_plugs_in(pool):
    # runtime.set_allocator(pool.malloc, pool.free) with the runtime's own MemoryPool, and
    # CuPy's idiom set_allocator(MemoryPool().malloc) (cupy/cuda/memory.pyx: the allocator is
    # called with the size only; ours is called as alloc(nbytes, device, stream), which the
    # pool's malloc takes), on every device.
    p = runtime.MemoryPool()
    runtime.set_allocator(p.malloc, p.free)
    assert runtime.get_allocator() == (p.malloc, p.free)
    for dev in (0, 1):
        used = runtime.MemoryPool(dev).used_bytes()
        x = runtime.to_device(np.arange(1000, dtype=np.float32), device=dev)
        assert x.device == runtime.Device(dev)
        assert x.copy_to_host().tolist() == list(range(1000))
        assert runtime.MemoryPool(dev).used_bytes() > used
        del x
        gc.collect()
        runtime.device_malloc(dev, 1)  # drains the frees queued for the plugged free
        assert runtime.MemoryPool(dev).used_bytes() <= used + 512
    runtime.set_allocator(runtime.MemoryPool().malloc)
    y = runtime.empty((4, 4), "float64", device=1)
    assert y.nbytes == 128 and y.device == runtime.Device(1)
    runtime.set_allocator(None)
    with pytest.raises(TypeError, match="buf"):
        p.free(3)
    with pytest.raises(runtime.InvalidDeviceError):
        p.malloc(16, 9)
    z = p.malloc(16, 1)
    assert z.device == runtime.Device(1)
    p.free(z, 16, 1)
    assert z.freed


# cupy: tests/cupy_tests/cuda_tests/test_memory.py::TestAllocator (using_allocator):
# allocations inside the block go through the allocator given, the one before comes back
# after it, nested blocks unwind in order, and an exception in the body still restores.
def test_using_allocator_plugs_for_the_block_and_restores(pool):
    outer, inner = Recorder(pool), Recorder(pool)
    assert runtime.get_allocator() is None
    with runtime.using_allocator(outer.alloc, outer.free):
        a = runtime.device_malloc(0, 100)
        with runtime.using_allocator(inner.alloc, inner.free):
            b = runtime.device_malloc(0, 200)
        assert runtime.get_allocator() == (outer.alloc, outer.free)
        c = runtime.device_malloc(0, 300)
    assert runtime.get_allocator() is None
    d = runtime.device_malloc(0, 400)
    assert [n for n, _, _ in outer.allocs] == [100, 300]
    assert [n for n, _, _ in inner.allocs] == [200]
    del a, b, c, d
    gc.collect()
    with pytest.raises(ZeroDivisionError):
        with runtime.using_allocator(outer.alloc, outer.free):
            raise ZeroDivisionError
    assert runtime.get_allocator() is None


def test_using_allocator_none_means_the_built_in_pool_inside(pool):
    rec = Recorder(pool)
    runtime.set_allocator(rec.alloc, rec.free)
    with runtime.using_allocator():
        assert runtime.get_allocator() is None
        runtime.device_malloc(0, 64)
    assert runtime.get_allocator() == (rec.alloc, rec.free)
    assert rec.allocs == []


def test_using_allocator_checks_its_arguments_before_plugging(pool):
    with pytest.raises(TypeError):
        with runtime.using_allocator(3):
            pass
    assert runtime.get_allocator() is None
