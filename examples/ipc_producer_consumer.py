"""A producer process and a consumer process sharing device buffers zero-copy (IPC).

The producer fills buffers on its stream and records an interprocess event after each; it
sends the buffer (pickled as an IPC handle) and the event's handle through a
``multiprocessing`` queue. The consumer opens both, makes its stream wait for the producer's
record, sums the buffer with a kernel and sends the total back. No bytes are copied between
the processes: the consumer's buffer maps the producer's memory.
"""

import multiprocessing

import numpy as np

import runtime

ITEMS, N = 8, 4096


def consumer(inbox, outbox):
    runtime.init(device_count=1)
    s = runtime.Stream(0)
    out = runtime.empty(1, np.float64)
    while (item := inbox.get()) is not None:
        buf, event_handle = item  # buf was opened with runtime.ipc_open when unpickled
        ready = runtime.Event.from_ipc(event_handle)
        s.wait_event(ready)  # ordered after the producer's kernel, in the other process
        s.launch_kernel(runtime.kernels.sum, (out, buf))
        s.synchronize()
        outbox.put(float(out.copy_to_host()[0]))
    outbox.put(None)


def main():
    runtime.init(device_count=1)
    ctx = multiprocessing.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    worker = ctx.Process(target=consumer, args=(inbox, outbox))
    worker.start()
    s = runtime.Stream(0)
    keep = []  # the producer keeps its buffers alive while the consumer may use them
    for i in range(ITEMS):
        buf = runtime.empty(N, np.float64)
        s.launch_kernel(runtime.kernels.fill, (buf, float(i)))
        ready = runtime.Event(interprocess=True)
        ready.record(s)
        keep.append((buf, ready))
        inbox.put((buf, ready.ipc_handle()))
    inbox.put(None)
    totals = []
    while (t := outbox.get(timeout=120)) is not None:
        totals.append(t)
    worker.join(timeout=60)
    assert worker.exitcode == 0
    assert totals == [float(i * N) for i in range(ITEMS)], totals
    print(f"consumer process summed {len(totals)} buffers shared by the producer process")
    runtime.shutdown()


if __name__ == "__main__":
    main()
