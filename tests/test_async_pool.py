"""Stream-ordered allocation: ``malloc_async`` / ``free_async`` and ``MemoryAsyncPool``
(CUDA's ``cudaMallocAsync`` / ``cudaFreeAsync`` and memory pools, CuPy's ``MemoryAsyncPool``).

A block freed on a stream is reused by later work on that stream without any
synchronisation; another stream gets it once the freeing stream has passed the free; a reused
block reads zero in stream order; free blocks beyond the release threshold go back at the next
synchronisation; the pool's numbers follow (``stats()``). The streams are held back with user
events, so "no synchronisation happened" is observed, not assumed.

Translated: CuPy tests/cupy_tests/cuda_tests/test_memory.py ``TestMemoryAsyncPool``
(test_zero_size_alloc, test_alloc, test_alloc_large_chunk, test_free_all_blocks,
test_free_all_blocks_large_chunk, test_interaction_with_CuPy_default_pool), with the documented
difference that this runtime gives free blocks of either pool back before it reports out of
memory (CuPy expects ``OutOfMemoryError`` there). A Hypothesis state machine checks the
numbers against a model.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import runtime

MiB = 1 << 20
CAPACITY = 128 * MiB


@pytest.fixture(scope="module", autouse=True)
def rt():
    runtime.shutdown()
    runtime.init(device_count=2, memory="128MiB")
    yield
    runtime.shutdown()


@pytest.fixture
def pool():
    p = runtime.MemoryAsyncPool()
    p.release_threshold = 0
    p.free_all_blocks()
    p.reset_peak_stats()
    runtime.get_default_memory_pool().free_all_blocks()
    yield p
    runtime.synchronize()
    p.release_threshold = 0
    p.free_all_blocks()


def held_stream():
    """A stream that runs nothing until the returned event is set."""
    s = runtime.Stream()
    gate = runtime.UserEvent()
    s.wait_event(gate)
    return s, gate


# --- CuPy's TestMemoryAsyncPool ------------------------------------------------------------


def test_zero_size_alloc(pool):
    buf = pool.malloc(0)
    assert buf.nbytes == 0 and pool.used_bytes() == 0


def test_alloc(pool):
    buf = pool.malloc(100)
    assert buf.nbytes == 100
    assert pool.used_bytes() >= 100
    assert (buf.copy_to_host() == 0).all(), "fresh memory reads zero"


def test_alloc_large_chunk(pool):
    total = runtime.get_device_properties(0).total_memory
    mem = pool.malloc(int(0.7 * total))
    del mem
    mem = pool.malloc(int(0.3 * total))
    assert mem.nbytes == int(0.3 * total)


def test_free_all_blocks(pool):
    mem = pool.malloc(1)
    del mem
    assert pool.n_free_blocks() == 1
    pool.free_all_blocks()
    assert (pool.n_free_blocks(), pool.total_bytes()) == (0, 0)


# CuPy TestSingleDeviceMemoryPool.test_free_all_blocks_stream /
# test_free_all_blocks_all_streams (tests/cupy_tests/cuda_tests/test_memory.py), on the pool
# whose free blocks belong to streams here: the async pool. Only the blocks freed on the given
# stream go back; the other stream's block is still that stream's to reuse.
def test_free_all_blocks_stream(pool):
    pool.release_threshold = 2**62  # synchronisations keep free blocks: only the call frees
    s0, s1 = runtime.Stream(), runtime.Stream()
    # Both live at once, so they are two blocks (s1 would otherwise reuse s0's freed one).
    p1 = pool.malloc(4 * MiB, stream=s0)
    p2 = pool.malloc(4 * MiB, stream=s1)
    ptr1, ptr2 = p1.ptr, p2.ptr
    pool.free(p1, stream=s0)
    pool.free(p2, stream=s1)
    del p1, p2
    assert pool.n_free_blocks() == 2
    pool.free_all_blocks(stream=s0)
    assert (pool.n_free_blocks(), pool.total_bytes()) == (1, 4 * MiB)
    p4 = pool.malloc(4 * MiB, stream=s1)
    assert p4.ptr == ptr2 != ptr1
    pool.free(p4, stream=s1)
    del p4
    pool.free_all_blocks(stream=s0)  # nothing of s0's left: a no-op
    assert pool.n_free_blocks() == 1
    pool.free_all_blocks(stream=s1)
    assert (pool.n_free_blocks(), pool.total_bytes()) == (0, 0)


def test_free_all_blocks_all_streams(pool):
    pool.release_threshold = 2**62
    s0, s1 = runtime.Stream(), runtime.Stream()
    b0, b1 = pool.malloc(4 * MiB, stream=s0), pool.malloc(4 * MiB, stream=s1)
    pool.free(b0, stream=s0)
    pool.free(b1, stream=s1)
    del b0, b1
    assert pool.n_free_blocks() == 2
    pool.free_all_blocks()
    assert (pool.n_free_blocks(), pool.total_bytes()) == (0, 0)


def test_free_all_blocks_stream_must_be_a_stream_of_the_pools_device(pool):
    with pytest.raises(ValueError, match="stream"):
        pool.free_all_blocks(stream=runtime.Stream(device=1))
    with pytest.raises(TypeError, match="stream"):
        pool.free_all_blocks(stream=0)
    dead = runtime.Stream()
    dead.destroy()
    with pytest.raises(runtime.InvalidHandleError):
        pool.free_all_blocks(stream=dead)


# CuPy TestMemoryAsyncPool.test_free_all_free / test_free_all_free_without_malloc.
def test_free_all_free(pool):
    with pytest.warns(DeprecationWarning, match="free_all_blocks"):
        pool.free_all_free()
    assert pool.n_free_blocks() == 0
    mem = pool.malloc(1)
    del mem
    assert pool.n_free_blocks() == 1
    with pytest.warns(DeprecationWarning):
        pool.free_all_free()
    assert pool.n_free_blocks() == 0


def test_free_all_blocks_large_chunk(pool):
    """CuPy: memory freed to the async pool is not visible to the default pool until
    ``free_all_blocks``. Here the allocator takes free blocks of the async pool back before it
    reports out of memory, so the default pool's allocation succeeds at once."""
    total = runtime.get_device_properties(0).total_memory
    default = runtime.get_default_memory_pool()
    pool.release_threshold = total
    mem = pool.malloc(int(0.7 * total))
    del mem
    assert pool.free_bytes() > 0.6 * total
    got = default.malloc(int(0.3 * total))
    assert pool.free_bytes() == 0
    del got
    pool.free_all_blocks()


