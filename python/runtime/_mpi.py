"""Collectives across processes and machines over MPI (through ``mpi4py``).

:func:`init_mpi` is called by every process of an MPI job with the devices that process drives;
it returns one :class:`MPICommunicator` per device. The ranks of the job are (process, device)
pairs numbered process by process: process 0's devices are ranks ``0 .. n0-1``, process 1's
follow, and so on. Each communicator has the methods of the in-process communicators
(``all_reduce``, ``broadcast``, ``reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``,
``send``, ``recv``, ``barrier``, ``abort``, ``destroy``) with NCCL's count semantics.

How an operation runs: the call checks its arguments and queues a host function on the rank's
stream (``stream=None``: the device's current stream), so it runs in stream order, after the
work queued before it, and the work queued after it waits for it. The host function hands MPI
numpy views of the device memory itself (virtual device memory is host memory): nothing is
staged. When a process drives several devices, the collective is hierarchical: the last local
rank to reach it reduces or gathers the local buffers with numpy, makes one MPI call across the
processes, and writes the result to every local buffer; the other local ranks wait for it.

Ordering: every rank must issue the same collectives in the same order, as with NCCL. Each
:func:`init_mpi` duplicates its MPI communicator, so groups do not interfere; within a group
the k-th collective of every local rank is the k-th MPI call of the process.

Timeouts and abort: a collective of up to 256 KiB is one non-blocking MPI call, polled;
before a larger one the processes meet at a non-blocking barrier on a second duplicate
communicator, which is polled, and once every process has arrived the collective itself is
MPI's blocking call (its fastest path for bulk data; see BENCHMARKS.md). A rank whose peers
never arrive gives up after ``timeout`` seconds: its host function raises
``runtime.WaitTimeoutError`` (seen as a ``KernelError`` at the stream's next synchronisation)
and the communicator is broken: every later call on it raises.
:meth:`MPICommunicator.abort` does the same at once (NCCL's ``ncclCommAbort``): it releases
every local rank waiting in the group without ending the process. What cannot be interrupted:
a large collective whose processes have all arrived runs to its end (a peer that dies inside
it is MPI's to report), and an abandoned non-blocking call cannot be cancelled, so the peers
still waiting in it give up only at their own timeout. ``send`` and ``recv`` are polled
non-blocking calls throughout. Ending the whole job is left to the caller
(``comm.mpi_comm.Abort()``).

Threads: the host functions run on runtime worker threads, so MPI must be initialised with
``MPI_THREAD_MULTIPLE`` (what ``mpi4py`` asks for by default). With ``MPI_THREAD_SERIALIZED``
every MPI call of the process is made under one lock and every call is non-blocking and
polled (a blocking call would hold the lock while it waits); lower levels are refused.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import numpy as np

import runtime as _rt

__all__ = ["MPICommunicator", "init_mpi"]

_OPS = ("sum", "prod", "max", "min", "avg")
_NP_OPS: dict[str, Callable[..., Any]] = {
    "sum": np.add,
    "prod": np.multiply,
    "max": np.maximum,
    "min": np.minimum,
    "avg": np.add,
}
_DTYPES = frozenset(
    np.dtype(t)
    for t in (
        "int8",
        "uint8",
        "int16",
        "uint16",
        "int32",
        "uint32",
        "int64",
        "uint64",
        "float32",
        "float64",
    )
)
# After this long inside one MPI call a poll loop also sleeps between polls (a peer is late, so
# the latency no longer matters, and the core is left to others).
_SPIN_S = 0.05
_NAP_S = 0.0002
# Collectives up to this many bytes are one polled non-blocking call; larger ones an arrival
# barrier and MPI's blocking call (see _Group.coll; both measured in BENCHMARKS.md).
_SMALL = 256 << 10
# The arrival barrier moves no data: after this long a late peer is what it waits for.
_ARRIVAL_SPIN_S = 0.005


_MPI_MOD: Any = None  # mpi4py.MPI once init_mpi has run


def _mpi():
    """The ``mpi4py.MPI`` module, or an ImportError saying how to install it."""
    if _MPI_MOD is not None:
        return _MPI_MOD
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise ImportError(
            "runtime's MPI communicators need mpi4py and an MPI library: "
            "pip install mpi4py mpich (the package's 'mpi' extra)"
        ) from e
    return MPI


# Held around every MPI call when the library gives less than MPI_THREAD_MULTIPLE.
_SERIAL_LOCK: threading.Lock | None = None


class _NoLock:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _mpi_lock():
    return _SERIAL_LOCK if _SERIAL_LOCK is not None else _NoLock()


def _view(buf) -> np.ndarray:
    """A writable flat numpy array over the device memory of ``buf`` (no copy)."""
    return np.asarray(buf).reshape(-1)


class _Broken(Exception):
    pass


class _Label:
    """An operation's name for error messages, formatted only when one is raised."""

    __slots__ = ("fmt", "args")

    def __init__(self, fmt: str, *args: Any):
        self.fmt = fmt
        self.args = args

    def __str__(self) -> str:
        return self.fmt.format(*self.args)


