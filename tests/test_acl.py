"""runtime.acl (pyACL's face): return shapes, values, and the error code of every bad input.

Each failing call must return CANN's numeric code (never raise), leave a message for
``acl.get_recent_err_msg()`` and change nothing. Wrong Python types raise ``TypeError`` as
pyACL's argument parsing does.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import runtime
import runtime.acl as acl
from runtime import _runtime as N
from runtime.acl import (
    ACL_ERROR_BAD_ALLOC,
    ACL_ERROR_INVALID_PARAM,
    ACL_ERROR_INVALID_RESOURCE_HANDLE,
    ACL_ERROR_OP_INPUT_NOT_MATCH,
    ACL_ERROR_OP_NOT_FOUND,
    ACL_ERROR_OP_OUTPUT_NOT_MATCH,
    ACL_ERROR_REPEAT_INITIALIZE,
    ACL_ERROR_RT_CONTEXT_NULL,
    ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
    ACL_ERROR_RT_INVALID_DEVICEID,
    ACL_ERROR_RT_REPORT_TIMEOUT,
    ACL_ERROR_RT_STREAM_NO_CB_REG,
    ACL_ERROR_RT_THREAD_SUBSCRIBE,
    ACL_ERROR_UNINITIALIZE,
    ACL_ERROR_UNSUPPORTED_DATA_TYPE,
    ACL_SUCCESS,
)

H2H, H2D, D2H, D2D, DEFAULT = 0, 1, 2, 3, 4


@pytest.fixture(scope="module", autouse=True)
def acl_up():
    assert acl.init() == ACL_SUCCESS
    assert acl.rt.set_device(0) == ACL_SUCCESS
    yield
    acl.rt.reset_device(0)
    assert acl.finalize() == ACL_SUCCESS
    assert not runtime.is_initialized()


def err(code_or_tuple):
    """The code of a call's result, and its message (which must exist for a failure)."""
    code = code_or_tuple[-1] if isinstance(code_or_tuple, tuple) else code_or_tuple
    msg = acl.get_recent_err_msg()
    if code != ACL_SUCCESS:
        assert msg, "a failed call must leave a message"
    return code


def dev_alloc(size, policy=0):
    ptr, ret = acl.rt.malloc(size, policy)
    assert ret == ACL_SUCCESS
    return ptr


def host_alloc(size):
    ptr, ret = acl.rt.malloc_host(size)
    assert ret == ACL_SUCCESS
    return ptr


def read_back(ptr, size):
    raw = bytes(size)
    assert acl.rt.memcpy(acl.util.bytes_to_ptr(raw), size, ptr, size, DEFAULT) == ACL_SUCCESS
    return np.frombuffer(raw, np.uint8)


# --------------------------------------------------------------------------- init, version


def test_repeat_init_and_conventions():
    assert err(acl.init()) == ACL_ERROR_REPEAT_INITIALIZE
    major, minor, patch, ret = acl.get_version()
    assert ret == ACL_SUCCESS and (major, minor, patch) == acl.VERSION
    assert acl.get_soc_name() == "Ascend910"
    assert acl.get_recent_err_msg() is None  # cleared once read


def test_type_errors_raise_like_pyacl():
    with pytest.raises(TypeError):
        acl.rt.malloc("10", 0)
    with pytest.raises(TypeError):
        acl.rt.memcpy(None, 1, 1, 1, 1)
    with pytest.raises(TypeError):
        acl.create_tensor_desc(3, (8, 16), 2)  # dims must be a list
    with pytest.raises(ValueError):
        acl.util.bytes_to_ptr(bytearray(4))


# --------------------------------------------------------------------------- devices, contexts


def test_devices_and_contexts():
    count, ret = acl.rt.get_device_count()
    assert ret == ACL_SUCCESS and count == runtime.get_device_count()
    assert acl.rt.get_device() == (0, ACL_SUCCESS)
    assert acl.rt.get_run_mode() == (acl.ACL_HOST, ACL_SUCCESS)
    assert err(acl.rt.set_device(count)) == ACL_ERROR_RT_INVALID_DEVICEID
    assert err(acl.rt.set_device(-1)) == ACL_ERROR_RT_INVALID_DEVICEID
    assert err(acl.rt.create_context(count)) == ACL_ERROR_RT_INVALID_DEVICEID
    default_ctx, ret = acl.rt.get_context()
    assert ret == ACL_SUCCESS and default_ctx
    ctx, ret = acl.rt.create_context(1)
    assert ret == ACL_SUCCESS
    assert acl.rt.get_context() == (ctx, ACL_SUCCESS)  # the creator's current context
    assert acl.rt.get_device() == (1, ACL_SUCCESS)
    assert acl.rt.set_context(default_ctx) == ACL_SUCCESS
    assert acl.rt.get_device() == (0, ACL_SUCCESS)
    assert err(acl.rt.destroy_context(default_ctx)) == ACL_ERROR_INVALID_PARAM
    assert acl.rt.destroy_context(ctx) == ACL_SUCCESS
    assert err(acl.rt.destroy_context(ctx)) == ACL_ERROR_INVALID_RESOURCE_HANDLE  # stale
    assert err(acl.rt.set_context(ctx)) == ACL_ERROR_INVALID_RESOURCE_HANDLE
    assert err(acl.rt.set_context(0)) == ACL_ERROR_INVALID_PARAM
    assert acl.rt.synchronize_device() == ACL_SUCCESS
    assert acl.rt.get_device() == (0, ACL_SUCCESS)


def test_context_is_per_thread():
    seen = {}

    def other():
        seen["before"] = acl.rt.get_context()[1]
        seen["malloc"] = acl.rt.malloc(64, 0)[1]
        acl.get_recent_err_msg()
        ctx, _ = acl.rt.create_context(2)
        seen["device"] = acl.rt.get_device()
        acl.rt.destroy_context(ctx)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen == {
        "before": ACL_ERROR_RT_CONTEXT_NULL,
        "malloc": ACL_ERROR_RT_CONTEXT_NULL,
        "device": (2, ACL_SUCCESS),
    }
    assert acl.rt.get_device() == (0, ACL_SUCCESS)  # this thread's context is untouched


# --------------------------------------------------------------------------- memory


def test_malloc_free_and_bad_sizes():
    ptr = dev_alloc(1000)
    assert ptr % 64 == 0
    for policy in (0, 1, 2, 0x100 | 2):
        p = dev_alloc(64, policy)
        assert acl.rt.free(p) == ACL_SUCCESS
    assert err(acl.rt.malloc(0, 0)) == ACL_ERROR_INVALID_PARAM
    assert err(acl.rt.malloc(-5, 0)) == ACL_ERROR_INVALID_PARAM
    assert err(acl.rt.malloc(1 << 62, 0)) == ACL_ERROR_BAD_ALLOC
    assert err(acl.rt.free(ptr + 64)) == ACL_ERROR_INVALID_PARAM  # inside, not the start
    assert err(acl.rt.free(0)) == ACL_ERROR_INVALID_PARAM
    assert acl.rt.free(ptr) == ACL_SUCCESS
    assert err(acl.rt.free(ptr)) == ACL_ERROR_INVALID_PARAM  # double free
    h = host_alloc(64)
    assert err(acl.rt.free(h)) == ACL_ERROR_INVALID_PARAM  # host memory
    assert err(acl.rt.free_host(h + 1)) == ACL_ERROR_INVALID_PARAM
    assert acl.rt.free_host(h) == ACL_SUCCESS
    assert err(acl.rt.free_host(h)) == ACL_ERROR_INVALID_PARAM
    assert err(acl.rt.malloc_host(0)) == ACL_ERROR_INVALID_PARAM


def test_dvpp_memory_is_freed_only_by_dvpp_free():
    p, ret = acl.media.dvpp_malloc(100)
    assert ret == ACL_SUCCESS and p % 128 == 0
    assert err(acl.rt.free(p)) == ACL_ERROR_INVALID_PARAM
    d = dev_alloc(100)
    assert err(acl.media.dvpp_free(d)) == ACL_ERROR_INVALID_PARAM
    assert acl.media.dvpp_free(p) == ACL_SUCCESS
    assert err(acl.media.dvpp_free(p)) == ACL_ERROR_INVALID_PARAM
    assert acl.rt.free(d) == ACL_SUCCESS