def test_interaction_with_the_default_pool(pool):
    """CuPy ``test_interaction_with_CuPy_default_pool``: the default pool holds 70% cached;
    the async pool's allocation of 30% succeeds here (the allocator flushes its caches before
    failing), where CuPy expects OutOfMemoryError until ``free_all_blocks``."""
    total = runtime.get_device_properties(0).total_memory
    default = runtime.get_default_memory_pool()
    mem = default.malloc(int(0.7 * total))
    del mem
    got = pool.malloc(int(0.3 * total))
    assert got.nbytes == int(0.3 * total)


# --- stream order ------------------------------------------------------------------------


def test_same_stream_reuse_needs_no_synchronisation(pool):
    s, gate = held_stream()
    reused = pool.stats()["reuse_same_stream"]
    x = runtime.malloc_async(MiB, stream=s)
    runtime.memset(x, 7, stream=s)
    ptr = x.ptr
    runtime.free_async(x, stream=s)
    y = runtime.malloc_async(MiB, stream=s)
    assert y.ptr == ptr, "the block freed on this stream is reused at once"
    assert not s.query(), "the stream has not run: nothing was synchronised"
    st = pool.stats()
    assert st["reuse_same_stream"] == reused + 1 and st["used_mem_current"] == MiB
    # Pinned: a queued copy into pageable memory is complete when its call returns (CUDA's
    # rule), which the held stream would never let happen.
    out = runtime.malloc_host(MiB)
    runtime.memcpy_device_to_host(out, y, stream=s)
    gate.set()
    s.synchronize()
    assert (out == 0).all(), "the memset ran first, then the reused block was zeroed"
    with pytest.raises(runtime.InvalidHandleError):
        x.copy_to_host()


