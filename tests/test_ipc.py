"""Inter-process memory and events: ``DeviceBuffer.ipc_handle`` / ``runtime.ipc_open``
(CUDA's ``cudaIpcGetMemHandle`` / ``cudaIpcOpenMemHandle``), ``Event(interprocess=True)`` /
``Event.from_ipc`` and pickling buffers through a ``multiprocessing`` queue (as
``torch.multiprocessing`` does for CUDA tensors).

Peers are real processes: ``python -c`` children driven line by line over pipes, and a
``multiprocessing`` spawn child. Tests check values, never timing.
"""

from __future__ import annotations

import asyncio
import copy
import gc
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

import runtime
from runtime import kernels

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="IPC maps memory through /proc")


@pytest.fixture(scope="module", autouse=True)
def rt():
    runtime.init(device_count=2, memory="256MiB")
    yield
    runtime.shutdown()


class Peer:
    """A fresh interpreter running ``code``; talk to it with ``send`` and ``recv``."""

    def __init__(self, code: str):
        prelude = "import sys, numpy as np, runtime\nruntime.init(device_count=2, memory='64MiB')\n"
        prelude += "def recv():\n    return sys.stdin.readline().strip()\n"
        prelude += "def send(*a):\n    print(*a, flush=True)\n"
        self.p = subprocess.Popen(
            [sys.executable, "-c", prelude + textwrap.dedent(code)],
            cwd=Path(__file__).parent,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def send(self, *words) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(" ".join(str(w) for w in words) + "\n")
        self.p.stdin.flush()

    def recv(self) -> list[str]:
        assert self.p.stdout is not None
        line = self.p.stdout.readline()
        if not line:
            _, err = self.p.communicate(timeout=60)
            raise AssertionError(f"peer ended: {err}")
        return line.split()

    def finish(self) -> None:
        _, err = self.p.communicate(timeout=60)  # also closes the pipes
        assert self.p.returncode == 0, err
        for word in ("panicked", "Traceback", "Fatal"):
            assert word not in err, err


def test_importer_reads_and_writes_the_exporters_memory_zero_copy():
    n = 1 << 18
    buf = runtime.to_device(np.arange(n, dtype=np.float32))
    runtime.stream_synchronize()
    peer = Peer(
        """
        h = bytes.fromhex(recv())
        b = runtime.ipc_open(h, "float32", (N,))
        send(b.device.index, b.nbytes, float(b.copy_to_host().sum()))
        recv()  # the exporter wrote after our import
        a = b.copy_to_host()
        send(float(a[0]), float(a[-1]))
        runtime.memcpy_host_to_device(b.view("float32", (4,), 0), np.full(4, 7, np.float32))
        send("wrote")
        recv()
        del b
        """.replace("N", str(n))
    )
    peer.send(buf.ipc_handle().hex())
    assert peer.recv() == ["0", str(4 * n), str(float(np.arange(n, dtype=np.float32).sum()))]
    runtime.memcpy_host_to_device(buf, np.full(n, 2.5, np.float32))
    peer.send("go")
    assert peer.recv() == ["2.5", "2.5"]
    assert peer.recv() == ["wrote"]
    back = buf.copy_to_host()
    assert back[:4].tolist() == [7.0] * 4 and (back[4:] == 2.5).all()
    peer.send("bye")
    peer.finish()


def test_the_import_survives_the_exporter_exiting_and_a_dead_exporters_handle_is_refused():
    peer = Peer(
        """
        b = runtime.to_device(np.arange(5000, dtype=np.int64))
        runtime.stream_synchronize()
        send(b.ipc_handle().hex())
        recv()
        """
    )
    handle = bytes.fromhex(peer.recv()[0])
    mine = runtime.ipc_open(handle, "int64", (5000,), device=1)
    assert mine.device == runtime.Device(1)
    peer.send("exit")
    peer.finish()
    gc.collect()
    assert mine.copy_to_host().tolist() == list(range(5000))
    # Still usable in kernels after the exporter is gone.
    out = runtime.empty(5000, "int64", device=1)
    s = runtime.Stream(1)
    s.launch_kernel(kernels.add, (out, mine, mine))
    s.synchronize()
    assert out.copy_to_host().tolist() == [2 * i for i in range(5000)]
    with pytest.raises(runtime.InvalidHandleError, match="has exited"):
        runtime.ipc_open(handle)


def test_a_handle_opens_again_under_a_new_runtime_while_the_old_import_is_held():
    """The process-wide table of open blocks (one allocation per block, no aliases) handed
    back the import of a runtime shut down since, while the program still held it: opening
    the same handle under the next runtime failed with "the runtime was shut down"
    (RELIABILITY.md W11)."""
    buf = runtime.to_device(np.arange(4, dtype=np.float32))
    runtime.stream_synchronize()
    peer = Peer(
        """
        h = bytes.fromhex(recv())
        old = runtime.ipc_open(h, "float32", (4,))
        runtime.shutdown()
        runtime.init(device_count=2, memory="64MiB")
        new = runtime.ipc_open(h, "float32", (4,))
        send(*new.copy_to_host().tolist())
        try:
            old.copy_to_host()
        except runtime.InvalidHandleError:
            send("old", "refused")
        recv()
        """
    )
    peer.send(buf.ipc_handle().hex())
    assert peer.recv() == ["0.0", "1.0", "2.0", "3.0"]
    assert peer.recv() == ["old", "refused"]
    peer.send("bye")
    peer.finish()


def test_an_import_cannot_reach_outside_the_exported_block():
    # A small buffer shares its page with neighbours; the import's bounds are the block.
    left = runtime.to_device(np.full(16, 1, np.uint8))
    mid = runtime.to_device(np.full(24, 2, np.uint8))
    right = runtime.to_device(np.full(16, 3, np.uint8))
    runtime.stream_synchronize()
    imp = runtime.ipc_open(mid.ipc_handle())  # this process, through /proc/self
    assert imp.nbytes == 24 and imp.copy_to_host().tolist() == [2] * 24
    with pytest.raises(ValueError):
        imp.view("uint8", (25,))
    with pytest.raises(ValueError):
        imp.view("uint8", (1,), 24)
    with pytest.raises(ValueError):
        runtime.memcpy_host_to_device(imp, np.zeros(25, np.uint8))
    with pytest.raises(ValueError):
        runtime.ipc_open(mid.ipc_handle(), "float64", (4,))
    runtime.memset(imp, 9, 24)
    assert left.copy_to_host().tolist() == [1] * 16
    assert right.copy_to_host().tolist() == [3] * 16
    assert mid.copy_to_host().tolist() == [9] * 24


def test_imported_memory_is_accounted_apart_from_the_allocator():
    a = runtime.device_malloc(0, 4 << 20)
    h = a.ipc_handle()
    assert a.ipc_handle() == h
    before = runtime.memory_stats(1)
    b = runtime.ipc_open(h, device=1)
    after = runtime.memory_stats(1)
    for key in ("allocated", "reserved", "active_allocations", "num_allocs"):
        assert before[key] == after[key], key
    assert b.nbytes == 4 << 20
    assert b.ipc_handle() == h  # an import hands on the original handle
    del b


def test_bad_forged_and_stale_handles_are_refused_with_clear_errors():
    with pytest.raises(ValueError, match="not a runtime IPC memory handle"):
        runtime.ipc_open(b"not a handle")
    buf = runtime.device_malloc(0, 1000)
    h = bytearray(buf.ipc_handle())
    for at in (40, 48, 56):  # nonce, offset, length
        forged = bytearray(h)
        forged[at] ^= 0x40
        with pytest.raises(runtime.InvalidHandleError):
            runtime.ipc_open(bytes(forged))
    runtime.device_free(buf)
    del buf
    gc.collect()
    with pytest.raises(runtime.InvalidHandleError, match="freed"):
        runtime.ipc_open(bytes(h))
    with pytest.raises(ValueError, match="zero bytes"):
        runtime.device_malloc(0, 0).ipc_handle()
    with pytest.raises(ValueError, match="interprocess=True"):
        runtime.Event().ipc_handle()
    with pytest.raises(ValueError, match="not a runtime IPC event handle"):
        runtime.Event.from_ipc(b"x" * 48)


def test_an_interprocess_event_orders_another_process_after_the_record():
    gate = threading.Event()
    s = runtime.Stream(0)
    ev = runtime.Event(interprocess=True)
    assert ev.interprocess and not runtime.Event().interprocess
    buf = runtime.empty(1024, "float32", device=0)
    s.launch_host_func(gate.wait, 60)
    s.launch_kernel(kernels.fill, (buf, 3.0))
    ev.record(s)
    peer = Peer(
        """
        ev = runtime.Event.from_ipc(bytes.fromhex(recv()))
        b = runtime.ipc_open(bytes.fromhex(recv()), "float32", (1024,))
        send("query", ev.query())
        s = runtime.Stream(0)
        out = runtime.empty(1024, "float32")
        s.wait_event(ev)  # the stream waits for the other process's record
        s.launch_kernel(runtime.kernels.add, (out, b, b))
        send("queued")
        ev.synchronize(timeout=60)
        send("synced", ev.query())
        s.synchronize()
        send("sum", float(out.copy_to_host().sum()))
        """
    )
    peer.send(ev.ipc_handle().hex())
    peer.send(buf.ipc_handle().hex())
    assert peer.recv() == ["query", "False"]
    assert peer.recv() == ["queued"]
    gate.set()
    assert peer.recv() == ["synced", "True"]
    assert peer.recv() == ["sum", str(float(6.0 * 1024))]
    peer.finish()
    s.synchronize()


def test_an_exporter_dying_before_its_record_completes_fails_the_wait():
    peer = Peer(
        """
        import os, threading
        gate = threading.Event()
        s = runtime.Stream(0)
        ev = runtime.Event(interprocess=True)
        s.launch_host_func(gate.wait, 60)
        ev.record(s)
        send(ev.ipc_handle().hex())
        recv()
        os._exit(0)
        """
    )
    ev = runtime.Event.from_ipc(bytes.fromhex(peer.recv()[0]))
    assert ev.query() is False
    peer.send("die")
    peer.finish()
    with pytest.raises(runtime.InvalidHandleError, match="exited"):
        ev.synchronize(timeout=60)
    with pytest.raises(runtime.InvalidHandleError):
        ev.query()


def _double_in_child(q_in, q_out):
    runtime.init(device_count=1, memory="64MiB")
    buf = q_in.get(timeout=60)
    s = runtime.Stream(0)
    s.launch_kernel(kernels.add, (buf, buf, buf))
    s.synchronize()
    q_out.put((buf.dtype.str, buf.shape, buf.offset, float(buf.copy_to_host().sum())))


def test_buffers_travel_through_a_multiprocessing_queue_as_handles():
    base = runtime.to_device(np.arange(64, dtype=np.float32).reshape(8, 8))
    runtime.stream_synchronize()
    view = base.view("float32", (2, 8), 16 * 4)  # rows 2..3
    ctx = multiprocessing.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_double_in_child, args=(q_in, q_out))
    p.start()
    q_in.put(view)
    dtype, shape, offset, total = q_out.get(timeout=120)
    p.join(timeout=60)
    assert p.exitcode == 0
    assert (dtype, shape, offset) == ("<f4", (2, 8), 64)
    want = np.arange(64, dtype=np.float32).reshape(8, 8)
    want[2:4] *= 2
    assert total == float(want[2:4].sum())
    assert (base.copy_to_host() == want).all()


