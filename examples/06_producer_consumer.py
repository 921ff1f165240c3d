"""Producer and consumer threads, each with its own stream, handing buffers over with events."""

import queue
import threading

import numpy as np

import runtime

runtime.init()
items, n = 16, 4096
handoff: "queue.Queue[tuple[int, runtime.DeviceBuffer, runtime.Event] | None]" = queue.Queue()
totals = []


def producer():
    s = runtime.Stream(0)
    for i in range(items):
        buf = runtime.empty(n, np.float64)
        s.launch_kernel(runtime.kernels.fill, (buf, float(i)))
        ready = runtime.Event()
        ready.record(s)
        handoff.put((i, buf, ready))  # the consumer waits on the event, not on the thread
    handoff.put(None)


def consumer():
    s = runtime.Stream(0)
    out = runtime.empty(1, np.float64)
    while (item := handoff.get()) is not None:
        i, buf, ready = item
        s.wait_event(ready)
        s.launch_kernel(runtime.kernels.sum, (out, buf))
        totals.append(out.copy_to_host()[0] if s.synchronize() is None else None)


threads = [threading.Thread(target=producer), threading.Thread(target=consumer)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert totals == [float(i * n) for i in range(items)], totals
print(f"consumer summed {len(totals)} buffers produced on another thread")
runtime.shutdown()
