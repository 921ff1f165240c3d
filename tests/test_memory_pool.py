"""The memory pool: ``MemoryPool`` / ``get_default_memory_pool`` is the device's built-in
allocator, so its numbers are the allocator's (``memory_stats``), and ``set_limit`` caps what
it may hold. Translated from CuPy's tests/cupy_tests/cuda_tests/test_memory.py
(TestSingleDeviceMemoryPool: test_used_bytes, test_free_bytes, test_total_bytes,
test_free_all_blocks; TestMemoryPool: test_free_all_blocks, test_n_free_blocks_without_malloc,
test_zero_size_alloc), with this pool's block rule: a freed block is cached and reused for a
request of the same block size. A Hypothesis state machine checks the numbers against a model.
"""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import runtime

KiB = 1 << 10
MiB = 1 << 20
# Above the slab's largest class (32 KiB) and a whole number of pages: a block is exactly
# the requested size.
UNIT = 64 * KiB
CAPACITY = 64 * MiB


@pytest.fixture(scope="module", autouse=True)
def rt():
    runtime.shutdown()
    runtime.init(device_count=2, memory="64MiB")
    runtime.set_option("enableMemoryReuse", True)
    yield
    runtime.shutdown()


@pytest.fixture
def pool():
    p = runtime.get_default_memory_pool()
    p.set_limit()
    p.free_all_blocks()
    assert p.used_bytes() == 0, "a previous test leaked"
    yield p
    p.set_limit()
    p.free_all_blocks()


def test_default_pool_is_the_current_devices_allocator(pool):
    assert pool == runtime.MemoryPool() == runtime.MemoryPool(0)
    assert pool.device == runtime.Device(0)
    with runtime.Device(1):
        assert runtime.get_default_memory_pool().device == runtime.Device(1)
    assert runtime.get_default_memory_pool(1) == runtime.MemoryPool(1) != pool
    assert repr(pool) == "MemoryPool(device=0)"
    with pytest.raises(runtime.InvalidDeviceError):
        runtime.get_default_memory_pool(7)


def test_numbers_are_the_allocators(pool):
    bufs = [runtime.device_malloc(0, n) for n in (1, 100, 5000, 40 * KiB, 3 * MiB)]
    s = runtime.memory_stats(0)
    assert pool.used_bytes() == s["allocated"] == runtime.memory_allocated(0)
    assert pool.total_bytes() == s["reserved"] == runtime.memory_reserved(0)
    assert pool.free_bytes() == s["cached"]
    assert pool.n_free_blocks() == s["free_blocks"]
    del bufs


def test_used_bytes(pool):
    # CuPy TestSingleDeviceMemoryPool.test_used_bytes
    p1 = pool.malloc(UNIT * 2)
    assert pool.used_bytes() == UNIT * 2
    p2 = pool.malloc(UNIT * 4)
    assert pool.used_bytes() == UNIT * 6
    del p2
    assert pool.used_bytes() == UNIT * 2
    del p1
    assert pool.used_bytes() == 0
    p3 = pool.malloc(UNIT * 1)
    assert pool.used_bytes() == UNIT
    del p3


def test_free_bytes(pool):
    # CuPy TestSingleDeviceMemoryPool.test_free_bytes
    p1 = pool.malloc(UNIT * 2)
    assert pool.free_bytes() == 0
    p2 = pool.malloc(UNIT * 4)
    assert pool.free_bytes() == 0
    del p2
    assert pool.free_bytes() == UNIT * 4
    del p1
    assert pool.free_bytes() == UNIT * 6
    # Same block size as p2: its cached block is reused once the background scrubber has
    # zeroed it; until then the pool prefers fresh memory (so either is right here).
    p3 = pool.malloc(UNIT * 4)
    assert pool.free_bytes() in (UNIT * 2, UNIT * 6)
    assert pool.total_bytes() == pool.used_bytes() + pool.free_bytes()
    del p3