def test_pickling_within_a_process_shares_and_deepcopy_copies():
    a = runtime.to_device(np.arange(10, dtype=np.int32))
    runtime.stream_synchronize()
    alias = pickle.loads(pickle.dumps(a))
    shallow = copy.copy(a)
    deep = copy.deepcopy(a)
    runtime.memset(a, 0, 40)
    assert alias.copy_to_host().tolist() == [0] * 10
    assert shallow.copy_to_host().tolist() == [0] * 10
    assert deep.copy_to_host().tolist() == list(range(10))
    assert (alias.dtype, alias.shape) == (a.dtype, a.shape)


def _event_child(event, p2c, c2p):
    runtime.init(device_count=1, memory="64MiB")
    c2p.put(0)  # ready
    p2c.get(timeout=60)  # the parent recorded
    c2p.put(event.query())
    event.synchronize(timeout=60)
    c2p.put(event.query())


def test_an_interprocess_event_pickles_to_a_child_process():
    # Translated from torch's test/test_multiprocessing.py::test_event_multiprocess: the event
    # travels as a Process argument; the child sees the parent's pending record, then waits.
    event = runtime.Event(enable_timing=False, interprocess=True)
    assert event.query()
    ctx = multiprocessing.get_context("spawn")
    p2c, c2p = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_event_child, args=(event, p2c, c2p))
    p.start()
    c2p.get(timeout=60)
    gate = threading.Event()
    s = runtime.Stream(0)
    s.launch_host_func(gate.wait, 60)
    event.record(s)
    p2c.put(0)
    try:
        assert c2p.get(timeout=60) is False
        assert event.query() is False
    finally:
        gate.set()
    assert c2p.get(timeout=60) is True
    p.join(timeout=60)
    assert p.exitcode == 0
    with pytest.raises(ValueError, match="interprocess=True"):
        pickle.dumps(runtime.Event())


