"""Devices, properties, the current device, options."""

from __future__ import annotations

import re
import threading

import pytest

import runtime


@pytest.fixture(autouse=True, scope="module")
def rt():
    runtime.shutdown()
    runtime.init()
    yield
    runtime.shutdown()


def test_defaults_give_eight_virtual_devices():
    assert runtime.get_device_count() == 8
    devs = runtime.get_available_devices()
    assert devs == [runtime.Device(i) for i in range(8)]
    for d in devs:
        p = d.get_properties()
        assert "Virtual" in p.name
        assert p.total_memory == 32 * 1024**3
        assert p.clock_rate == 1_000_000
        assert p.cores == 32
        assert p.fpeak == 256e12
        assert p.memory_bandwidth > 0


def test_properties_are_immutable_records():
    p = runtime.get_device_properties(3)
    assert p.index == 3
    assert p == runtime.Device(3).get_properties()
    with pytest.raises(AttributeError):
        p.name = "x"
    d = dict(p)
    assert d == p.to_dict()
    assert d["total_memory"] == p.total_memory and p["cores"] == 32
    assert repr(p).startswith("DeviceProperties(index=3, name='Virtual")
    with pytest.raises(KeyError):
        p["nope"]


def test_memory_and_compute_info():
    m = runtime.get_device_memory_info(0)
    assert (m.total, m.used, m.reserved, m.cached, m.peak) == (32 * 1024**3, 0, 0, 0, 0)
    assert m.used + m.cached + m.free == m.total
    buf = runtime.device_malloc(0, 3 * 1024 * 1024)
    m2 = runtime.get_device_memory_info(runtime.Device(0))
    assert m2.used == 3 * 1024 * 1024 and m2.peak >= m2.used and m2.free < m.free
    runtime.device_free(buf)
    c = runtime.get_device_compute_info(0)
    assert c.fpeak == 256e12 and c.cores == 32 and c.clock_rate == 1_000_000
    assert c.compute_engines >= 1
    assert "fpeak" in dict(c) and repr(c).startswith("ComputeInfo(")


def test_device_objects_compare_hash_and_repr():
    assert runtime.Device(2) == runtime.Device(2)
    assert runtime.Device(2) != runtime.Device(3)
    assert len({runtime.Device(1), runtime.Device(1), runtime.Device(0)}) == 2
    assert repr(runtime.Device(5)) == "runtime.Device(5)"
    assert runtime.Device(5).index == 5
    assert int(runtime.Device(4)) == 4
    assert runtime.Device(runtime.Device(6)).index == 6


@pytest.mark.parametrize("bad", [8, 100, -1, 2**70])
def test_invalid_device_index_gives_range(bad):
    with pytest.raises(runtime.InvalidDeviceError, match=r"0\.\.=7"):
        runtime.Device(bad)
    with pytest.raises(ValueError):
        runtime.get_device_properties(bad) if bad < 2**63 else runtime.Device(bad)


@pytest.mark.parametrize("bad", ["0", 1.5, None, True, [0]])
def test_wrong_device_types_are_type_errors(bad):
    if bad is not None:  # None is the current device for get_device_properties
        with pytest.raises(TypeError, match="device"):
            runtime.get_device_properties(bad)
    with pytest.raises(TypeError, match="device"):
        runtime.set_device(bad)


# Device strings, as torch.device spells them (torch: test/test_cuda.py and
# test/test_torch.py::test_device, whose accepted forms are "cuda", "cuda:N"; here "npu" is the
# device type and "cuda" its alias).
def test_device_strings_name_devices_everywhere():
    assert runtime.Device("npu:3") == runtime.Device(3)
    assert runtime.Device("cuda:7") == runtime.Device(7)
    assert runtime.get_device_properties("npu:2").index == 2
    assert runtime.get_device_memory_info("cuda:1").device == 1
    b = runtime.device_malloc("npu:5", 16)
    assert b.device == runtime.Device(5)
    e = runtime.empty(4, "float32", device="cuda:6")
    assert e.device == runtime.Device(6)
    s = runtime.Stream(device="npu:4")
    assert s.device == runtime.Device(4)
    assert runtime.current_stream("npu:4").device == runtime.Device(4)
    assert runtime.get_default_memory_pool("npu:5").device == runtime.Device(5)
    assert runtime.MemoryAsyncPool("cuda:3").device == runtime.Device(3)
    runtime.synchronize("npu:5")
    with runtime.Device("npu:2"):
        assert runtime.get_device() == 2
    assert runtime.get_device() == 0
    del b, e
    s.synchronize()


def test_bare_device_type_is_the_current_device():
    runtime.set_device("npu:3")
    try:
        assert runtime.get_device() == 3
        assert runtime.Device("npu") == runtime.Device(3)
        assert runtime.Device("cuda") == runtime.Device(3)
        assert runtime.empty(2, "int32", device="npu").device == runtime.Device(3)
        with runtime.Device(6):
            assert runtime.Device("npu").index == 6
    finally:
        runtime.set_device(0)