def test_another_stream_waits_for_the_free_to_be_passed(pool):
    s, gate = held_stream()
    t = runtime.Stream()
    reused = pool.stats()["reuse_other_stream"]
    x = runtime.malloc_async(MiB, stream=s)
    ptr = x.ptr
    runtime.free_async(x, stream=s)
    y = runtime.malloc_async(MiB, stream=t)
    assert y.ptr != ptr, "s has not passed the free: t gets other memory"
    pool.release_threshold = CAPACITY
    gate.set()
    s.synchronize()
    z = runtime.malloc_async(MiB, stream=t)
    assert z.ptr == ptr and pool.stats()["reuse_other_stream"] == reused + 1
    assert (z.copy_to_host() == 0).all()


def test_release_threshold_applies_at_synchronisation(pool):
    s = runtime.Stream()
    for _ in range(3):
        runtime.free_async(runtime.malloc_async(4 * MiB, stream=s), stream=s)
    # one block, reused twice on the same stream
    assert (pool.total_bytes(), pool.free_bytes()) == (4 * MiB, 4 * MiB)
    s.synchronize()
    assert pool.total_bytes() == 0, "threshold 0: the synchronisation gave it back"
    pool.release_threshold = 8 * MiB
    bufs = [runtime.malloc_async(4 * MiB, stream=s) for _ in range(3)]
    for b in bufs:
        runtime.free_async(b, stream=s)
    runtime.synchronize()
    st = pool.stats()
    assert (st["free_bytes"], st["reserved_mem_high"], st["release_threshold"]) == (
        8 * MiB,
        12 * MiB,
        8 * MiB,
    )
    assert pool.trim_to(0) == 2 and pool.total_bytes() == 0


def test_dropping_the_last_handle_frees_in_order(pool):
    """CuPy's MemoryAsyncPool frees on garbage collection: a buffer whose last handle goes
    (and whose queued work ran) is a free block for any stream."""
    pool.release_threshold = CAPACITY
    s = runtime.Stream()
    b = pool.malloc(2 * MiB, stream=s)
    ptr = b.ptr
    del b
    s.synchronize()
    assert pool.free_bytes() == 2 * MiB
    c = pool.malloc(2 * MiB, stream=runtime.Stream())
    assert c.ptr == ptr


def test_misuse_is_refused(pool):
    s = runtime.Stream()
    plain = runtime.device_malloc(0, 64)
    with pytest.raises(ValueError, match="not allocated by malloc_async"):
        runtime.free_async(plain, stream=s)
    plain.copy_to_host()  # a refused free changes nothing
    x = runtime.malloc_async(64, stream=s)
    with pytest.raises(ValueError, match="view"):
        runtime.free_async(x[8:16], stream=s)
    with pytest.raises(ValueError, match="device"):
        runtime.free_async(x, stream=runtime.Stream(1))
    runtime.free_async(x, stream=s)
    # The error names how the buffer was freed.
    with pytest.raises(runtime.InvalidHandleError, match=r"freed with free_async\(\)"):
        runtime.free_async(x, stream=s)
    with pytest.raises(runtime.InvalidHandleError, match=r"freed with free_async\(\)"):
        runtime.device_free(x)
    y = pool.malloc(64, stream=s)
    pool.free(y, stream=s)
    with pytest.raises(runtime.InvalidHandleError, match=r"freed with MemoryAsyncPool\.free\(\)"):
        runtime.free_async(y, stream=s)
    z = runtime.device_malloc(0, 64)
    runtime.device_free(z)
    with pytest.raises(runtime.InvalidHandleError, match=r"freed with device_free\(\)"):
        runtime.device_free(z)
    with pytest.raises(ValueError, match="size"):
        runtime.malloc_async(-1)
    with pytest.raises(runtime.OutOfMemoryError):
        runtime.malloc_async(CAPACITY + 1)
    with pytest.raises(ValueError, match="device"):
        runtime.MemoryAsyncPool(0).malloc(8, stream=runtime.Stream(1))
    c = runtime.Stream()
    c.begin_capture()
    with pytest.raises(runtime.Error):
        runtime.malloc_async(16, stream=c)
    c.end_capture()