@pytest.mark.parametrize("kind", [H2H, H2D, D2H, D2D, DEFAULT])
def test_memcpy_round_trip_every_kind(kind):
    # The direction follows the addresses (CANN documents kind as reserved); each kind works
    # for the pair it names.
    n = 256
    src = np.arange(n, dtype=np.uint8)
    h_src = host_alloc(n)
    assert acl.rt.memcpy(h_src, n, acl.util.bytes_to_ptr(src.tobytes()), n, H2H) == ACL_SUCCESS
    d1, d2, h_dst = dev_alloc(n), dev_alloc(n), host_alloc(n)
    assert acl.rt.memcpy(d1, n, h_src, n, H2D if kind != DEFAULT else kind) == ACL_SUCCESS
    assert acl.rt.memcpy(d2, n, d1, n, D2D if kind != DEFAULT else kind) == ACL_SUCCESS
    assert acl.rt.memcpy(h_dst, n, d2, n, D2H if kind != DEFAULT else kind) == ACL_SUCCESS
    assert np.array_equal(np.frombuffer(acl.util.ptr_to_bytes(h_dst, n), np.uint8), src)
    for p in (d1, d2):
        acl.rt.free(p)
    acl.rt.free_host(h_src)
    acl.rt.free_host(h_dst)


def test_memcpy_offsets_inside_allocations():
    d = dev_alloc(128)
    h = host_alloc(128)
    assert acl.rt.memset(d, 128, 0, 128) == ACL_SUCCESS
    assert acl.rt.memset(h, 128, 9, 128) == ACL_SUCCESS
    assert acl.rt.memcpy(d + 32, 96, h + 8, 16, H2D) == ACL_SUCCESS
    got = read_back(d, 128)
    assert got[32:48].tolist() == [9] * 16 and got[:32].sum() == 0 and got[48:].sum() == 0
    acl.rt.free(d)
    acl.rt.free_host(h)


def test_memcpy_bad_pointers_sizes_and_kinds():
    d, h = dev_alloc(64), host_alloc(64)
    before = read_back(d, 64).copy()
    bad = [
        ((d, 64, h, 64, 9), "kind out of range"),
        ((d, 64, h, 64, -1), "negative kind"),
        ((d, 32, h, 64, H2D), "count > dest_max"),
        ((d, 128, h, 128, H2D), "past the device allocation"),
        ((d, 64, h, 65, H2D), "past the host allocation"),
        ((d + 60, 8, h, 8, H2D), "straddles the end"),
        ((0, 64, h, 64, H2D), "null dst"),
        ((d, 64, 0, 64, H2D), "null src"),
        ((d, 64, 12345678, 64, H2D), "unknown host pointer"),
        ((d, 64, h, -1, H2D), "negative count"),
    ]
    for args, why in bad:
        assert err(acl.rt.memcpy(*args)) == ACL_ERROR_INVALID_PARAM, why
        assert err(acl.rt.memcpy_async(*args, 0)) == ACL_ERROR_INVALID_PARAM, why
    assert np.array_equal(read_back(d, 64), before)  # nothing was written
    acl.rt.free(d)
    assert err(acl.rt.memcpy(d, 64, h, 64, H2D)) == ACL_ERROR_INVALID_PARAM  # freed
    acl.rt.free_host(h)
    d2 = dev_alloc(64)
    assert err(acl.rt.memcpy(d2, 64, h, 64, H2D)) == ACL_ERROR_INVALID_PARAM  # freed host
    acl.rt.free(d2)