# -- issue 22: views, empty buffers, importer records, dead and zombie processes ------------


def test_pickled_views_open_their_own_bytes_not_the_allocations_first():
    base = runtime.to_device(np.arange(64, dtype=np.uint8))
    runtime.stream_synchronize()
    views = {
        "slice": base[4:8],
        "plus": base + 16,
        "slice of plus": (base + 4)[2:6],
        "typed slice": base.view("int32")[3:5],
        "view of slice": base[8:40].view("int16", (4,), 6),
        "minus": (base + 40) - 8,
    }
    for name, v in views.items():
        w = pickle.loads(pickle.dumps(v))
        assert (w.dtype, w.shape, w.offset) == (v.dtype, v.shape, v.offset), name
        assert w.copy_to_host().tobytes() == v.copy_to_host().tobytes(), name
    # In another process too: it writes through its view, the rest stays as it was.
    peer = Peer(
        """
        import pickle
        v = pickle.loads(bytes.fromhex(recv()))
        send(v.offset, v.copy_to_host().tolist())
        runtime.memset(v, 0xEE)
        runtime.stream_synchronize()
        send("done")
        recv()
        """
    )
    peer.send(pickle.dumps(base[10:13]).hex())
    assert peer.recv() == ["10", "[10,", "11,", "12]"]
    assert peer.recv() == ["done"]
    got = base.copy_to_host()
    want = np.arange(64, dtype=np.uint8)
    want[10:13] = 0xEE
    assert got.tolist() == want.tolist()
    peer.send("bye")
    peer.finish()