class _Slot:
    """One rendezvous of the local ranks of a group (a collective, or a local send/recv)."""

    __slots__ = ("desc", "expected", "payload", "done", "error", "left")

    def __init__(self, desc, expected):
        self.desc = desc
        self.expected = expected
        self.payload: dict[int, Any] = {}
        self.done = False
        self.error: BaseException | None = None
        self.left = 0


class _Group:
    """What the communicators of one :func:`init_mpi` call share in this process."""

    def __init__(self, comm, devices, counts, timeout):
        self.comm = comm
        self.devices = devices
        self.proc = comm.Get_rank()
        self.nprocs = comm.Get_size()
        self.counts = counts  # local device count of every process
        self.offsets = [sum(counts[:p]) for p in range(len(counts))]
        self.size = sum(counts)
        self.nlocal = counts[self.proc]
        self.max_local = max(counts)
        self.timeout = timeout
        self.cond = threading.Condition()
        self.slots: dict[tuple, _Slot] = {}
        self.seq = [0] * self.nlocal
        self.p2p_send: dict[tuple[int, int], int] = {}
        self.p2p_recv: dict[tuple[int, int], int] = {}
        self.broken: str | None = None
        self.destroyed: set[int] = set()
        self.pending = 0
        self.pending_lock = threading.Lock()
        self.freed = False
        # MPI_THREAD_MULTIPLE: the communicator of the arrival barriers (see coll()).
        self.arrival = None

    # --- rank arithmetic -------------------------------------------------------------------
    def where(self, rank: int) -> tuple[int, int]:
        """(process, local index) of a global rank."""
        for p in range(self.nprocs - 1, -1, -1):
            if rank >= self.offsets[p]:
                return p, rank - self.offsets[p]
        raise AssertionError(rank)

    # --- failure ---------------------------------------------------------------------------
    def fail(self, why: str) -> None:
        with self.cond:
            if self.broken is None:
                self.broken = why
            self.cond.notify_all()

    def check(self) -> None:
        if self.broken is not None:
            raise _Broken(self.broken)

    # --- waiting for MPI -------------------------------------------------------------------
    def wait(self, req, what, spin: float = _SPIN_S) -> None:
        """Poll ``req`` until it completes, the group breaks, or the timeout passes (polls
        back to back for ``spin`` seconds, then with naps that leave the GIL to others)."""
        start = time.monotonic()
        deadline = None if self.timeout is None else start + self.timeout
        while True:
            with _mpi_lock():
                if req.Test():
                    return
            if self.broken is not None:
                raise _Broken(f"{what}: abandoned, the communicator is broken: {self.broken}")
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                why = (
                    f"{what} did not complete within {self.timeout:g} s (process "
                    f"{self.proc} of {self.nprocs}); a peer process never joined it. The MPI "
                    "request is abandoned and the communicator is broken"
                )
                self.fail(why)
                raise _rt.WaitTimeoutError(why)
            if now - start > spin:
                time.sleep(_NAP_S)

    def mpi(self, what, start: Callable[[], Any], spin: float = _SPIN_S) -> None:
        """Start a non-blocking MPI call and wait for it."""
        self.check()
        with _mpi_lock():
            req = start()
        self.wait(req, what, spin)

    def coll(self, what, name: str, nbytes: int, *args, **kw) -> None:
        """The collective ``comm.<name>(*args, **kw)`` across the processes, interruptibly.

        Up to ``_SMALL`` bytes (``nbytes``: the largest buffer, the same in every process), or
        below MPI_THREAD_MULTIPLE, the non-blocking form of the call is polled: one
        collective, the least latency (below MPI_THREAD_MULTIPLE the calls of the process are
        serialised by a lock, which a blocking call would hold for its whole length). Larger
        ones first meet at a non-blocking barrier on the group's arrival communicator, polled
        (timeout, abort); once it completes every process has reached this collective, so
        MPI's blocking call, its fastest path for bulk data, cannot wait for a missing peer.
        """
        if self.arrival is not None and nbytes > _SMALL:
            self.mpi(
                _Label("{} (waiting for every process to reach it)", what),
                self.arrival.Ibarrier,
                _ARRIVAL_SPIN_S,
            )
            getattr(self.comm, name)(*args, **kw)
            return
        nonblocking = getattr(self.comm, "I" + name[0].lower() + name[1:])
        self.mpi(what, lambda: nonblocking(*args, **kw))

    # --- local rendezvous ------------------------------------------------------------------
    def rendezvous(self, key, desc, local, expected, payload, action, what):
        """Join slot ``key``; the last local rank to arrive runs ``action(payloads)``."""
        if expected == 1:
            self.check()
            try:
                action({local: payload})
            except BaseException as e:
                self.fail(f"{what} failed: {type(e).__name__}: {e}")
                raise
            return
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        with self.cond:
            self.check()
            slot = self.slots.get(key)
            if slot is None:
                slot = self.slots[key] = _Slot(desc, expected)
            if slot.desc != desc:
                why = (
                    f"{what}: local ranks disagree about the operation: {slot.desc} and {desc} "
                    "(every rank must issue the same collectives, in the same order, with the "
                    "same counts)"
                )
                self.broken = self.broken or why
                self.cond.notify_all()
                raise _Broken(why)
            slot.payload[local] = payload
            leader = len(slot.payload) == slot.expected
            while not leader and not slot.done:
                if self.broken is not None:
                    self._leave(key, slot)
                    raise _Broken(f"{what}: {self.broken}")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    missing = sorted(set(range(expected)) - set(slot.payload))
                    why = (
                        f"{what} waited {self.timeout:g} s for local rank(s) {missing} of "
                        f"process {self.proc} to join it"
                    )
                    self.broken = self.broken or why
                    self.cond.notify_all()
                    self._leave(key, slot)
                    raise _rt.WaitTimeoutError(why)
                self.cond.wait(None if left is None else min(left, 1.0))
        if leader:
            err = None
            try:
                action(slot.payload)
            except BaseException as e:  # noqa: BLE001 - handed to every local rank
                err = e
            with self.cond:
                slot.done = True
                slot.error = err
                if err is not None and self.broken is None:
                    self.broken = f"{what} failed: {type(err).__name__}: {err}"
                self.cond.notify_all()
        with self.cond:
            self._leave(key, slot)
            if slot.error is not None:
                if leader:
                    raise slot.error
                raise _Broken(f"{what}: {self.broken}") from slot.error

    def _leave(self, key, slot) -> None:
        slot.left += 1
        if slot.left >= len(slot.payload) and (slot.done or self.broken is not None):
            self.slots.pop(key, None)

    # --- lifetime --------------------------------------------------------------------------
    def begin(self) -> None:
        with self.pending_lock:
            self.pending += 1

    def end(self) -> None:
        with self.pending_lock:
            self.pending -= 1
            last = not self.pending and len(self.destroyed) == self.nlocal
        if last:
            with self.cond:
                self._maybe_free()

    def _maybe_free(self) -> None:
        with self.pending_lock:
            busy = self.pending
        if self.freed or busy or len(self.destroyed) < self.nlocal:
            return
        self.freed = True
        if self.broken is None:
            try:
                with _mpi_lock():
                    self.comm.Free()
                    if self.arrival is not None:
                        self.arrival.Free()
            except Exception:  # noqa: BLE001 - MPI already finalised at exit: nothing to free
                pass