def test_memory_is_usable_by_kernels_and_copies_in_stream_order(pool):
    s = runtime.Stream()
    a = runtime.malloc_async(4 * 1000, stream=s).view("float32", (1000,))
    runtime.memcpy_host_to_device(a, np.arange(1000, dtype=np.float32), stream=s)
    s.launch_kernel(runtime.kernels.scale, (a, a, 2.0))
    out = np.empty(1000, np.float32)
    runtime.memcpy_device_to_host(out, a, stream=s)
    s.synchronize()
    np.testing.assert_array_equal(out, 2 * np.arange(1000, dtype=np.float32))


# --- the numbers, against a model ----------------------------------------------------------

BLOCKS = [64 << 10, 1 << 20]


class AsyncPoolModel(RuleBasedStateMachine):
    """Random malloc/free/drop/synchronise on two held-back streams: the pool's numbers follow
    a model (used = live leases' blocks, reserved = used + free, same-stream reuse needs no
    synchronisation), and live buffers never share memory."""

    def __init__(self):
        super().__init__()
        self.pool = runtime.MemoryAsyncPool()
        self.pool.release_threshold = 0
        runtime.synchronize()
        self.pool.free_all_blocks()
        self.streams = [held_stream() for _ in range(2)]
        self.live = []  # (buf, block, stream index)
        self.free = {0: [], 1: []}  # stream -> blocks freed on it (not yet passed)

    @rule(size=st.sampled_from(BLOCKS), k=st.integers(0, 1))
    def malloc(self, size, k):
        s = self.streams[k][0]
        same = bool(self.free[k] and size in self.free[k])
        before = self.pool.stats()["reuse_same_stream"]
        b = runtime.malloc_async(size, stream=s)
        if same:
            self.free[k].remove(size)
            assert self.pool.stats()["reuse_same_stream"] == before + 1
        self.live.append((b, size, k))

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100), k=st.integers(0, 1))
    def free_async(self, i, k):
        b, size, _ = self.live.pop(i % len(self.live))
        runtime.free_async(b, stream=self.streams[k][0])
        self.free[k].append(size)

    @rule()
    def release_and_synchronise(self):
        for s, gate in self.streams:
            gate.set()
            s.synchronize()
        self.free = {0: [], 1: []}
        self.streams = [held_stream() for _ in range(2)]
        assert self.pool.free_bytes() == 0, "threshold 0"

    @invariant()
    def numbers_add_up(self):
        st = self.pool.stats()
        assert st["used_mem_current"] == sum(size for _, size, _ in self.live)
        assert st["reserved_mem_current"] == st["used_mem_current"] + st["free_bytes"]

    @invariant()
    def live_buffers_never_share_memory(self):
        spans = sorted((b.ptr, b.ptr + size) for b, size, _ in self.live)
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert end <= start

    def teardown(self):
        for s, gate in self.streams:
            gate.set()
            s.synchronize()
        self.live.clear()
        self.pool.free_all_blocks()


TestAsyncPoolModel = AsyncPoolModel.TestCase
TestAsyncPoolModel.settings = settings(max_examples=30, stateful_step_count=25, deadline=None)