def test_memcpy_async_is_stream_ordered():
    stream, ret = acl.rt.create_stream()
    assert ret == ACL_SUCCESS
    n = 4096
    h, d, back = host_alloc(n), dev_alloc(n), host_alloc(n)
    assert acl.rt.memset_async(h, n, 7, n, stream) == ACL_SUCCESS
    assert acl.rt.memcpy_async(d, n, h, n, H2D, stream) == ACL_SUCCESS
    assert acl.rt.memset_async(d, n, 3, n // 2, stream) == ACL_SUCCESS
    assert acl.rt.memcpy_async(back, n, d, n, D2H, stream) == ACL_SUCCESS
    assert acl.rt.synchronize_stream(stream) == ACL_SUCCESS
    got = np.frombuffer(acl.util.ptr_to_bytes(back, n), np.uint8)
    assert (got[: n // 2] == 3).all() and (got[n // 2 :] == 7).all()
    assert err(acl.rt.memcpy_async(back, n, h, n, H2H, stream)) == ACL_ERROR_RT_FEATURE_NOT_SUPPORT
    assert acl.rt.destroy_stream(stream) == ACL_SUCCESS
    assert err(acl.rt.memcpy_async(d, n, h, n, H2D, stream)) == ACL_ERROR_INVALID_RESOURCE_HANDLE
    acl.rt.free(d)
    acl.rt.free_host(h)
    acl.rt.free_host(back)


def test_memset_bad_inputs():
    d = dev_alloc(64)
    assert err(acl.rt.memset(d, 32, 1, 64)) == ACL_ERROR_INVALID_PARAM  # count > max
    assert err(acl.rt.memset(d, 65, 1, 65)) == ACL_ERROR_INVALID_PARAM  # past the end
    assert err(acl.rt.memset(d + 4096, 4, 1, 4)) == ACL_ERROR_INVALID_PARAM
    assert err(acl.rt.memset_async(d, 64, 1, 64, 0xDEAD0)) == ACL_ERROR_INVALID_RESOURCE_HANDLE
    assert read_back(d, 64).sum() == 0
    assert acl.rt.memset(d, 64, 0x1FF, 64) == ACL_SUCCESS  # the low byte is used
    assert (read_back(d, 64) == 0xFF).all()
    acl.rt.free(d)


def test_get_mem_info():
    free0, total, ret = acl.rt.get_mem_info(acl.ACL_HBM_MEM)
    assert ret == ACL_SUCCESS and 0 < free0 <= total
    assert acl.rt.get_mem_info(acl.ACL_DDR_MEM) == (0, 0, ACL_SUCCESS)
    d = dev_alloc(1 << 20)
    free1, _, _ = acl.rt.get_mem_info(acl.ACL_HBM_MEM)
    assert free1 <= free0 - (1 << 20)
    acl.rt.free(d)
    assert acl.rt.get_mem_info(acl.ACL_HBM_MEM)[0] == free0
    assert err(acl.rt.get_mem_info(18)) == ACL_ERROR_INVALID_PARAM
    assert err(acl.rt.get_mem_info(-1)) == ACL_ERROR_INVALID_PARAM


# --------------------------------------------------------------------------- util


def test_util_converters():
    data = bytes(range(16))
    p = acl.util.bytes_to_ptr(data)
    assert acl.util.ptr_to_bytes(p, 16) == data
    assert acl.util.ptr_to_bytes(p + 4, 4) == data[4:8]
    with pytest.raises(ValueError):
        acl.util.ptr_to_bytes(p, 17)
    with pytest.raises(ValueError):
        acl.util.ptr_to_bytes(424242, 1)
    arr = np.arange(6, dtype=np.int32)
    with pytest.warns(Warning):
        q = acl.util.numpy_to_ptr(arr)
    with pytest.warns(Warning):
        view = acl.util.ptr_to_numpy(q, (2, 3), acl.NPY_INT)
    assert view.tolist() == [[0, 1, 2], [3, 4, 5]]
    view[0, 0] = 99  # wraps, no copy
    assert arr[0] == 99
    with pytest.warns(Warning), pytest.raises(ValueError, match="object references"):
        acl.util.numpy_to_ptr(np.array([None, 1], dtype=object))
    d = dev_alloc(64)
    with pytest.raises(ValueError):
        acl.util.ptr_to_bytes(d, 8)  # device memory is not readable from the host
    acl.rt.free(d)


def test_shared_small_bytes_are_read_only():
    # CPython shares bytes of length 1 made from data: a copy into one must not change b"\x07"
    one = np.full(1, 7, np.uint8).tobytes()
    d = dev_alloc(1)
    acl.rt.memset(d, 1, 9, 1)
    p = acl.util.bytes_to_ptr(one)
    assert acl.rt.memcpy(d, 1, p, 1, H2D) == ACL_SUCCESS  # reading it is fine
    assert err(acl.rt.memcpy(p, 1, d, 1, D2H)) == ACL_ERROR_INVALID_PARAM
    assert one == b"\x07" and bytes([7]) == b"\x07"
    acl.rt.free(d)


def test_released_borrowed_pointer_is_refused():
    # A bytes object the caller dropped is released once enough newer ones were registered.
    p = acl.util.bytes_to_ptr(bytes(range(250)) * 4)  # built at run time: no constant holds it
    keep = [bytes([i]) * 100 for i in range(acl._state.KEEP_UNREFERENCED + 8)]
    for b in keep:
        acl.util.bytes_to_ptr(b)
    for i in range(acl._state.KEEP_UNREFERENCED + 8):
        acl.util.bytes_to_ptr(bytes(100 + i))  # dropped by the caller at once
    d = dev_alloc(1000)
    assert err(acl.rt.memcpy(d, 1000, p, 1000, H2D)) == ACL_ERROR_INVALID_PARAM
    assert acl.rt.memcpy(d, 100, acl.util.bytes_to_ptr(keep[0]), 100, H2D) == ACL_SUCCESS
    acl.rt.free(d)


def test_start_stop_thread():
    out = []
    tid, ret = acl.util.start_thread(out.append, 5)
    assert ret == ACL_SUCCESS
    assert acl.util.stop_thread(tid) == ACL_SUCCESS and out == [5]
    assert err(acl.util.stop_thread(tid)) == ACL_ERROR_INVALID_PARAM
    tid, _ = acl.util.start_thread(lambda: 1 / 0, None)
    with pytest.raises(RuntimeError):
        acl.util.stop_thread(tid)


# --------------------------------------------------------------------------- streams, events


def test_streams_and_events():
    s, ret = acl.rt.create_stream()
    assert ret == ACL_SUCCESS
    e1, _ = acl.rt.create_event()
    e2, ret = acl.rt.create_event_with_flag(acl.ACL_EVENT_SYNC)
    assert ret == ACL_SUCCESS
    assert acl.rt.record_event(e1, s) == ACL_SUCCESS
    assert acl.rt.record_event(e2, s) == ACL_SUCCESS
    assert acl.rt.synchronize_stream(s) == ACL_SUCCESS
    assert acl.rt.query_event_status(e2) == (acl.ACL_EVENT_RECORDED_STATUS_COMPLETE, ACL_SUCCESS)
    assert acl.rt.query_event(e2) == (acl.ACL_EVENT_STATUS_COMPLETE, ACL_SUCCESS)
    ms, ret = acl.rt.event_elapsed_time(e1, e2)
    assert ret == ACL_SUCCESS and isinstance(ms, float) and ms >= 0
    assert acl.rt.synchronize_event(e2) == ACL_SUCCESS
    assert acl.rt.synchronize_event_with_timeout(e2, 1000) == ACL_SUCCESS
    assert acl.rt.stream_wait_event(0, e2) == ACL_SUCCESS
    assert acl.rt.reset_event(e2, s) == ACL_SUCCESS
    assert acl.rt.stream_query(s) == (acl.ACL_STREAM_STATUS_COMPLETE, ACL_SUCCESS)
    assert acl.rt.synchronize_stream(0) == ACL_SUCCESS
    assert acl.rt.synchronize_stream_with_timeout(s, 1000) == ACL_SUCCESS
    assert err(acl.rt.synchronize_stream_with_timeout(s, 0)) == ACL_ERROR_INVALID_PARAM
    assert err(acl.rt.create_event_with_flag(0x1000)) == ACL_ERROR_INVALID_PARAM
    # stale handles
    assert acl.rt.destroy_event(e1) == ACL_SUCCESS
    for call in (
        lambda: acl.rt.record_event(e1, s),
        lambda: acl.rt.query_event_status(e1),
        lambda: acl.rt.synchronize_event(e1),
        lambda: acl.rt.event_elapsed_time(e1, e2),
        lambda: acl.rt.stream_wait_event(s, e1),
        lambda: acl.rt.destroy_event(e1),
    ):
        assert err(call()) == ACL_ERROR_INVALID_RESOURCE_HANDLE
    assert acl.rt.destroy_stream(s) == ACL_SUCCESS
    for call in (
        lambda: acl.rt.synchronize_stream(s),
        lambda: acl.rt.destroy_stream(s),
        lambda: acl.rt.record_event(e2, s),
        lambda: acl.rt.stream_query(s),
    ):
        assert err(call()) == ACL_ERROR_INVALID_RESOURCE_HANDLE
    # a handle of another kind is not a stream
    assert err(acl.rt.synchronize_stream(e2)) == ACL_ERROR_INVALID_RESOURCE_HANDLE
    assert err(acl.rt.record_event(s, 0)) == ACL_ERROR_INVALID_RESOURCE_HANDLE
    acl.rt.destroy_event(e2)


def test_event_orders_streams():
    a, _ = acl.rt.create_stream()
    b, _ = acl.rt.create_stream()
    ev, _ = acl.rt.create_event()
    n = 1 << 16
    h, d, back = host_alloc(n), dev_alloc(n), host_alloc(n)
    acl.rt.memset(h, n, 5, n)
    assert acl.rt.memcpy_async(d, n, h, n, H2D, a) == ACL_SUCCESS
    assert acl.rt.record_event(ev, a) == ACL_SUCCESS
    assert acl.rt.stream_wait_event(b, ev) == ACL_SUCCESS
    assert acl.rt.memcpy_async(back, n, d, n, D2H, b) == ACL_SUCCESS
    assert acl.rt.synchronize_stream(b) == ACL_SUCCESS
    assert set(acl.util.ptr_to_bytes(back, n)) == {5}
    for s in (a, b):
        acl.rt.destroy_stream(s)
    acl.rt.destroy_event(ev)
    acl.rt.free(d)
    acl.rt.free_host(h)
    acl.rt.free_host(back)


def test_query_event_wait_status_follows_the_waiting_streams():
    # pyACL: status, ret = acl.rt.query_event_wait_status(event); COMPLETE (0) once every
    # stream made to wait for the event (stream_wait_event) has received it.
    from runtime.acl import ACL_EVENT_WAIT_STATUS_COMPLETE, ACL_EVENT_WAIT_STATUS_NOT_READY

    a, _ = acl.rt.create_stream()
    b, _ = acl.rt.create_stream()
    ev, _ = acl.rt.create_event()
    assert acl.rt.query_event_wait_status(ev) == (ACL_EVENT_WAIT_STATUS_COMPLETE, ACL_SUCCESS)
    gate = runtime.UserEvent()
    N.acl_stream(a)[0].wait_event(gate)  # a runs nothing until the gate opens
    assert acl.rt.record_event(ev, a) == ACL_SUCCESS
    assert acl.rt.stream_wait_event(b, ev) == ACL_SUCCESS
    assert acl.rt.query_event_wait_status(ev) == (ACL_EVENT_WAIT_STATUS_NOT_READY, ACL_SUCCESS)
    gate.set()
    assert acl.rt.synchronize_stream(b) == ACL_SUCCESS
    assert acl.rt.query_event_wait_status(ev) == (ACL_EVENT_WAIT_STATUS_COMPLETE, ACL_SUCCESS)
    for s in (a, b):
        acl.rt.destroy_stream(s)
    acl.rt.destroy_event(ev)
    status, ret = acl.rt.query_event_wait_status(ev)  # destroyed
    assert err((status, ret)) == ACL_ERROR_INVALID_RESOURCE_HANDLE
    with pytest.raises(TypeError):
        acl.rt.query_event_wait_status("ev")


def test_query_device_status():
    from runtime.acl import ACL_RT_DEVICE_STATUS_NORMAL

    n, _ = acl.rt.get_device_count()
    for d in range(n):
        assert acl.rt.query_device_status(d) == (ACL_RT_DEVICE_STATUS_NORMAL, ACL_SUCCESS)
    assert err(acl.rt.query_device_status(n)) == ACL_ERROR_RT_INVALID_DEVICEID
    assert err(acl.rt.query_device_status(-1)) == ACL_ERROR_RT_INVALID_DEVICEID
    with pytest.raises(TypeError):
        acl.rt.query_device_status("0")


def test_device_utilization_rate_is_measured_from_compute_work():
    import time

    # pyACL: utilization_info, ret = acl.rt.get_device_utilization_rate(device_id), a dict
    # of aclrtUtilizationInfo's fields; units the device lacks read -1.
    info, ret = acl.rt.get_device_utilization_rate(1)  # opens a window on device 1
    assert ret == ACL_SUCCESS
    assert set(info) == {
        "cube_utilization",
        "vector_utilization",
        "aicpu_utilization",
        "memory_utilization",
        "utilization_extend",
    }
    assert (info["vector_utilization"], info["aicpu_utilization"]) == (-1, -1)
    assert info["memory_utilization"] == -1
    s = runtime.Stream(1)
    for _ in range(3):
        s.launch_host_func(time.sleep, 0.03)
    s.synchronize()
    info, ret = acl.rt.get_device_utilization_rate(1)
    assert ret == ACL_SUCCESS
    assert 1 <= info["cube_utilization"] <= 100, info
    # Nothing ran on device 1 since: the next window reads 0.
    info, ret = acl.rt.get_device_utilization_rate(1)
    assert (info["cube_utilization"], ret) == (0, ACL_SUCCESS)
    n, _ = acl.rt.get_device_count()
    assert err(acl.rt.get_device_utilization_rate(n)) == ACL_ERROR_RT_INVALID_DEVICEID
    with pytest.raises(TypeError):
        acl.rt.get_device_utilization_rate(None)


def test_last_error_is_per_thread_peeked_or_taken():
    from runtime.acl import ACL_RT_THREAD_LEVEL

    acl.rt.get_last_error(ACL_RT_THREAD_LEVEL)  # start clean
    assert acl.rt.peek_at_last_error(ACL_RT_THREAD_LEVEL) == ACL_SUCCESS
    assert err(acl.rt.malloc(0, 0)) == ACL_ERROR_INVALID_PARAM
    # peek leaves it, get takes it.
    assert acl.rt.peek_at_last_error(ACL_RT_THREAD_LEVEL) == ACL_ERROR_INVALID_PARAM
    with pytest.raises(TypeError):
        acl.rt.peek_at_last_error()  # level is required, as in pyACL
    seen = []
    t = threading.Thread(target=lambda: seen.append(acl.rt.peek_at_last_error(0)))
    t.start()
    t.join()
    assert seen == [ACL_SUCCESS]  # another thread's slot
    # A success does not clear it (CANN's rule: only get_last_error does).
    assert acl.rt.get_device_count()[1] == ACL_SUCCESS
    assert acl.rt.get_last_error(ACL_RT_THREAD_LEVEL) == ACL_ERROR_INVALID_PARAM
    assert acl.rt.peek_at_last_error(ACL_RT_THREAD_LEVEL) == ACL_SUCCESS
    # A failure the Python layer finds (a bad device id) is recorded too.
    assert err(acl.rt.query_device_status(10**6)) == ACL_ERROR_RT_INVALID_DEVICEID
    assert acl.rt.get_last_error(ACL_RT_THREAD_LEVEL) == ACL_ERROR_RT_INVALID_DEVICEID
    with pytest.raises(TypeError):
        acl.rt.peek_at_last_error("thread")


# --------------------------------------------------------------------------- callbacks


def test_callbacks_run_in_the_subscribed_thread():
    s, _ = acl.rt.create_stream()
    ran = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            acl.rt.process_report(50)

    t = threading.Thread(target=serve)
    t.start()
    assert err(acl.rt.launch_callback(ran.append, 1, 1, s)) == ACL_ERROR_RT_STREAM_NO_CB_REG
    assert acl.rt.subscribe_report(t.ident, s) == ACL_SUCCESS
    assert err(acl.rt.subscribe_report(t.ident, s)) == acl.ACL_ERROR_REPEAT_SUBSCRIBE

    def cb(data):
        ran.append((data, threading.get_ident()))

    assert acl.rt.launch_callback(cb, "blocking", acl.ACL_CALLBACK_BLOCK, s) == ACL_SUCCESS
    assert acl.rt.launch_callback(cb, "free", acl.ACL_CALLBACK_NO_BLOCK, s) == ACL_SUCCESS
    assert acl.rt.synchronize_stream(s) == ACL_SUCCESS
    assert ran[0] == ("blocking", t.ident)  # the stream waited for the blocking callback
    assert err(acl.rt.launch_callback(cb, 0, 2, s)) == ACL_ERROR_INVALID_PARAM
    with pytest.raises(TypeError):
        acl.rt.launch_callback(42, 0, 0, s)
    for _ in range(3000):  # the non-blocking callback runs when its thread gets to it
        if len(ran) == 2:
            break
        threading.Event().wait(0.01)
    assert ran[1] == ("free", t.ident)
    assert acl.rt.unsubscribe_report(t.ident, s) == ACL_SUCCESS
    assert err(acl.rt.unsubscribe_report(t.ident, s)) == ACL_ERROR_RT_STREAM_NO_CB_REG
    stop.set()
    t.join()
    acl.rt.destroy_stream(s)


def test_process_report_errors():
    assert err(acl.rt.process_report(10)) == ACL_ERROR_RT_THREAD_SUBSCRIBE
    s, _ = acl.rt.create_stream()
    me = threading.get_ident()
    assert acl.rt.subscribe_report(me, s) == ACL_SUCCESS
    assert err(acl.rt.process_report(10)) == ACL_ERROR_RT_REPORT_TIMEOUT
    assert err(acl.rt.process_report(0)) == ACL_ERROR_INVALID_PARAM
    got = []
    assert acl.rt.launch_callback(got.append, "x", 0, s) == ACL_SUCCESS
    assert acl.rt.synchronize_stream(s) == ACL_SUCCESS
    assert acl.rt.process_report(1000) == ACL_SUCCESS and got == ["x"]
    assert acl.rt.unsubscribe_report(me, s) == ACL_SUCCESS
    acl.rt.destroy_stream(s)


# --------------------------------------------------------------------------- tensors, operators


def test_tensor_desc_and_data_buffer():
    desc = acl.create_tensor_desc(acl.ACL_FLOAT16, [4, 5], acl.ACL_FORMAT_ND)
    assert acl.get_tensor_desc_size(desc) == 40
    assert acl.get_tensor_desc_element_count(desc) == 20
    assert acl.get_tensor_desc_num_dims(desc) == 2
    assert acl.get_tensor_desc_dim(desc, 1) == 5
    assert acl.get_tensor_desc_dim_v2(desc, 0) == (4, ACL_SUCCESS)
    assert err(acl.get_tensor_desc_dim_v2(desc, 2)) == ACL_ERROR_INVALID_PARAM
    assert acl.get_tensor_desc_type(desc) == acl.ACL_FLOAT16
    assert acl.get_tensor_desc_format(desc) == acl.ACL_FORMAT_ND
    assert acl.data_type_size(acl.ACL_DOUBLE) == 8
    assert acl.create_tensor_desc(0, [-1, 3], 2) == 0
    acl.get_recent_err_msg()
    assert acl.destroy_tensor_desc(desc) is None
    assert acl.get_tensor_desc_size(desc) == 0  # stale: bare value, message recorded
    assert acl.get_recent_err_msg()
    buf = acl.create_data_buffer(0x1000, 64)
    assert acl.get_data_buffer_addr(buf) == 0x1000
    assert acl.get_data_buffer_size_v2(buf) == 64
    assert acl.update_data_buffer(buf, 0x2000, 32) == ACL_SUCCESS
    assert (acl.get_data_buffer_addr(buf), acl.get_data_buffer_size(buf)) == (0x2000, 32)
    assert acl.destroy_data_buffer(buf) == ACL_SUCCESS
    assert err(acl.destroy_data_buffer(buf)) == ACL_ERROR_INVALID_RESOURCE_HANDLE
    empty = acl.create_data_buffer(0, 0)
    assert empty and acl.destroy_data_buffer(empty) == ACL_SUCCESS


class Op:
    """Tensors for one operator call: device buffers filled from numpy arrays."""

    def __init__(self):
        self.descs, self.bufs, self.ptrs = [], [], []

    def tensor(self, arr_or_shape, dtype_code, fill=None):
        shape = (
            list(arr_or_shape.shape) if isinstance(arr_or_shape, np.ndarray) else list(arr_or_shape)
        )
        desc = acl.create_tensor_desc(dtype_code, shape, acl.ACL_FORMAT_ND)
        size = acl.get_tensor_desc_size(desc)
        ptr = dev_alloc(max(size, 1))
        if isinstance(arr_or_shape, np.ndarray):
            raw = arr_or_shape.tobytes()
            assert acl.rt.memcpy(ptr, size, acl.util.bytes_to_ptr(raw), size, H2D) == ACL_SUCCESS
        buf = acl.create_data_buffer(ptr, size)
        self.descs.append(desc)
        self.bufs.append(buf)
        self.ptrs.append(ptr)
        return desc, buf, ptr, size

    def read(self, i, dtype, shape):
        size = acl.get_tensor_desc_size(self.descs[i])
        return np.frombuffer(bytes(read_back(self.ptrs[i], size)), dtype).reshape(shape)

    def close(self):
        for d, b, p in zip(self.descs, self.bufs, self.ptrs):
            acl.destroy_data_buffer(b)
            acl.rt.free(p)
            acl.destroy_tensor_desc(d)


CODES = {
    "float32": acl.ACL_FLOAT,
    "float64": acl.ACL_DOUBLE,
    "int32": acl.ACL_INT32,
    "int64": acl.ACL_INT64,
    "float16": acl.ACL_FLOAT16,
    "int8": acl.ACL_INT8,
    "int16": acl.ACL_INT16,
    "uint8": acl.ACL_UINT8,
    "uint16": acl.ACL_UINT16,
    "uint32": acl.ACL_UINT32,
    "uint64": acl.ACL_UINT64,
    "bool": acl.ACL_BOOL,
    "complex64": acl.ACL_COMPLEX64,
    "complex128": acl.ACL_COMPLEX128,
}


def _operands(dtype, shape, rng):
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool), rng.integers(0, 2, shape).astype(bool)
    if np.dtype(dtype).kind in "iu":
        return rng.integers(1, 50, shape).astype(dtype), rng.integers(1, 9, shape).astype(dtype)
    a = (rng.standard_normal(shape) * 10).astype(dtype)
    b = (rng.standard_normal(shape) + 3).astype(dtype)
    return a, b


def _expected(op, a, b):
    if op == "Add":
        return a + b
    if op == "Sub":
        return a - b if a.dtype != bool else a ^ b
    if op == "Mul":
        return a * b
    return np.floor_divide(a, b) if a.dtype.kind in "iu" else a / b


@pytest.mark.parametrize("dtype", list(CODES))
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
def test_elementwise_ops_every_dtype(op, dtype):
    rng = np.random.default_rng(7)
    a, b = _operands(dtype, (3, 5), rng)
    s, _ = acl.rt.create_stream()
    o = Op()
    da, ba, _, _ = o.tensor(a, CODES[dtype])
    db, bb, _, _ = o.tensor(b, CODES[dtype])
    dc, bc, _, _ = o.tensor((3, 5), CODES[dtype])
    attr = acl.op.create_attr()
    if dtype == "bool" and op in ("Sub", "Div"):  # neither CANN nor numpy subtracts booleans
        ret = acl.op.execute_v2(op, [da, db], [ba, bb], [dc], [bc], attr, s)
        assert err(ret) == ACL_ERROR_UNSUPPORTED_DATA_TYPE
        o.close()
        acl.op.destroy_attr(attr)
        acl.rt.destroy_stream(s)
        return
    assert acl.op.execute_v2(op, [da, db], [ba, bb], [dc], [bc], attr, s) == ACL_SUCCESS
    assert acl.rt.synchronize_stream(s) == ACL_SUCCESS
    if dtype in ("float32", "float64", "int32", "int64") and op in ("Add", "Mul"):
        kernel = op.lower()
        assert acl.op._native[(kernel, dtype)] is True  # ran on the native kernel
    got = o.read(2, dtype, (3, 5))
    want = _expected(op, a, b)
    if np.dtype(dtype).kind in "fc":
        np.testing.assert_allclose(got, want, rtol=1e-3 if dtype == "float16" else 1e-6)
    else:
        assert np.array_equal(got, want)
    o.close()
    acl.op.destroy_attr(attr)
    acl.rt.destroy_stream(s)


@pytest.mark.parametrize("aliased", ["a", "b"])
def test_sub_in_place(aliased):
    a = np.arange(8, dtype=np.float32)
    b = np.full(8, 2.5, np.float32)
    o = Op()
    da, ba, _, _ = o.tensor(a, acl.ACL_FLOAT)
    db, bb, _, _ = o.tensor(b, acl.ACL_FLOAT)
    out_desc, out_buf = (da, ba) if aliased == "a" else (db, bb)
    assert acl.op.execute_v2("Sub", [da, db], [ba, bb], [out_desc], [out_buf], 0, 0) == ACL_SUCCESS
    acl.rt.synchronize_stream(0)
    assert np.array_equal(o.read(0 if aliased == "a" else 1, np.float32, (8,)), a - b)
    o.close()


def test_broadcast_cast_and_matmul():
    rng = np.random.default_rng(3)
    o = Op()
    a = rng.standard_normal((4, 3)).astype(np.float32)
    row = rng.standard_normal((1, 3)).astype(np.float32)
    da, ba, _, _ = o.tensor(a, acl.ACL_FLOAT)
    dr, br, _, _ = o.tensor(row, acl.ACL_FLOAT)
    dc, bc, _, _ = o.tensor((4, 3), acl.ACL_FLOAT)
    assert acl.op.execute_v2("Add", [da, dr], [ba, br], [dc], [bc], 0, 0) == ACL_SUCCESS
    # Cast float32 -> float16 and -> int32 (truncation), with the dst_type attribute
    d16, b16, _, _ = o.tensor((4, 3), acl.ACL_FLOAT16)
    attr = acl.op.create_attr()
    assert acl.op.set_attr_int(attr, "dst_type", acl.ACL_FLOAT16) == ACL_SUCCESS
    assert acl.op.execute_v2("Cast", [dc], [bc], [d16], [b16], attr, 0) == ACL_SUCCESS
    di, bi, _, _ = o.tensor((4, 3), acl.ACL_INT32)
    assert acl.op.cast(dc, bc, di, bi, 0, 0) == ACL_SUCCESS
    assert (
        err(acl.op.execute_v2("Cast", [dc], [bc], [di], [bi], attr, 0))
        == acl.ACL_ERROR_OP_ATTR_NOT_MATCH
    )
    # MatMul native and with transpose_x2 (numpy fallback)
    bmat = rng.standard_normal((3, 5)).astype(np.float32)
    dbm, bbm, _, _ = o.tensor(bmat, acl.ACL_FLOAT)
    dm, bm, _, _ = o.tensor((4, 5), acl.ACL_FLOAT)
    assert acl.op.execute_v2("MatMul", [da, dbm], [ba, bbm], [dm], [bm], 0, 0) == ACL_SUCCESS
    bt = np.ascontiguousarray(bmat.T)
    dbt, bbt, _, _ = o.tensor(bt, acl.ACL_FLOAT)
    dm2, bm2, _, _ = o.tensor((4, 5), acl.ACL_FLOAT)
    tattr = acl.op.create_attr()
    assert acl.op.set_attr_bool(tattr, "transpose_x2", True) == ACL_SUCCESS
    assert acl.op.execute_v2("MatMul", [da, dbt], [ba, bbt], [dm2], [bm2], tattr, 0) == ACL_SUCCESS
    assert acl.rt.synchronize_stream(0) == ACL_SUCCESS
    added = o.read(2, np.float32, (4, 3))
    np.testing.assert_allclose(added, a + row, rtol=1e-6)
    np.testing.assert_array_equal(o.read(3, np.float16, (4, 3)), (a + row).astype(np.float16))
    np.testing.assert_array_equal(o.read(4, np.int32, (4, 3)), (a + row).astype(np.int32))
    np.testing.assert_allclose(o.read(6, np.float32, (4, 5)), a @ bmat, rtol=1e-5)
    np.testing.assert_allclose(o.read(8, np.float32, (4, 5)), a @ bmat, rtol=1e-5)
    o.close()
    acl.op.destroy_attr(attr)
    acl.op.destroy_attr(tattr)


def test_execute_v2_errors():
    o = Op()
    a = np.ones((2, 4), np.float32)
    da, ba, pa, _ = o.tensor(a, acl.ACL_FLOAT)
    db, bb, _, _ = o.tensor(a, acl.ACL_FLOAT)
    dc, bc, _, _ = o.tensor((2, 4), acl.ACL_FLOAT)
    dwrong, bwrong, _, _ = o.tensor((3, 4), acl.ACL_FLOAT)
    di, bi, _, _ = o.tensor((2, 4), acl.ACL_INT32)
    attr = acl.op.create_attr()
    assert acl.op.set_model_dir("/no/such/folder") == ACL_SUCCESS
    run = acl.op.execute_v2
    assert err(run("Conv2D", [da, db], [ba, bb], [dc], [bc], attr, 0)) == ACL_ERROR_OP_NOT_FOUND
    assert err(run("Add", [da], [ba], [dc], [bc], attr, 0)) == ACL_ERROR_OP_INPUT_NOT_MATCH
    assert err(run("Add", [da, db], [ba], [dc], [bc], attr, 0)) == ACL_ERROR_OP_INPUT_NOT_MATCH
    assert (
        err(run("Add", [da, db], [ba, bb], [dwrong], [bwrong], attr, 0))
        == ACL_ERROR_OP_OUTPUT_NOT_MATCH
    )
    assert err(run("Add", [da, db], [ba, bb], [di], [bi], attr, 0)) == ACL_ERROR_OP_INPUT_NOT_MATCH
    with pytest.raises(TypeError):
        run("Add", (da, db), [ba, bb], [dc], [bc], attr, 0)
    # a data buffer whose address is not device memory, or too small for its desc
    h = host_alloc(32)
    bhost = acl.create_data_buffer(h, 32)
    assert err(run("Add", [da, db], [ba, bhost], [dc], [bc], attr, 0)) == ACL_ERROR_INVALID_PARAM
    small = acl.create_data_buffer(pa, 16)
    assert err(run("Add", [da, db], [ba, small], [dc], [bc], attr, 0)) == ACL_ERROR_INVALID_PARAM
    wild = acl.create_data_buffer(0x10, 32)
    assert err(run("Add", [da, db], [ba, wild], [dc], [bc], attr, 0)) == ACL_ERROR_INVALID_PARAM
    bf = acl.create_tensor_desc(acl.ACL_BF16, [2, 4], 2)
    assert (
        err(run("Add", [bf, bf], [ba, bb], [bf], [bc], attr, 0)) == ACL_ERROR_UNSUPPORTED_DATA_TYPE
    )
    for b in (bhost, small, wild):
        acl.destroy_data_buffer(b)
    # stale descriptor, buffer, attr, stream
    acl.destroy_tensor_desc(bf)
    assert (
        err(run("Add", [bf, db], [ba, bb], [dc], [bc], attr, 0))
        == ACL_ERROR_INVALID_RESOURCE_HANDLE
    )
    assert (
        err(run("Add", [da, db], [bhost, bb], [dc], [bc], attr, 0))
        == ACL_ERROR_INVALID_RESOURCE_HANDLE
    )
    acl.op.destroy_attr(attr)
    assert (
        err(run("Add", [da, db], [ba, bb], [dc], [bc], attr, 0))
        == ACL_ERROR_INVALID_RESOURCE_HANDLE
    )
    assert (
        err(run("Add", [da, db], [ba, bb], [dc], [bc], 0, 0xBAD0))
        == ACL_ERROR_INVALID_RESOURCE_HANDLE
    )
    acl.rt.free_host(h)
    o.close()


def test_handle_api():
    o = Op()
    a = np.arange(6, dtype=np.int64).reshape(2, 3)
    da, ba, _, _ = o.tensor(a, acl.ACL_INT64)
    dc, bc, _, _ = o.tensor((2, 3), acl.ACL_INT64)
    h, ret = acl.op.create_handle("Mul", [da, da], [dc], 0)
    assert ret == ACL_SUCCESS
    assert acl.op.execute_with_handle(h, [ba, ba], [bc], 0) == ACL_SUCCESS
    acl.rt.synchronize_stream(0)
    assert np.array_equal(o.read(1, np.int64, (2, 3)), a * a)
    acl.op.destroy_handle(h)
    assert (
        err(acl.op.execute_with_handle(h, [ba, ba], [bc], 0)) == ACL_ERROR_INVALID_RESOURCE_HANDLE
    )
    o.close()


# --------------------------------------------------------------------------- lifecycle


def test_calls_before_init_and_after_finalize():
    # a fresh interpreter: acl is not initialised there
    import subprocess
    import sys

    code = (
        "import runtime.acl as acl\n"
        "print(acl.rt.malloc(8, 0)[1], acl.rt.set_device(0), acl.finalize(), acl.rt.create_stream()[1])\n"
        "acl.init(); acl.rt.set_device(0); p, _ = acl.rt.malloc(8, 0)\n"
        "print(acl.finalize(), acl.rt.free(p), acl.finalize(), acl.init(), acl.rt.set_device(0), acl.finalize())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    u = ACL_ERROR_UNINITIALIZE
    # a second finalize is ACL_ERROR_REPEAT_FINALIZE, as CANN's aclFinalize returns
    again = acl.ACL_ERROR_REPEAT_FINALIZE
    assert out.stdout.split("\n")[:2] == [f"{u} {u} {u} {u}", f"0 {u} {again} 0 0 0"]


def _run_script(code):
    """Run `code` in a fresh interpreter (the runtime is shut down and started again there);
    its printed lines."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_finalize_shuts_down_only_the_runtime_that_init_started():
    # aclInit starts the runtime; the user shuts it down and starts one of their own:
    # aclFinalize must leave that one running, with the user's buffer intact.
    code = (
        "import numpy as np, runtime, runtime.acl as acl\n"
        "print(acl.init(), runtime.is_initialized())\n"
        "runtime.shutdown()\n"
        "runtime.init(device_count=2)\n"
        "buf = runtime.to_device(np.arange(4, dtype=np.float32))\n"
        "print(acl.finalize(), runtime.is_initialized(), buf.to_host().tolist())\n"
        "del buf\n"
        "runtime.shutdown()\n"
        # the runtime aclInit started, still live at aclFinalize, is shut down
        "print(acl.init(), acl.finalize(), runtime.is_initialized())\n"
    )
    assert _run_script(code) == ["0 True", "0 True [0.0, 1.0, 2.0, 3.0]", "0 0 False"]


def test_set_device_after_a_runtime_restart_gives_a_context_of_the_new_runtime():
    # ACL stays initialised while the runtime is shut down and started again: the default
    # contexts of the old runtime are replaced (set_device) or released (reset_device_force),
    # the old handles fail with 200005, and new calls work.
    code = (
        "import runtime, runtime.acl as acl\n"
        "runtime.init(device_count=2)\n"
        "print(acl.init(), acl.rt.set_device(1), acl.rt.set_device(0))\n"
        "old_ctx, _ = acl.rt.get_context()\n"
        "old_s, _ = acl.rt.create_stream()\n"
        "old_e, _ = acl.rt.create_event()\n"
        "runtime.shutdown()\n"
        "runtime.init(device_count=2)\n"
        "print(acl.rt.set_device(0))\n"
        "ctx, _ = acl.rt.get_context()\n"
        "print(ctx != old_ctx, acl.rt.query_device_status(0))\n"
        "s, r1 = acl.rt.create_stream()\n"
        "p, r2 = acl.rt.malloc(64, 0)\n"
        "r3 = acl.rt.memset_async(p, 64, 0x5A, 64, s)\n"
        "print(r1, r2, r3, acl.rt.synchronize_stream(s), acl.rt.synchronize_device())\n"
        "raw = bytes(64)\n"
        "print(acl.rt.memcpy(acl.util.bytes_to_ptr(raw), 64, p, 64, 2), raw == b'\\x5a' * 64)\n"
        "print(acl.rt.stream_query(old_s)[1], acl.rt.record_event(old_e, 0))\n"
        # the old default context was released with its streams; the event is ACL's own
        "print(acl.rt.destroy_stream(old_s), acl.rt.destroy_event(old_e))\n"
        "print(acl.rt.free(p), acl.rt.destroy_stream(s))\n"
        # device 1 is still held by the old runtime's default context: released without error
        "print(acl.rt.reset_device_force(1), acl.rt.reset_device(1))\n"
        "print(acl.rt.reset_device(0), acl.finalize(), runtime.is_initialized())\n"
        "runtime.shutdown()\n"
    )
    invalid, not_set = ACL_ERROR_INVALID_RESOURCE_HANDLE, ACL_ERROR_INVALID_PARAM
    assert _run_script(code) == [
        "0 0 0",
        "0",
        "True (0, 0)",
        "0 0 0 0 0",
        "0 True",
        f"{invalid} {invalid}",
        f"{invalid} 0",
        "0 0",
        f"0 {not_set}",
        "0 0 True",
    ]


def test_fallback_and_native_ops_keep_stream_order():
    # Div (numpy fallback, a Python kernel on the stream) feeds Add (native kernel) feeds Cast
    # (fallback) with no synchronisation in between: stream order carries the values.
    s, _ = acl.rt.create_stream()
    o = Op()
    a = np.arange(1, 65, dtype=np.float32).reshape(8, 8)
    b = np.full((8, 8), 4.0, np.float32)
    da, ba, _, _ = o.tensor(a, acl.ACL_FLOAT)
    db, bb, _, _ = o.tensor(b, acl.ACL_FLOAT)
    dq, bq, _, _ = o.tensor((8, 8), acl.ACL_FLOAT)
    dh, bh, _, _ = o.tensor((8, 8), acl.ACL_FLOAT16)
    for _ in range(3):  # the repeated call replays its recorded launches
        assert acl.op.execute_v2("Div", [da, db], [ba, bb], [dq], [bq], 0, s) == ACL_SUCCESS
        assert acl.op.execute_v2("Add", [dq, da], [bq, ba], [dq], [bq], 0, s) == ACL_SUCCESS
        assert acl.op.execute_v2("Cast", [dq], [bq], [dh], [bh], 0, s) == ACL_SUCCESS
    assert acl.rt.synchronize_stream(s) == ACL_SUCCESS
    want = a / b + a
    np.testing.assert_array_equal(o.read(2, np.float32, (8, 8)), want)
    np.testing.assert_array_equal(o.read(3, np.float16, (8, 8)), want.astype(np.float16))
    # freeing an operand invalidates the recorded call: it is refused, not replayed
    acl.rt.free(o.ptrs[1])
    assert (
        err(acl.op.execute_v2("Div", [da, db], [ba, bb], [dq], [bq], 0, s))
        == ACL_ERROR_INVALID_PARAM
    )
    o.ptrs[1] = dev_alloc(256)
    o.close()
    acl.rt.destroy_stream(s)


def test_threads_allocate_copy_and_free_concurrently():
    # The pointer table is shared and lock-free for readers: blocks made and freed by other
    # threads never make a live block's pointer fail or a copy land elsewhere.
    errors = []

    def work(seed):
        try:
            assert acl.rt.set_device(0) == ACL_SUCCESS
            rng = np.random.default_rng(seed)
            for _ in range(100):
                n = int(rng.integers(1, 4096))
                d, ret = acl.rt.malloc(n, 0)
                assert ret == ACL_SUCCESS
                data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
                h = acl.util.bytes_to_ptr(data)
                assert acl.rt.memcpy(d, n, h, n, H2D) == ACL_SUCCESS
                out = bytes(n) if n > 1 else None
                if out is not None:
                    assert acl.rt.memcpy(acl.util.bytes_to_ptr(out), n, d, n, D2H) == ACL_SUCCESS
                    assert out == data
                assert acl.rt.free(d) == ACL_SUCCESS
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []


def test_wrong_types_raise_type_error_before_any_lookup():
    # A list or array where pyACL parses an int is a TypeError, as every other wrong type of
    # the face, never a return code (a table lookup of the unhashable value ran first).
    p = dev_alloc(64)
    for call in (
        lambda: acl.rt.free([p]),
        lambda: acl.rt.free(np.array([p])),
        lambda: acl.rt.synchronize_stream([0]),
        lambda: acl.rt.record_event([1], 0),
        lambda: acl.rt.record_event(1, [0]),
        lambda: acl.op.cast([0], 0, 0, 0, 0, 0),
        lambda: acl.op.execute_with_handle(0, [], [], [0]),
    ):
        with pytest.raises(TypeError, match="args parse failed"):
            call()
    assert acl.rt.free(p) == ACL_SUCCESS  # untouched by the refused calls


def test_wrong_argument_counts_raise_type_error():
    # pyACL's own unit test expects the exception for acl.util.start_thread() (the face's
    # wrapper turned argument-count errors into return codes).
    with pytest.raises(TypeError, match="acl.util.start_thread args parse failed"):
        acl.util.start_thread()
    with pytest.raises(TypeError):
        acl.rt.malloc(64)
    with pytest.raises(TypeError, match="acl.rt.destroy_stream args parse failed"):
        acl.rt.destroy_stream()
    with pytest.raises(TypeError, match="acl.rt.stream_query args parse failed"):
        acl.rt.stream_query(1, 2)
    with pytest.raises(TypeError):
        acl.rt.create_stream(1)
    with pytest.raises(TypeError):
        acl.rt.memcpy(0, 0, 0, 0)  # a plain function: Python's own TypeError
    # A TypeError raised inside a call is still the call's failure code.
    tid, ret = acl.util.start_thread(lambda: None, None)
    assert ret == ACL_SUCCESS
    assert acl.util.stop_thread(tid) == ACL_SUCCESS


def test_memcpy_async_into_pageable_host_memory_is_complete_on_return():
    # aclrtMemcpyAsync follows CUDA's rule: into pageable memory (bytes_to_ptr) the copy is
    # done when the call returns; into acl.rt.malloc_host memory it runs in stream order.
    from runtime.acl import _state

    n = 64
    want = np.arange(n, dtype=np.uint8)
    d = dev_alloc(n)
    src = want.tobytes()
    assert acl.rt.memcpy(d, n, acl.util.bytes_to_ptr(src), n, H2D) == ACL_SUCCESS
    stream, ret = acl.rt.create_stream()
    assert ret == ACL_SUCCESS
    held = _state.stream_of(stream, "test")  # hold the stream with a host function (no timing)
    gate = threading.Event()
    held.launch_host_func(gate.wait, 10)
    threading.Timer(0.02, gate.set).start()
    host = bytes(n)  # pyACL's idiom: copy into a bytes object's own buffer
    assert acl.rt.memcpy_async(acl.util.bytes_to_ptr(host), n, d, n, D2H, stream) == 0
    assert host == want.tobytes()
    pinned = host_alloc(n)
    assert acl.rt.memset(pinned, n, 0, n) == ACL_SUCCESS
    gate2 = threading.Event()
    held.launch_host_func(gate2.wait, 10)
    assert acl.rt.memcpy_async(pinned, n, d, n, D2H, stream) == ACL_SUCCESS
    assert acl.rt.stream_query(stream) == (1, ACL_SUCCESS)  # ACL_STREAM_STATUS_NOT_READY
    assert np.frombuffer(acl.util.ptr_to_bytes(pinned, n), np.uint8).tolist() == [0] * n
    gate2.set()
    assert acl.rt.synchronize_stream(stream) == ACL_SUCCESS
    assert np.frombuffer(acl.util.ptr_to_bytes(pinned, n), np.uint8).tolist() == want.tolist()
    acl.rt.free_host(pinned)
    acl.rt.free(d)
    assert acl.rt.destroy_stream(stream) == ACL_SUCCESS


# -- every public function of the face is called by a test ----------------------------------


def test_versions_contexts_and_stream_variants():
    assert acl.get_version_str("runtime") == (runtime.__version__, ACL_SUCCESS)
    assert acl.rt.ctx_get_current_default_stream() == (0, ACL_SUCCESS)  # 0 names it
    lo, hi = sorted(runtime.stream_priority_range())
    from runtime.acl import _state

    for priority in (lo - 5, lo, hi, hi + 5):
        s, ret = acl.rt.create_stream_with_config(priority, 0)
        assert ret == ACL_SUCCESS
        assert _state.stream_of(s, "test").priority == min(max(priority, lo), hi)  # clamped
        ev, ret = acl.rt.create_event_ex_with_flag(0)
        assert ret == ACL_SUCCESS
        assert acl.rt.record_event(ev, s) == ACL_SUCCESS
        assert acl.rt.synchronize_event(ev) == ACL_SUCCESS
        assert acl.rt.query_event_status(ev) == (acl.ACL_EVENT_RECORDED_STATUS_COMPLETE, 0)
        assert acl.rt.destroy_event(ev) == ACL_SUCCESS
        assert acl.rt.destroy_stream_force(s) == ACL_SUCCESS
        assert err(acl.rt.stream_query(s)) == ACL_ERROR_INVALID_RESOURCE_HANDLE  # gone
    assert err(acl.rt.create_event_ex_with_flag(1 << 20)) == ACL_ERROR_INVALID_PARAM


def test_synchronize_device_with_timeout_times_out_then_waits():
    from runtime.acl import _state

    s, ret = acl.rt.create_stream()
    gate = threading.Event()
    _state.stream_of(s, "test").launch_host_func(gate.wait, 10)
    assert err(acl.rt.synchronize_device_with_timeout(20)) == acl.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT
    assert err(acl.rt.synchronize_device_with_timeout(0)) == ACL_ERROR_INVALID_PARAM
    gate.set()
    assert acl.rt.synchronize_device_with_timeout(-1) == ACL_SUCCESS
    assert acl.rt.stream_query(s) == (acl.ACL_STREAM_STATUS_COMPLETE, ACL_SUCCESS)
    assert acl.rt.destroy_stream(s) == ACL_SUCCESS


def test_malloc_variants_and_numpy_contiguous_to_ptr():
    p, ret = acl.rt.malloc_align32(33, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    assert ret == ACL_SUCCESS and p % 32 == 0
    assert acl.rt.memset(p, 33, 0x5A, 33) == ACL_SUCCESS
    assert bytes(read_back(p, 33)) == b"\x5a" * 33
    assert err(acl.rt.memset(p, 34, 0, 34)) == ACL_ERROR_INVALID_PARAM  # the size asked for
    q, ret = acl.rt.malloc_cached(128, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    assert ret == ACL_SUCCESS
    strided = np.arange(64, dtype=np.int32)[::2]  # not contiguous
    ptr, c = acl.util.numpy_contiguous_to_ptr(strided)
    assert c.flags.c_contiguous and c.tolist() == strided.tolist() and ptr == c.ctypes.data
    assert acl.rt.memcpy(q, 128, ptr, c.nbytes, H2D) == ACL_SUCCESS
    assert np.frombuffer(bytes(read_back(q, c.nbytes)), np.int32).tolist() == strided.tolist()
    for ptr_ in (p, q):
        assert acl.rt.free(ptr_) == ACL_SUCCESS


def test_reset_device_force_releases_that_devices_context_and_streams():
    assert acl.rt.set_device(1) == ACL_SUCCESS
    try:
        s, ret = acl.rt.create_stream()
        assert ret == ACL_SUCCESS
        assert acl.rt.reset_device_force(1) == ACL_SUCCESS
        assert err(acl.rt.stream_query(s)) == ACL_ERROR_INVALID_RESOURCE_HANDLE
        assert err(acl.rt.get_device()) == ACL_ERROR_RT_CONTEXT_NULL  # no current context
    finally:
        assert acl.rt.set_device(0) == ACL_SUCCESS
    assert acl.rt.get_device() == (0, ACL_SUCCESS)


def test_execute_update_params_and_every_attribute_setter():
    a = np.arange(6, dtype=np.float32)
    b = np.full(6, 0.5, np.float32)
    o = Op()
    da, ba, _, _ = o.tensor(a, acl.ACL_FLOAT)
    db, bb, _, _ = o.tensor(b, acl.ACL_FLOAT)
    dc, bc, _, _ = o.tensor((6,), acl.ACL_FLOAT)
    attr = acl.op.create_attr()
    setters = {
        acl.op.set_attr_float: (1.5, "x"),
        acl.op.set_attr_string: ("NCHW", 3),
        acl.op.set_attr_list_int: ([1, 2], [1.5]),
        acl.op.set_attr_list_float: ([0.5, 2], ["a"]),
        acl.op.set_attr_list_bool: ([True, False], [None]),
        acl.op.set_attr_list_string: (["a", "b"], [1]),
    }
    for i, (setter, (good, bad)) in enumerate(setters.items()):
        assert setter(attr, f"name{i}", good) == ACL_SUCCESS
        with pytest.raises(TypeError, match="args parse failed"):
            setter(attr, f"name{i}", bad)
        assert err(setter(0x7FFF_FFF0, f"name{i}", good)) == ACL_ERROR_INVALID_RESOURCE_HANDLE
    assert acl.op.update_params("Add", [da, db], [dc], attr) == ACL_SUCCESS
    with pytest.raises(TypeError, match="args parse failed"):
        acl.op.update_params("Add", (da, db), [dc], attr)
    # aclopExecute (the deprecated form of execute_v2): same operator, same result.
    assert acl.op.execute("Add", [da, db], [ba, bb], [dc], [bc], attr, 0) == ACL_SUCCESS
    assert acl.rt.synchronize_stream(0) == ACL_SUCCESS
    assert np.array_equal(o.read(2, np.float32, (6,)), a + b)
    assert err(acl.op.execute("Nope", [da], [ba], [dc], [bc], attr, 0)) == ACL_ERROR_OP_NOT_FOUND
    o.close()
    acl.op.destroy_attr(attr)


def test_every_public_function_of_the_face_is_called_by_a_test():
    import inspect
    import pathlib
    import re

    here = pathlib.Path(__file__).parent
    text = "\n".join(p.read_text() for p in here.glob("test_acl*.py"))
    mods = {"acl": acl, "acl.rt": acl.rt, "acl.util": acl.util, "acl.op": acl.op}
    mods["acl.media"] = acl.media
    missing = []
    for prefix, mod in mods.items():
        for name in getattr(mod, "__all__", []):
            f = getattr(mod, name)
            if not callable(f) or inspect.isclass(f) or inspect.ismodule(f):
                continue
            if not re.search(rf"\b{re.escape(prefix)}\.{re.escape(name)}\b", text):
                missing.append(f"{prefix}.{name}")
    assert not missing, f"never called by tests/test_acl*.py: {missing}"