def test_total_bytes(pool):
    # CuPy TestSingleDeviceMemoryPool.test_total_bytes
    p1 = pool.malloc(UNIT * 2)
    assert pool.total_bytes() == UNIT * 2
    p2 = pool.malloc(UNIT * 4)
    assert pool.total_bytes() == UNIT * 6
    del p1
    assert pool.total_bytes() == UNIT * 6
    del p2
    assert pool.total_bytes() == UNIT * 6
    p3 = pool.malloc(UNIT * 2)
    assert pool.total_bytes() in (UNIT * 6, UNIT * 8)  # cached block reused, or fresh
    del p3
    pool.free_all_blocks()
    assert pool.total_bytes() == 0


def test_free_all_blocks(pool):
    # CuPy TestMemoryPool.test_free_all_blocks / test_n_free_blocks_without_malloc
    assert pool.n_free_blocks() == 0
    pool.free_all_blocks()
    assert pool.n_free_blocks() == 0
    mem = pool.malloc(UNIT)
    assert pool.n_free_blocks() == 0
    runtime.device_free(mem)
    assert pool.n_free_blocks() == 1
    pool.free_all_blocks()
    assert pool.n_free_blocks() == 0
    assert pool.total_bytes() == pool.used_bytes() == 0


# CuPy TestSingleDeviceMemoryPool.test_free_all_blocks_stream /
# test_free_all_blocks_all_streams (tests/cupy_tests/cuda_tests/test_memory.py). CuPy keeps
# one arena per stream; this pool caches a block only once no queued work uses it, so every
# stream of the device may reuse it and the device has one arena: free_all_blocks(stream=s)
# releases what free_all_blocks() does (CuPy's `ptr2 == p4.ptr` after releasing the null
# stream's arena has no counterpart).
def test_free_all_blocks_stream(pool):
    s = runtime.Stream()
    p1 = pool.malloc(UNIT * 4)
    runtime.device_free(p1)
    with s:
        p2 = pool.malloc(UNIT * 4)
        runtime.device_free(p2)
    assert pool.n_free_blocks() >= 1
    pool.free_all_blocks(stream=runtime.default_stream())
    assert pool.n_free_blocks() == 0
    assert pool.total_bytes() == pool.used_bytes() == 0
    with pytest.raises(ValueError, match="stream"):
        pool.free_all_blocks(stream=runtime.Stream(device=1))
    with pytest.raises(TypeError, match="stream"):
        pool.free_all_blocks(stream="s")


# CuPy TestMemoryPool.test_free_all_free / test_free_all_free_without_malloc.
def test_free_all_free(pool):
    with pytest.warns(DeprecationWarning, match="free_all_blocks"):
        pool.free_all_free()
    assert pool.n_free_blocks() == 0
    mem = pool.malloc(UNIT)
    runtime.device_free(mem)
    assert pool.n_free_blocks() == 1
    with pytest.warns(DeprecationWarning):
        pool.free_all_free()
    assert pool.n_free_blocks() == 0


def test_zero_size_alloc(pool):
    # CuPy TestMemoryPool.test_zero_size_alloc: a zero-byte allocation takes no memory.
    b = pool.malloc(0)
    assert b.nbytes == 0
    assert pool.used_bytes() == pool.total_bytes() == 0
    del b


def test_malloc_bypasses_a_plugged_allocator(pool):
    calls = []

    def alloc(n, device, stream):
        calls.append(n)
        return pool.malloc(n)

    runtime.set_allocator(alloc)
    try:
        b = pool.malloc(UNIT)
        assert calls == []
        c = runtime.device_malloc(0, UNIT)
        assert calls == [UNIT]
    finally:
        runtime.set_allocator(None)
    del b, c


def test_set_limit_size_and_fraction(pool):
    assert pool.get_limit() == 0
    pool.set_limit(size=4 * MiB)
    assert pool.get_limit() == 4 * MiB
    a = pool.malloc(3 * MiB)
    with pytest.raises(runtime.OutOfMemoryError):
        pool.malloc(2 * MiB)
    with pytest.raises(runtime.OutOfMemoryError):
        runtime.device_malloc(0, 2 * MiB)
    b = pool.malloc(1 * MiB)
    assert pool.total_bytes() <= 4 * MiB
    del a, b
    pool.set_limit(fraction=0.5)
    assert pool.get_limit() == CAPACITY // 2
    pool.set_limit(fraction=0)
    assert pool.get_limit() == 0
    pool.set_limit(size=None)
    assert pool.get_limit() == 0
    # Limits are per device.
    pool.set_limit(size=1 * MiB)
    assert runtime.get_default_memory_pool(1).get_limit() == 0
    runtime.device_malloc(1, 2 * MiB)


