"""runtime.acl's pointer checks against a model: random malloc / malloc_host / free /
free_host / memcpy / memset sequences, with pointers inside, across the end of, or outside
live blocks, and freed ones. Every call's code must be the model's (0 when each range lies in
a live block, else ACL_ERROR_INVALID_PARAM), and every block's bytes must equal the model's."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import runtime.acl as acl
from runtime.acl import ACL_ERROR_INVALID_PARAM, ACL_SUCCESS


@pytest.fixture(scope="module", autouse=True)
def acl_up():
    assert acl.init() == ACL_SUCCESS
    assert acl.rt.set_device(0) == ACL_SUCCESS
    yield
    acl.rt.reset_device(0)
    assert acl.finalize() == ACL_SUCCESS


OPS = st.lists(
    st.tuples(
        st.sampled_from(["malloc", "malloc_host", "free", "memcpy", "memset"]),
        st.integers(0, 7),  # which block (index into every block handed out, modulo)
        st.integers(0, 7),  # second block
        st.integers(-4, 100),  # offset
        st.integers(0, 48),  # count
        st.integers(0, 255),  # value
        st.integers(1, 128),  # block size
    ),
    max_size=40,
)


@settings(max_examples=150)
@given(OPS)
def test_pointer_checks_match_the_model(ops):
    live: dict[int, tuple[bool, np.ndarray]] = {}  # ptr -> (is_device, model bytes)
    freed: list[tuple[int, bool]] = []
    blocks: list[int] = []  # every pointer ever handed out, live or not

    def pick(i):
        return blocks[i % len(blocks)] if blocks else 0x1000

    def inside(ptr, n):
        for base, (_, data) in live.items():
            if base <= ptr and ptr + n <= base + len(data) and (ptr < base + len(data) or n == 0):
                return base
        return None

    try:
        for op, i, j, off, count, value, size in ops:
            if op in ("malloc", "malloc_host"):
                ptr, ret = acl.rt.malloc(size, 0) if op == "malloc" else acl.rt.malloc_host(size)
                assert ret == ACL_SUCCESS
                live[ptr] = (op == "malloc", np.zeros(size, np.uint8))
                if op == "malloc_host":  # host memory is not initialised
                    assert acl.rt.memset(ptr, size, 0, size) == ACL_SUCCESS
                blocks.append(ptr)
            elif op == "free":
                ptr = pick(i)
                is_dev = live[ptr][0] if ptr in live else (i % 2 == 0)
                ret = acl.rt.free(ptr) if is_dev else acl.rt.free_host(ptr)
                if ptr in live:
                    assert ret == ACL_SUCCESS
                    del live[ptr]
                    freed.append((ptr, is_dev))
                else:
                    assert ret == ACL_ERROR_INVALID_PARAM
            elif op == "memcpy":
                dst = pick(i) + max(off, 0) // 2
                src = pick(j) + (off if off < 0 else off // 3)
                dmax = count + (off % 3)
                ret = acl.rt.memcpy(dst, dmax, src, count, acl.ACL_MEMCPY_DEFAULT)
                db, sb = inside(dst, dmax), inside(src, count)
                if db is None or sb is None:
                    assert ret == ACL_ERROR_INVALID_PARAM
                else:
                    assert ret == ACL_SUCCESS
                    d, s = live[db][1], live[sb][1]
                    chunk = s[src - sb : src - sb + count].copy()
                    d[dst - db : dst - db + count] = chunk
            else:
                ptr = pick(i) + off // 2
                n = count
                ret = acl.rt.memset(ptr, n, value, n)
                base = inside(ptr, n)
                if base is None:
                    assert ret == ACL_ERROR_INVALID_PARAM
                else:
                    assert ret == ACL_SUCCESS
                    live[base][1][ptr - base : ptr - base + n] = value
            acl.get_recent_err_msg()
        for ptr, (_, data) in live.items():
            raw = bytes(len(data)) if len(data) > 1 else None
            if raw is None:  # 1-byte bytes are read-only: read through a malloc_host block
                h, _ = acl.rt.malloc_host(1)
                assert acl.rt.memcpy(h, 1, ptr, 1, acl.ACL_MEMCPY_DEFAULT) == ACL_SUCCESS
                got = acl.util.ptr_to_bytes(h, 1)
                acl.rt.free_host(h)
            else:
                assert acl.rt.memcpy(acl.util.bytes_to_ptr(raw), len(data), ptr, len(data), 4) == 0
                got = raw
            assert np.array_equal(np.frombuffer(got, np.uint8), data), hex(ptr)
    finally:
        for ptr, (is_dev, _) in live.items():
            assert (acl.rt.free(ptr) if is_dev else acl.rt.free_host(ptr)) == ACL_SUCCESS