def _same(a, b) -> bool:
    """Whether two DeviceBuffers are the same memory (an in-place call)."""
    return a.ptr == b.ptr and a.nbytes == b.nbytes


def _overlap(a, b) -> bool:
    """Whether two DeviceBuffers share any byte."""
    return a.ptr < b.ptr + b.nbytes and b.ptr < a.ptr + a.nbytes


def _reduce_local(op, arrays, out, first_is_out=False):
    """``out = op(arrays...)`` elementwise (``first_is_out``: ``out`` is ``arrays[0]``)."""
    f = _NP_OPS[op]
    if not first_is_out:
        np.copyto(out, arrays[0])
    for a in arrays[1:]:
        f(out, a, out=out)


def _divide(arr, n):
    """``arr /= n`` in place; integers are truncated toward zero, as C (and NCCL) divide."""
    if n == 1:
        return
    if arr.dtype.kind == "f":
        np.divide(arr, arr.dtype.type(n), out=arr)
        return
    neg = arr < 0
    np.abs(arr, out=arr)
    np.floor_divide(arr, arr.dtype.type(n), out=arr)
    np.negative(arr, out=arr, where=neg)


class MPICommunicator:
    """One rank of an MPI communicator: a device of this process (see :func:`init_mpi`).

    ``rank``, ``size`` and ``device`` as for NCCL; ``mpi_comm`` is the group's private MPI
    communicator (a duplicate of the one given to :func:`init_mpi`) and ``process_rank`` this
    process's rank in it.
    """

    def __init__(self, group: _Group, local: int):
        self._g = group
        self._local = local
        self.rank = group.offsets[group.proc] + local
        self.size = group.size
        self.device = group.devices[local]
        self._destroyed = False

    @property
    def mpi_comm(self):
        return self._g.comm

    @property
    def process_rank(self) -> int:
        return self._g.proc

    @property
    def timeout(self) -> float | None:
        """Seconds an operation waits for its peers (``init_mpi``'s ``timeout``)."""
        return self._g.timeout

    @property
    def aborted(self) -> bool:
        """Whether the communicator is unusable: ``abort()`` was called or an operation failed."""
        return self._g.broken is not None

    def __repr__(self) -> str:
        return (
            f"runtime.MPICommunicator(rank={self.rank}, size={self.size}, "
            f"device={self.device.index}, process={self._g.proc}/{self._g.nprocs})"
        )

    # --- argument checks (in the caller, before anything is queued) ------------------------
    def _usable(self, what: str) -> None:
        if self._destroyed:
            raise _rt.InvalidOperationError(f"{what}: communicator rank {self.rank} is destroyed")
        if self._g.broken is not None:
            raise _rt.InvalidOperationError(
                f"{what}: the communicator is broken ({self._g.broken}); destroy it and "
                "create a new one"
            )

    def _stream(self, stream, what):
        s = _rt.current_stream(self.device) if stream is None else stream
        if not isinstance(s, _rt.Stream):
            raise TypeError(f"{what}: stream must be a runtime.Stream or None, got {type(s)}")
        if s.device.index != self.device.index:
            raise ValueError(
                f"{what}: stream is on device {s.device.index}, but rank {self.rank} "
                f"drives device {self.device.index}"
            )
        return s

    def _buf(self, buf, name, what):
        if not isinstance(buf, _rt.DeviceBuffer):
            raise TypeError(f"{what}: {name} must be a runtime.DeviceBuffer, got {type(buf)}")
        if buf.device.index != self.device.index:
            raise ValueError(
                f"{what}: {name} is on device {buf.device.index}, but rank {self.rank} "
                f"drives device {self.device.index}"
            )
        if buf.dtype not in _DTYPES:
            raise TypeError(
                f"{what}: {name} has dtype {buf.dtype}, which MPI cannot reduce; use one of "
                f"{', '.join(sorted(str(d) for d in _DTYPES))} (view the buffer with "
                "buf.view(dtype))"
            )
        return buf

    @staticmethod
    def _same_dtype(a, b, what):
        if a.dtype != b.dtype:
            raise TypeError(f"{what}: send has dtype {a.dtype} but recv has dtype {b.dtype}")

    @staticmethod
    def _op(op, what):
        if op not in _OPS:
            raise ValueError(f"{what}: op must be one of {', '.join(_OPS)}, got {op!r}")
        return op

    def _root(self, root, what, name="root"):
        if isinstance(root, bool) or not isinstance(root, int):
            raise TypeError(f"{what}: {name} must be an int, got {type(root).__name__}")
        if not 0 <= root < self.size:
            raise ValueError(f"{what}: {name} {root} is out of range for {self.size} ranks")
        return root

    # --- queueing ----------------------------------------------------------------------------
    def _enqueue(self, stream, what, desc, payload, action):
        g = self._g
        seq = g.seq[self._local]
        g.seq[self._local] += 1
        local = self._local
        label = _Label("{} #{} (rank {})", what, seq, self.rank)

        def run():
            try:
                g.rendezvous(("coll", seq), desc, local, g.nlocal, payload, action, label)
            except _Broken as e:
                raise _rt.InvalidOperationError(str(e)) from None
            finally:
                g.end()

        run.__name__ = run.__qualname__ = f"mpi_{what}"
        g.begin()
        try:
            stream.launch_host_func(run)
        except BaseException:
            g.seq[self._local] -= 1
            g.end()
            raise

    # --- collectives -------------------------------------------------------------------------
    def all_reduce(self, send, recv, op: str = "sum", stream=None) -> None:
        """``recv = op(send of every rank)``, elementwise; ``send is recv`` works in place."""
        what = "all_reduce"
        self._usable(what)
        self._buf(send, "send", what)
        self._buf(recv, "recv", what)
        self._same_dtype(send, recv, what)
        op = self._op(op, what)
        if send.size != recv.size:
            raise ValueError(f"{what}: send has {send.size} elements but recv has {recv.size}")
        s = self._stream(stream, what)
        g = self._g
        MPI = _mpi()
        mop = _MPI_OP(MPI, op)

        def action(payload):
            sends = [_view(payload[i][0]) for i in range(g.nlocal)]
            recvs = [_view(payload[i][1]) for i in range(g.nlocal)]
            acc = recvs[0]
            same = _same(payload[0][0], payload[0][1])
            if g.nlocal == 1 and not same:
                src = sends[0]
            else:
                _reduce_local(op, sends, acc, same)
                src = MPI.IN_PLACE
            if g.nprocs > 1:
                g.coll(label, "Allreduce", acc.nbytes, src, acc, mop)
            elif src is not MPI.IN_PLACE:
                np.copyto(acc, src)
            if op == "avg":
                _divide(acc, g.size)
            for r in recvs[1:]:
                np.copyto(r, acc)

        label = _Label("all_reduce of {} {}", send.size, send.dtype)
        self._enqueue(s, what, (what, send.size, send.dtype, op), (send, recv), action)

    def broadcast(self, buf, root: int, stream=None) -> None:
        """Every rank's ``buf`` = rank ``root``'s ``buf``."""
        what = "broadcast"
        self._usable(what)
        self._buf(buf, "buf", what)
        root = self._root(root, what)
        s = self._stream(stream, what)
        g = self._g
        rproc, rlocal = g.where(root)

        def action(payload):
            bufs = [_view(payload[i]) for i in range(g.nlocal)]
            src = bufs[rlocal] if g.proc == rproc else bufs[0]
            if g.nprocs > 1:
                g.coll(label, "Bcast", src.nbytes, src, root=rproc)
            for b in bufs:
                if b is not src:
                    np.copyto(b, src)

        label = _Label("broadcast of {} {} from rank {}", buf.size, buf.dtype, root)
        self._enqueue(s, what, (what, buf.size, buf.dtype, root), buf, action)

    def reduce(self, send, recv, root: int, op: str = "sum", stream=None) -> None:
        """Rank ``root``'s ``recv = op(send of every rank)``; ``recv`` is unused elsewhere
        (it may be None there)."""
        what = "reduce"
        self._usable(what)
        self._buf(send, "send", what)
        root = self._root(root, what)
        op = self._op(op, what)
        if recv is not None or self.rank == root:
            self._buf(recv, "recv", what)
            self._same_dtype(send, recv, what)
            if send.size != recv.size:
                raise ValueError(f"{what}: send has {send.size} elements but recv has {recv.size}")
        s = self._stream(stream, what)
        g = self._g
        MPI = _mpi()
        mop = _MPI_OP(MPI, op)
        rproc, rlocal = g.where(root)

        def action(payload):
            sends = [_view(payload[i][0]) for i in range(g.nlocal)]
            here = g.proc == rproc
            if here:
                acc = _view(payload[rlocal][1])
            elif g.nlocal == 1:
                acc = sends[0]
            else:
                acc = np.empty_like(sends[0])
            same = here and _same(payload[0][0], payload[rlocal][1])
            if here and g.nlocal == 1 and not same:
                src = sends[0]
            elif not here and g.nlocal == 1:
                src = acc
            else:
                _reduce_local(op, sends, acc, same)
                src = MPI.IN_PLACE if here else acc
            if g.nprocs > 1:
                if here:
                    g.coll(label, "Reduce", acc.nbytes, src, acc, mop, root=rproc)
                else:
                    g.coll(label, "Reduce", acc.nbytes, src, None, mop, root=rproc)
            elif src is not MPI.IN_PLACE:
                np.copyto(acc, src)
            if here and op == "avg":
                _divide(acc, g.size)

        label = _Label("reduce of {} {} to rank {}", send.size, send.dtype, root)
        self._enqueue(s, what, (what, send.size, send.dtype, op, root), (send, recv), action)

    def all_gather(self, send, recv, stream=None) -> None:
        """``recv[r*count:(r+1)*count] = send of rank r`` for every rank, count = send.size."""
        what = "all_gather"
        self._usable(what)
        self._buf(send, "send", what)
        self._buf(recv, "recv", what)
        self._same_dtype(send, recv, what)
        if recv.size != send.size * self.size:
            raise ValueError(
                f"{what}: recv has {recv.size} elements; it needs send's {send.size} times "
                f"{self.size} ranks = {send.size * self.size}"
            )
        s = self._stream(stream, what)
        g = self._g
        MPI = _mpi()
        n = send.size
        dt = send.dtype

        def action(payload):
            sends = [_view(payload[i][0]) for i in range(g.nlocal)]
            recvs = [_view(payload[i][1]) for i in range(g.nlocal)]
            acc = recvs[0]
            base = g.offsets[g.proc]
            if g.nprocs > 1 and g.max_local == 1 and n and not _overlap(*payload[0]):
                g.coll(label, "Allgather", acc.nbytes, sends[0], acc)
            else:
                for i, x in enumerate(sends):
                    np.copyto(acc[(base + i) * n : (base + i + 1) * n], x)
                if g.nprocs > 1 and n:
                    counts = [c * n for c in g.counts]
                    displs = [o * n for o in g.offsets]
                    spec = [acc, (counts, displs), _mpi_type(MPI, dt)]
                    # Not MPI_IN_PLACE: MPICH's blocking Allgatherv then trips an overlapping
                    # memcpy when processes contribute different counts (seen with 1, 2, 1).
                    mine = acc[base * n : (base + g.nlocal) * n].copy()
                    g.coll(label, "Allgatherv", acc.nbytes, mine, spec)
            for r in recvs[1:]:
                np.copyto(r, acc)

        label = _Label("all_gather of {} {}", n, dt)
        self._enqueue(s, what, (what, n, dt), (send, recv), action)

    def reduce_scatter(self, send, recv, op: str = "sum", stream=None) -> None:
        """``recv = op(send[rank*count:(rank+1)*count] of every rank)``, count = recv.size."""
        what = "reduce_scatter"
        self._usable(what)
        self._buf(send, "send", what)
        self._buf(recv, "recv", what)
        self._same_dtype(send, recv, what)
        op = self._op(op, what)
        if send.size != recv.size * self.size:
            raise ValueError(
                f"{what}: send has {send.size} elements; it needs recv's {recv.size} times "
                f"{self.size} ranks = {recv.size * self.size}"
            )
        s = self._stream(stream, what)
        g = self._g
        MPI = _mpi()
        mop = _MPI_OP(MPI, op)
        n = recv.size
        dt = recv.dtype

        def action(payload):
            sends = [_view(payload[i][0]) for i in range(g.nlocal)]
            recvs = [_view(payload[i][1]) for i in range(g.nlocal)]
            base = g.offsets[g.proc]
            if g.nprocs > 1 and g.max_local == 1 and n and not _overlap(*payload[0]):
                g.coll(label, "Reduce_scatter_block", sends[0].nbytes, sends[0], recvs[0], mop)
                if op == "avg":
                    _divide(recvs[0], g.size)
                return
            acc = np.empty_like(sends[0])
            _reduce_local(op, sends, acc)
            if g.nprocs > 1 and n:
                counts = [c * n for c in g.counts]
                mine = np.empty_like(acc[: g.nlocal * n])  # not MPI_IN_PLACE (see all_gather)
                g.coll(label, "Reduce_scatter", acc.nbytes, acc, mine, counts, mop)
            else:
                mine = acc[base * n : (base + g.nlocal) * n]
            if op == "avg":
                _divide(mine, g.size)
            for i, r in enumerate(recvs):
                np.copyto(r, mine[i * n : (i + 1) * n])

        label = _Label("reduce_scatter to {} {}", n, dt)
        self._enqueue(s, what, (what, n, dt, op), (send, recv), action)

    def all_to_all(self, send, recv, stream=None) -> None:
        """Chunk ``j`` of ``send`` goes to rank ``j``; chunk ``i`` of ``recv`` comes from rank
        ``i`` (chunks of ``send.size // size`` elements)."""
        what = "all_to_all"
        self._usable(what)
        self._buf(send, "send", what)
        self._buf(recv, "recv", what)
        self._same_dtype(send, recv, what)
        if send.size != recv.size or send.size % self.size:
            raise ValueError(
                f"{what}: send ({send.size} elements) and recv ({recv.size}) must be the same "
                f"size, a multiple of {self.size} ranks"
            )
        if send.ptr == recv.ptr and send.size:
            raise ValueError(f"{what}: send and recv must not be the same memory")
        s = self._stream(stream, what)
        g = self._g
        MPI = _mpi()
        n = send.size // self.size
        dt = send.dtype

        def action(payload):
            sends = [_view(payload[i][0]) for i in range(g.nlocal)]
            recvs = [_view(payload[i][1]) for i in range(g.nlocal)]
            if g.nprocs == 1 or not n:
                for i, r in enumerate(recvs):
                    for j, x in enumerate(sends):
                        np.copyto(r[j * n : (j + 1) * n], x[i * n : (i + 1) * n])
                return
            if g.max_local == 1:
                g.coll(label, "Alltoall", sends[0].nbytes, sends[0], recvs[0])
                return
            # Pack, per destination process q: for each local source l, for each rank of q.
            L = g.nlocal
            out = np.empty(L * g.size * n, dt)
            scounts, sdispls, pos = [], [], 0
            for q in range(g.nprocs):
                sdispls.append(pos)
                lo, hi = g.offsets[q] * n, (g.offsets[q] + g.counts[q]) * n
                for x in sends:
                    out[pos : pos + hi - lo] = x[lo:hi]
                    pos += hi - lo
                scounts.append(pos - sdispls[-1])
            # Receive, per source process p: for each of its ranks, a chunk per local rank.
            inn = np.empty(L * g.size * n, dt)
            rcounts = [g.counts[p] * L * n for p in range(g.nprocs)]
            rdispls = [g.offsets[p] * L * n for p in range(g.nprocs)]
            t = _mpi_type(MPI, dt)
            g.coll(
                label,
                "Alltoallv",
                g.size * n * dt.itemsize,  # the same in every process
                [out, (scounts, sdispls), t],
                [inn, (rcounts, rdispls), t],
            )
            for p in range(g.nprocs):
                for src in range(g.counts[p]):
                    at = rdispls[p] + src * L * n
                    for m, r in enumerate(recvs):
                        j = g.offsets[p] + src
                        r[j * n : (j + 1) * n] = inn[at + m * n : at + (m + 1) * n]

        label = _Label("all_to_all of {} {}", send.size, dt)
        self._enqueue(s, what, (what, send.size, dt), (send, recv), action)

    def barrier(self, stream=None) -> None:
        """Stream-ordered barrier: work queued after it on ``stream`` waits until every rank
        has reached it (``stream.synchronize()`` waits for that on the host)."""
        what = "barrier"
        self._usable(what)
        s = self._stream(stream, what)
        g = self._g

        def action(payload):
            if g.nprocs > 1:
                g.coll("barrier", "Barrier", 0)

        self._enqueue(s, what, (what,), None, action)

    # --- point to point ----------------------------------------------------------------------
    def _p2p(self, buf, peer, stream, sending):
        what = "send" if sending else "recv"
        self._usable(what)
        self._buf(buf, "buf", what)
        peer = self._root(peer, what, "peer")
        if peer == self.rank:
            raise ValueError(f"{what}: peer {peer} is this rank; a rank cannot {what} to itself")
        s = self._stream(stream, what)
        g = self._g
        pproc, plocal = g.where(peer)
        src, dst = (self.rank, peer) if sending else (peer, self.rank)
        counters = g.p2p_send if sending else g.p2p_recv
        k = counters.get((src, dst), 0)
        counters[(src, dst)] = k + 1
        desc = ("p2p", buf.size, buf.dtype)
        label = _Label(
            "{} of {} {} #{} {} rank {} (rank {})",
            what,
            buf.size,
            buf.dtype,
            k,
            "to" if sending else "from",
            peer,
            self.rank,
        )
        if pproc == g.proc:

            def action(payload):
                np.copyto(_view(payload[1]), _view(payload[0]))

            slot_local = 0 if sending else 1

            def run():
                try:
                    g.rendezvous(("p2p", src, dst, k), desc, slot_local, 2, buf, action, label)
                except _Broken as e:
                    raise _rt.InvalidOperationError(str(e)) from None
                finally:
                    g.end()

        else:
            # Tags name the (source, destination) local pair; the source process is MPI's own.
            tag = (self._local if sending else plocal) * g.max_local + (
                plocal if sending else self._local
            )

            def run():
                try:
                    v = _view(buf)
                    if sending:
                        g.mpi(label, lambda: g.comm.Isend(v, dest=pproc, tag=tag))
                    else:
                        g.mpi(label, lambda: g.comm.Irecv(v, source=pproc, tag=tag))
                except _Broken as e:
                    raise _rt.InvalidOperationError(str(e)) from None
                finally:
                    g.end()

        run.__name__ = run.__qualname__ = f"mpi_{what}"
        g.begin()
        try:
            s.launch_host_func(run)
        except BaseException:
            counters[(src, dst)] = k
            g.end()
            raise

    def send(self, buf, peer: int, stream=None) -> None:
        """Send ``buf`` to rank ``peer`` (which calls ``recv`` with as many elements)."""
        self._p2p(buf, peer, stream, True)

    def recv(self, buf, peer: int, stream=None) -> None:
        """Receive into ``buf`` what rank ``peer`` sends."""
        self._p2p(buf, peer, stream, False)

    # --- lifetime ----------------------------------------------------------------------------
    def abort(self) -> None:
        """Break the communicator now (``ncclCommAbort``): every local rank waiting in it, and
        every operation still queued, fails with ``InvalidOperationError`` instead of waiting.
        Peer processes are not told; they give up at their own timeout."""
        self._g.fail(f"aborted by rank {self.rank}")
        self._release()

    def destroy(self) -> None:
        """Release this rank (``ncclCommDestroy``). Operations already queued still run; the
        MPI communicator is freed after the last of them, once every local rank is destroyed."""
        self._release()

    def _release(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        g = self._g
        with g.cond:
            g.destroyed.add(self._local)
            g._maybe_free()


def _MPI_OP(MPI, op):  # noqa: N802 - mirrors MPI's names
    return {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN, "avg": MPI.SUM}[op]


def _mpi_type(MPI, dtype):  # noqa: N803
    from mpi4py.util.dtlib import from_numpy_dtype

    return from_numpy_dtype(dtype)


def init_mpi(devices=None, mpi_comm=None, timeout: float | None = 300.0) -> list[MPICommunicator]:
    """Join the MPI job's communicator with this process's ``devices``; one communicator each.

    Every process of ``mpi_comm`` (default ``MPI.COMM_WORLD``) must call it. ``devices``: a
    list of devices (ints or ``runtime.Device``) this process drives, default the current
    device; processes may drive different numbers of devices. Global ranks number process 0's
    devices first, in the order given. ``timeout``: seconds any one operation (and this call)
    waits for its peers before it fails and breaks the communicator (None: wait forever).
    Needs ``runtime.init()`` first and ``mpi4py`` (``pip install mpi4py mpich``, the ``mpi`` extra).
    """
    global _SERIAL_LOCK, _MPI_MOD
    MPI = _mpi()
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise TypeError(f"timeout must be a number of seconds or None, got {timeout!r}")
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        timeout = float(timeout)
    if devices is None:
        devs = [_rt.Device(_rt.get_device())]
    else:
        if isinstance(devices, (int, _rt.Device)):
            raise TypeError("devices must be a list of devices, e.g. [0, 1]")
        devs = [d if isinstance(d, _rt.Device) else _rt.Device(d) for d in devices]
    if not devs:
        raise ValueError("devices must name at least one device")
    idx = [d.index for d in devs]
    if len(set(idx)) != len(idx):
        raise ValueError(f"devices must be distinct, got {idx}")
    if not MPI.Is_initialized() or MPI.Is_finalized():
        raise _rt.InvalidOperationError("MPI is not initialised (or already finalised)")
    level = MPI.Query_thread()
    if level < MPI.THREAD_SERIALIZED:
        raise _rt.InvalidOperationError(
            "MPI was initialised below MPI_THREAD_SERIALIZED; runtime's host functions call "
            "MPI from worker threads (let mpi4py initialise MPI: mpi4py.rc.thread_level = "
            "'multiple', the default)"
        )
    if level < MPI.THREAD_MULTIPLE and _SERIAL_LOCK is None:
        _SERIAL_LOCK = threading.Lock()
    _MPI_MOD = MPI
    base = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
    if not isinstance(base, MPI.Intracomm):
        raise TypeError(f"mpi_comm must be an mpi4py intracommunicator, got {type(base)}")
    probe = _Group(base, devs, [len(devs)] * base.Get_size(), timeout)
    with _mpi_lock():
        comm, req = base.Idup()
    probe.wait(req, "init_mpi (duplicating the MPI communicator)")
    probe.comm = comm
    counts = np.zeros(base.Get_size(), np.int64)
    mine = np.array([len(devs)], np.int64)
    probe.mpi("init_mpi (exchanging device counts)", lambda: comm.Iallgather(mine, counts))
    group = _Group(comm, devs, [int(c) for c in counts], timeout)
    if _SERIAL_LOCK is None:
        arrival, req = comm.Idup()
        probe.wait(req, "init_mpi (duplicating the MPI communicator)")
        group.arrival = arrival
    return [MPICommunicator(group, i) for i in range(len(devs))]
