"""Example 1: initialise and query the devices."""

import runtime

# 1. 初始化 runtime
runtime.init()

# 2. 查看设备
num_devices = runtime.get_device_count()
print(f"Available devices: {num_devices}")

for i in range(num_devices):
    props = runtime.get_device_properties(i)
    print(f"Device {i}: {props.name}")
    print(f"  Memory: {props.total_memory / 1024**3:.0f} GiB")
    print(f"  Compute: {props.clock_rate / 1000:.0f} MHz")

# 3. 选择设备
device = runtime.Device(0)

# 4. 清理
runtime.shutdown()