def test_a_zero_byte_buffer_pickles_to_an_empty_buffer():
    # torch.multiprocessing sends empty tensors (test_empty_tensor_sharing).
    for b in (runtime.device_malloc(0, 0), runtime.empty((0, 3), "float32")):
        w = pickle.loads(pickle.dumps(b))
        assert (w.nbytes, w.shape, w.dtype) == (0, b.shape, b.dtype)
        assert w.copy_to_host().size == 0
    # A zero-byte view of a non-empty allocation still shares its allocation.
    base = runtime.to_device(np.arange(8, dtype=np.uint8))
    z = pickle.loads(pickle.dumps(base[3:3]))
    assert (z.nbytes, z.offset) == (0, 3)
    with pytest.raises(ValueError, match="zero bytes"):
        runtime.device_malloc(0, 0).ipc_handle()  # the handle itself: nothing to map


def test_a_record_made_by_the_importer_is_seen_by_the_exporter():
    # Translated from torch's test/test_multiprocessing.py::test_event_handle_exporter: the
    # child opens the parent's event, records it behind slow work on its own stream; the
    # parent's query says pending and its synchronize waits for the child's record. (The
    # child's "slow work" is held by a gate the test opens: no timing.)
    e0 = runtime.Event(enable_timing=False, interprocess=True)
    peer = Peer(
        """
        import threading
        e1 = runtime.Event.from_ipc(bytes.fromhex(recv()))
        gate = threading.Event()
        s = runtime.Stream(0)
        s.launch_host_func(gate.wait, 60)
        e1.record(s)
        send("recorded", e1.query())
        recv()
        gate.set()
        s.synchronize()
        send("done", e1.query())
        recv()
        """
    )
    peer.send(e0.ipc_handle().hex())
    assert peer.recv() == ["recorded", "False"]
    assert e0.query() is False  # the child's record is pending
    s = runtime.Stream(0)
    s.wait_event(e0)  # a stream here waits for the other process's record too
    log = []
    s.launch_host_func(log.append, "after")
    peer.send("go")
    e0.synchronize(timeout=60)
    assert e0.query() is True
    s.synchronize(timeout=60)
    assert log == ["after"]
    assert peer.recv() == ["done", "True"]
    peer.send("bye")
    peer.finish()


