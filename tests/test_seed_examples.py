"""The seed document's examples 1 and 2, verbatim (examples 3 and 4 live in test_stream.py)."""

from __future__ import annotations

import numpy as np

import runtime


def test_example_1_device_query(capsys):
    # 1. 初始化 runtime
    runtime.init()

    # 2. 查看设备
    num_devices = runtime.get_device_count()
    print(f"Available devices: {num_devices}")

    for i in range(num_devices):
        props = runtime.get_device_properties(i)
        print(f"Device {i}: {props.name}")
        print(f"  Memory: {props.total_memory / 1024**3:.1f} GB")
        print(f"  Compute: {props.clock_rate / 1000:.0f} MHz")

    # 3. 选择设备
    device = runtime.Device(0)

    # 4. 清理
    runtime.shutdown()

    out = capsys.readouterr().out
    assert "Available devices: 8" in out
    assert out.count("Virtual Ascend 910") == 8
    assert "Memory: 32.0 GB" in out and "Compute: 1000 MHz" in out
    assert device.index == 0


def test_example_2_memory():
    # 初始化
    runtime.init()

    # 分配设备内存
    device = runtime.Device(0)
    size = 1024 * 1024 * 4  # 4 MB

    # 分配
    dev_ptr = runtime.device_malloc(device, size)

    # 拷贝数据（CPU → NPU）
    host_data = np.random.randn(1024, 1024).astype(np.float32)
    runtime.memcpy_host_to_device(dev_ptr, host_data)

    # 拷贝结果（NPU → CPU）
    result = np.empty_like(host_data)
    runtime.memcpy_device_to_host(result, dev_ptr)

    assert np.array_equal(result, host_data)

    # 释放
    runtime.device_free(dev_ptr)

    # 清理
    runtime.shutdown()


def test_seed_options_and_info_snippets():
    runtime.init()
    runtime.set_option("enableMemoryReuse", True)
    runtime.set_option("enablePipelining", True)
    runtime.set_option("enableAsync", True)
    mem_info = runtime.get_device_memory_info(0)
    assert f"Used: {mem_info.used / 1024**3:.1f} GB" == "Used: 0.0 GB"
    assert f"Free: {mem_info.free / 1024**3:.1f} GB" == "Free: 32.0 GB"
    compute_info = runtime.get_device_compute_info(0)
    assert f"FLOPS: {compute_info.fpeak / 10**12:.1f} TFLOPS" == "FLOPS: 256.0 TFLOPS"
    devices = runtime.get_available_devices()
    runtime.set_device(0)
    current = runtime.get_device()
    assert len(devices) == 8 and current == 0
    runtime.shutdown()
