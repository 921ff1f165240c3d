"""Example 4: submit copies on three streams in parallel, then one barrier."""

import numpy as np

import runtime

runtime.init()
device = runtime.Device(0)

stream1 = runtime.Stream(device)
stream2 = runtime.Stream(device)
stream3 = runtime.Stream(device)

# Three inputs and three outputs for the three copies.
n = 1 << 20
data1, data2, data3 = (runtime.to_device(np.full(n, k, np.float32)) for k in (1, 2, 3))
result1, result2, result3 = (runtime.empty(n, np.float32) for _ in range(3))

tasks = [
    (stream1, data1, result1),
    (stream2, data2, result2),
    (stream3, data3, result3),
]

for stream, data, result in tasks:
    runtime.memcpy_d2d(result, data, stream)

stream1.synchronize()
stream2.synchronize()
stream3.synchronize()

runtime.stream_synchronize()

for k, r in enumerate((result1, result2, result3), start=1):
    assert (r.copy_to_host() == k).all()
print("three streams copied", 3 * n * 4, "bytes")

for stream in [stream1, stream2, stream3]:
    stream.destroy()

runtime.shutdown()