def _multiply_two(q, ready, done):
    runtime.init(device_count=1, memory="64MiB")
    ready.set()
    event, tensor = q.get(timeout=60)
    s = runtime.Stream(0)
    s.wait_event(event)
    s.launch_kernel(kernels.scale, (tensor, tensor, 2.0))
    event.record(s)
    done.set()
    s.synchronize()


def test_event_orders_the_exporter_after_the_importers_record():
    # Translated from torch's test/test_multiprocessing.py::test_event (cuda_multiply_two):
    # the parent adds 1 behind slow work and records; the child waits on that record,
    # multiplies by 2 and records the same event; the parent's synchronize waits for the
    # child's record, so it reads 4, never 2 or 1.
    ctx = multiprocessing.get_context("spawn")
    q, ready, done = ctx.Queue(), ctx.Event(), ctx.Event()
    p = ctx.Process(target=_multiply_two, args=(q, ready, done))
    p.start()
    assert ready.wait(60)
    s = runtime.Stream(0)
    tensor = runtime.to_device(np.ones(4, np.float32), stream=s)
    event = runtime.Event(interprocess=True)
    gate = threading.Event()
    s.launch_host_func(gate.wait, 60)  # "torch.cuda._sleep": held until the child waits
    s.launch_kernel(kernels.add, (tensor, tensor, runtime.to_device(np.ones(4, np.float32))))
    event.record(s)
    q.put((event, tensor))
    threading.Timer(0.05, gate.set).start()
    assert done.wait(60)  # the child recorded the event
    event.synchronize(timeout=60)
    assert tensor.copy_to_host().tolist() == [4.0, 4.0, 4.0, 4.0]
    p.join(timeout=60)
    assert p.exitcode == 0


def test_an_importer_dying_with_its_record_pending_fails_the_exporters_wait():
    ev = runtime.Event(interprocess=True)
    peer = Peer(
        """
        import os, threading
        e = runtime.Event.from_ipc(bytes.fromhex(recv()))
        s = runtime.Stream(0)
        s.launch_host_func(threading.Event().wait, 60)
        e.record(s)
        send("recorded")
        recv()
        os._exit(0)
        """
    )
    peer.send(ev.ipc_handle().hex())
    assert peer.recv() == ["recorded"]
    assert ev.query() is False
    s = runtime.Stream(0)
    s.wait_event(ev)
    log = []
    s.launch_host_func(log.append, "behind the wait")
    peer.send("die")
    peer.finish()
    with pytest.raises(runtime.InvalidHandleError, match=r"pid \d+\) exited before it completed"):
        ev.synchronize(timeout=60)
    # The stream waiting on it reports the same error and skipped the work behind the wait.
    with pytest.raises(runtime.InvalidHandleError, match="exited before it completed"):
        s.synchronize(timeout=60)
    assert log == []
    # The exporter's event works again with its next record.
    ev.record(s)
    ev.synchronize(timeout=60)
    s.synchronize(timeout=60)


