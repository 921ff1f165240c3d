"""Example 2: allocate device memory, copy in and out, free."""

import numpy as np

import runtime

runtime.init()

device = runtime.Device(0)
size = 1024 * 1024 * 4  # 4 MB

dev_ptr = runtime.device_malloc(device, size)

host_data = np.random.randn(1024, 1024).astype(np.float32)
runtime.memcpy_host_to_device(dev_ptr, host_data)

# 在设备上使用（这里只是一个例子，实际要用算子）: double it with a native kernel
x = dev_ptr.view(np.float32, (1024, 1024))
runtime.kernels.scale(x, x, 2.0)

result = np.empty_like(host_data)
runtime.memcpy_device_to_host(result, dev_ptr)
assert np.allclose(result, 2 * host_data)
print("round trip ok:", result[0, :3])

runtime.device_free(dev_ptr)
runtime.shutdown()
