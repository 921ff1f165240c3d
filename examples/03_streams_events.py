"""Example 3: a stream, two events, a device-to-device copy, timing."""

import runtime

runtime.init()
device = runtime.Device(0)

stream = runtime.Stream(device)

start_event = runtime.Event()
end_event = runtime.Event()

data = runtime.device_malloc(device, 1024 * 1024 * 4)
result = runtime.device_malloc(device, 1024 * 1024 * 4)

start_event.record(stream)

runtime.memcpy_d2d(result, data, stream)

end_event.record(stream)

stream.synchronize()

elapsed_ms = start_event.elapsed_time(end_event)
print(f"Elapsed: {elapsed_ms:.3f} ms")

start_event.destroy()
end_event.destroy()
stream.destroy()
runtime.shutdown()