def test_an_exporter_killed_but_not_reaped_is_dead_to_its_importers():
    # A SIGKILLed exporter that its parent has not reaped is a zombie: /proc still shows it
    # with its start time, but it runs nothing more.
    code = textwrap.dedent(
        """
        import sys, threading, numpy as np, runtime
        runtime.init(device_count=1, memory="64MiB")
        s = runtime.Stream(0)
        ev = runtime.Event(interprocess=True)
        s.launch_host_func(threading.Event().wait, 600)
        ev.record(s)
        buf = runtime.to_device(np.arange(16, dtype=np.uint8))
        print(ev.ipc_handle().hex(), flush=True)
        print(buf.ipc_handle().hex(), flush=True)
        sys.stdin.readline()
        """
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=Path(__file__).parent,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None
        ev_handle = bytes.fromhex(p.stdout.readline().strip())
        mem_handle = bytes.fromhex(p.stdout.readline().strip())
        ev = runtime.Event.from_ipc(ev_handle)
        assert ev.query() is False
        async_result = []

        async def waits():
            try:
                await ev
                async_result.append("resolved")
            except runtime.InvalidHandleError as e:
                async_result.append(str(e))

        os.kill(p.pid, signal.SIGKILL)
        # Not reaped: wait until /proc shows the zombie.
        for _ in range(2000):
            with open(f"/proc/{p.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            threading.Event().wait(0.005)
        else:
            raise AssertionError("the child never became a zombie")
        with pytest.raises(runtime.InvalidHandleError, match="exited"):
            ev.synchronize(timeout=60)
        asyncio.run(asyncio.wait_for(waits(), 60))
        assert len(async_result) == 1 and "exited" in async_result[0]
        with pytest.raises(runtime.InvalidHandleError, match="exited"):
            runtime.Event.from_ipc(ev_handle)
        with pytest.raises(runtime.InvalidHandleError, match="exited"):
            runtime.ipc_open(mem_handle)
    finally:
        p.kill()
        p.communicate(timeout=60)  # reaps it and closes the pipes


def test_await_on_an_imported_event_whose_exporter_died_raises_as_synchronize_does():
    peer = Peer(
        """
        import os, threading
        s = runtime.Stream(0)
        ev = runtime.Event(interprocess=True)
        s.launch_host_func(threading.Event().wait, 60)
        ev.record(s)
        send(ev.ipc_handle().hex())
        recv()
        os._exit(0)
        """
    )
    ev = runtime.Event.from_ipc(bytes.fromhex(peer.recv()[0]))

    async def main():
        fut = asyncio.ensure_future(_await(ev))
        await asyncio.sleep(0)
        assert not fut.done()
        peer.send("die")
        with pytest.raises(runtime.InvalidHandleError, match="exited"):
            await fut

    asyncio.run(asyncio.wait_for(main(), 60))
    peer.finish()
    with pytest.raises(runtime.InvalidHandleError, match="exited"):
        ev.synchronize(timeout=60)


async def _await(ev):
    return await ev


def test_an_imported_event_completing_at_interpreter_exit_never_panics():
    # The importer parks a Python completion callback on the event and exits; the exporter
    # completes the record while the importer's interpreter is going away. The watcher thread
    # must not attach to a finalising interpreter (it panicked "The Python interpreter is
    # not initialized" in most runs). Several rounds: the timing of the exit varies.
    for _ in range(6):
        gate = threading.Event()
        s = runtime.Stream(0)
        ev = runtime.Event(interprocess=True)
        s.launch_host_func(gate.wait, 60)
        ev.record(s)
        peer = Peer(
            """
            e = runtime.Event.from_ipc(bytes.fromhex(recv()))
            reg = e._on_complete(lambda err: print("completed", err, flush=True))
            send("parked", e.query())
            """
        )
        peer.send(ev.ipc_handle().hex())
        assert peer.recv() == ["parked", "False"]
        gate.set()  # completes while the peer exits
        peer.finish()
        s.synchronize()