def test_device_strings_in_communicators():
    from runtime import comm

    comms = comm.init_all(["npu:1", "cuda:2"])
    assert [c.device for c in comms] == [runtime.Device(1), runtime.Device(2)]
    with pytest.raises(TypeError, match="devices"):
        comm.init_all("npu:0")


@pytest.mark.parametrize("bad", ["gpu:0", "cpu", "npu:x", "npu:-1", "npu:01", "npu:", "cuda:1.0"])
def test_malformed_device_strings_are_value_errors_naming_argument_and_value(bad):
    for f in (runtime.set_device, runtime.Device, lambda d: runtime.device_malloc(d, 8)):
        with pytest.raises(ValueError, match="(device|index).*" + re.escape(repr(bad)[1:-1])):
            f(bad)
    with pytest.raises(ValueError, match="device"):
        runtime.Stream(device=bad)


@pytest.mark.parametrize("bad", ["npu:8", "cuda:8", "npu:99999999999999999999999"])
def test_out_of_range_device_strings_are_invalid_devices(bad):
    with pytest.raises(runtime.InvalidDeviceError, match=r"device:.*0\.\.=7"):
        runtime.set_device(bad)
    with pytest.raises(runtime.InvalidDeviceError, match=re.escape(bad)):
        runtime.Device(bad)
    assert runtime.get_device() == 0


def test_invalid_device_is_also_runtime_error():
    assert issubclass(runtime.InvalidDeviceError, runtime.Error)
    assert issubclass(runtime.InvalidDeviceError, ValueError)
    assert issubclass(runtime.Error, RuntimeError)


def test_current_device_is_per_thread():
    assert runtime.get_device() == 0
    results = {}
    barrier = threading.Barrier(8, timeout=30)

    def work(i):
        runtime.set_device(i)
        barrier.wait()
        results[i] = runtime.get_device()

    ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert results == {i: i for i in range(8)}
    assert runtime.get_device() == 0


def test_device_context_manager_restores():
    runtime.set_device(1)
    with runtime.Device(4) as d:
        assert d.index == 4 and runtime.get_device() == 4
        with runtime.Device(6):
            assert runtime.get_device() == 6
        assert runtime.get_device() == 4
    assert runtime.get_device() == 1
    runtime.set_device(runtime.Device(0))
    assert runtime.get_device() == 0


def test_device_synchronize():
    s = runtime.Stream(2)
    hits = []
    s.launch_host_func(hits.append, 1)
    runtime.Device(2).synchronize()
    assert hits == [1]
    runtime.synchronize(2)
    runtime.synchronize()


def test_options_defaults_roundtrip_and_errors():
    for name in ("enableMemoryReuse", "enablePipelining", "enableAsync", "enableBatching"):
        assert runtime.get_option(name) is True
        runtime.set_option(name, False)
        assert runtime.get_option(name) is False
        runtime.set_option(name, True)
    assert sorted(runtime.option_names()) == [
        "enableAsync",
        "enableBatching",
        "enableMemoryReuse",
        "enablePipelining",
        "legacyDefaultStream",
    ]
    assert runtime.get_option("legacyDefaultStream") is False
    with pytest.raises(ValueError, match="enableMemoryReuse.*enablePipelining.*enableAsync"):
        runtime.set_option("enableTurbo", True)
    with pytest.raises(ValueError, match="valid options"):
        runtime.get_option("nope")
    with pytest.raises(TypeError, match="must be a bool"):
        runtime.set_option("enableAsync", 1)
    with pytest.raises(TypeError, match="name"):
        runtime.set_option(3, True)


# issue 13 item 1: the torch-style memory queries and get_device_name ("None means the
# current device").
def test_torch_style_memory_queries_follow_memory_stats():
    import numpy as np

    runtime.shutdown()
    runtime.init(device_count=2, memory="64MiB")
    try:
        runtime.empty_cache()
        runtime.reset_peak_memory_stats(1)
        base = runtime.memory_allocated(1)
        free0, total0 = runtime.mem_get_info(1)
        assert total0 == 64 << 20
        buf = runtime.to_device(np.zeros(1 << 20, np.uint8), device=1)
        assert runtime.memory_allocated(1) == base + (1 << 20)
        assert runtime.max_memory_allocated(1) >= base + (1 << 20)
        assert runtime.memory_reserved(1) >= runtime.memory_allocated(1)
        assert runtime.max_memory_reserved(1) >= runtime.memory_reserved(1)
        free1, total1 = runtime.mem_get_info(1)
        assert (free1, total1) == (free0 - (1 << 20), total0)
        runtime.set_device(1)
        assert runtime.memory_allocated() == runtime.memory_allocated(1)
        assert runtime.mem_get_info() == runtime.mem_get_info(runtime.Device(1))
        assert runtime.get_device_name() == runtime.get_device_name(1)
        assert "virtual" in runtime.get_device_name().lower()
        with runtime.Device(0):
            assert runtime.get_device_name() == runtime.get_device_properties(0).name
            assert runtime.memory_allocated() == runtime.memory_stats(0)["allocated"]
        runtime.device_free(buf)
        assert runtime.memory_allocated(1) == base
    finally:
        runtime.shutdown()
        runtime.init()  # the module's runtime, for any test after this one