def test_set_limit_rejects_bad_values_and_changes_nothing(pool):
    pool.set_limit(size=2 * MiB)
    with pytest.raises(ValueError, match="size and fraction"):
        pool.set_limit(size=1, fraction=0.5)
    with pytest.raises(ValueError, match="fraction must be between 0 and 1"):
        pool.set_limit(fraction=1.5)
    with pytest.raises(ValueError, match="exceeds the 67108864-byte capacity"):
        pool.set_limit(size=CAPACITY + 1)
    with pytest.raises(ValueError, match="size"):
        pool.set_limit(size=-1)
    with pytest.raises(TypeError):
        pool.set_limit(size="1MiB")
    assert pool.get_limit() == 2 * MiB


def test_pool_after_shutdown_raises():
    p = runtime.get_default_memory_pool()
    runtime.shutdown()
    try:
        with pytest.raises(runtime.NotInitializedError):
            p.used_bytes()
    finally:
        runtime.init(device_count=2, memory="64MiB")


BLOCKS = st.integers(min_value=1, max_value=16).map(lambda k: k * UNIT)


class PoolModel(RuleBasedStateMachine):
    """The pool's numbers against a model: ``used`` is the sum of the live blocks; a request
    with ``used + block <= limit`` always succeeds (the caches are flushed before the pool
    gives up), and one over the limit succeeds only from a cached block (``total_bytes``
    does not grow); ``total = used + free``; ``free_all_blocks`` leaves nothing cached.
    Which cached block serves a request depends on the background scrubber, so the model
    bounds the cache rather than predicting it."""

    def __init__(self):
        super().__init__()
        self.pool = runtime.get_default_memory_pool()
        self.pool.set_limit()
        self.pool.free_all_blocks()
        self.live: list = []
        self.limit = CAPACITY
        self.freed_since_flush = 0

    def teardown(self):
        self.live.clear()
        self.pool.set_limit()
        self.pool.free_all_blocks()

    def used(self) -> int:
        return sum(b.nbytes for b in self.live)

    @rule(size=BLOCKS)
    def malloc(self, size):
        if self.used() + size <= self.limit:
            self.live.append(self.pool.malloc(size))
            return
        # Over the limit: only a cached block of that size (already counted in total_bytes)
        # may serve it, so total_bytes does not grow.
        before = self.pool.total_bytes()
        try:
            self.live.append(self.pool.malloc(size))
        except runtime.OutOfMemoryError:
            return
        assert self.pool.total_bytes() <= before

    @precondition(lambda self: self.live)
    @rule(i=st.integers(min_value=0))
    def free(self, i):
        b = self.live.pop(i % len(self.live))
        runtime.device_free(b)
        self.freed_since_flush += 1

    @rule()
    def free_all_blocks(self):
        self.pool.free_all_blocks()
        self.freed_since_flush = 0
        assert self.pool.free_bytes() == 0
        assert self.pool.n_free_blocks() == 0

    @rule(mib=st.integers(min_value=0, max_value=64))
    def set_limit(self, mib):
        self.pool.set_limit(size=mib * MiB)
        self.limit = mib * MiB if mib else CAPACITY
        assert self.pool.get_limit() == mib * MiB

    @invariant()
    def numbers(self):
        used, total, free = self.pool.used_bytes(), self.pool.total_bytes(), self.pool.free_bytes()
        assert used == self.used()
        assert total == used + free
        assert total <= CAPACITY
        n = self.pool.n_free_blocks()
        assert n <= self.freed_since_flush
        assert n * UNIT <= free <= n * 16 * UNIT


test_pool_model = PoolModel.TestCase
