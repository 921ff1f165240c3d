"""Collectives across processes and machines over MPI (through ``mpi4py``).

:func:`init_mpi` is called by every process of an MPI job with the devices that process drives;
it returns one :class:`MPICommunicator` per device. The ranks of the job are (process, device)
pairs numbered process by process: process 0's devices are ranks ``0 .. n0-1``, process 1's
follow, and so on. Each communicator has the methods of the in-process communicators
(``all_reduce``, ``all_reduce_coalesced``, ``broadcast`` (also out of place), ``reduce``,
``all_gather(v)``, ``reduce_scatter(v)``, ``all_to_all(v)``, ``all_to_all_single``,
``gather``, ``scatter``, ``send``, ``recv``, ``barrier``, ``split``, ``check_async_error``,
``abort``, ``destroy``) with NCCL's count semantics, every dtype and operator, and the same
errors. ``split`` gives a color spanning processes an MPI communicator of its own
(``MPI_Comm_create_group`` over the processes of that color).

How it works: these are the core's communicators (``runtime_core::comm::connect``), which own
the whole protocol as they do for the in-process ones: numbering (at issue, and at graph
launch for captured collectives), the rendezvous of the local ranks, the agreement check,
timeouts, ``abort``, local reductions and copies, and the reductions MPI cannot do (float16).
This module only moves bytes: :class:`_Transport` starts one MPI operation per exchange the
core asks for, on numpy views of the device memory itself (virtual device memory is host
memory, nothing is staged), and the core polls it (``test()``) until it completes, the
communicator is aborted or the collective's deadline passes. See ARCHITECTURE.md
("Collectives across processes").

Exchanges of up to 256 KiB are one non-blocking MPI call, polled; before a larger one the
processes meet at a non-blocking barrier on a second duplicate communicator, polled, and once
every process has arrived the collective itself is MPI's blocking call (its fastest path for
bulk data; see BENCHMARKS.md). What cannot be interrupted: a large collective whose processes
have all arrived runs to its end (a peer that dies inside it is MPI's to report), and an
abandoned non-blocking call cannot be cancelled: peers still waiting in it give up at their
own timeout, and MPI may still write into its buffers later (do not reuse the buffers of a
collective that timed out). Any failure (a timeout, an MPI error, ``abort()``) aborts the communicator: later
calls raise ``InvalidOperationError``. Ending the whole job is left to the caller
(``comm.mpi_comm.Abort()``).

Threads: the exchanges run on runtime worker threads, so MPI must be initialised with
``MPI_THREAD_MULTIPLE`` (what ``mpi4py`` asks for by default). With ``MPI_THREAD_SERIALIZED``
every MPI call of the process is made under one lock and every exchange is non-blocking and
polled (a blocking call would hold the lock while it waits); lower levels are refused.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

import runtime as _rt

from ._runtime import Communicator, comm_connect

__all__ = ["MPICommunicator", "init_mpi"]

# Exchanges up to this many bytes are one polled non-blocking call; larger ones an arrival
# barrier and MPI's blocking call (both measured in BENCHMARKS.md).
_SMALL = 256 << 10

# dtypes MPI reduces itself (every operator; complex numbers only sum and prod). Others
# (float16, bfloat16) the core gathers and reduces; booleans arrive as uint8 with max/min.
_REDUCES = frozenset(
    (dt, op)
    for dt in (
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
        "complex64",
        "complex128",
    )
    for op in ("sum", "prod", "max", "min", "band", "bor", "bxor")
    if not (dt.startswith("complex") and op in ("max", "min"))
    and not (dt[0] in "fc" and op.startswith("b"))
)

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
    """A writable flat numpy array over the device memory of a region (no copy). An empty
    region gets an array of its own: a zero-byte allocation's address is not its own (MPI would
    refuse it as aliasing another buffer at the same address)."""
    a = np.asarray(buf).reshape(-1)
    return a if a.size else np.empty(0, a.dtype)


def _displs(counts: list[int]) -> list[int]:
    out, at = [], 0
    for c in counts:
        out.append(at)
        at += c
    return out


class _Request:
    """A non-blocking MPI call in flight."""

    __slots__ = ("req", "keep")

    def __init__(self, req, keep=()):
        self.req = req
        self.keep = keep  # buffers MPI reads or writes until completion

    def test(self) -> bool:
        with _mpi_lock():
            return bool(self.req.Test())


class _Recv(_Request):
    """A receive: completes only with a message of exactly the buffer's size."""

    __slots__ = ("status", "nbytes", "source")

    def __init__(self, req, keep, status, nbytes, source):
        super().__init__(req, keep)
        self.status = status
        self.nbytes = nbytes
        self.source = source

    def test(self) -> bool:
        with _mpi_lock():
            if not self.req.Test(self.status):
                return False
        got = self.status.Get_count(_mpi().BYTE)
        if got != self.nbytes:
            raise ValueError(
                f"recv: process {self.source} sent {got} bytes for a {self.nbytes}-byte buffer "
                "(the ranks disagree about the count or dtype)"
            )
        return True


class _ThenBlocking:
    """The processes meet at a polled barrier; once all arrived, ``then()`` (MPI's blocking
    call, which then cannot wait for a missing peer) runs inside the last ``test()``."""

    __slots__ = ("barrier", "then")

    def __init__(self, barrier, then):
        self.barrier = barrier
        self.then = then

    def test(self) -> bool:
        if not self.barrier.test():
            return False
        self.then()
        return True


class _Setup:
    """The first exchange (the core's count exchange at connect): duplicate the MPI
    communicator (and, with MPI_THREAD_MULTIPLE, a second one for arrival barriers), then
    gather the counts, every step a polled non-blocking call."""

    def __init__(self, transport: _Transport, buf, counts):
        self.t = transport
        self.buf = _view(buf)
        self.counts = counts
        self.step: Any = None
        self.stage = 0

    def test(self) -> bool:
        t, MPI = self.t, _mpi()
        while True:
            if self.step is not None and not self.step.test():
                return False
            if self.stage == 0:
                with _mpi_lock():
                    comm, req = t.base.Idup()
                t.comm = comm
                self.step = _Request(req)
            elif self.stage == 1 and _SERIAL_LOCK is None:
                with _mpi_lock():
                    arrival, req = t.comm.Idup()
                t.arrival = arrival
                self.step = _Request(req)
            elif self.stage == 1:
                self.step = None
            elif self.stage == 2:
                me = t.comm.Get_rank()
                at = sum(self.counts[:me])
                mine = self.buf[at : at + self.counts[me]].copy()
                spec = [self.buf, (self.counts, _displs(self.counts)), MPI.BYTE]
                with _mpi_lock():
                    self.step = _Request(t.comm.Iallgatherv(mine, spec), (mine,))
            else:
                return True
            self.stage += 1


class _Transport:
    """Moves a communicator's bytes between the processes of ``base`` (see the module
    documentation); driven by the core through ``reduces`` and ``start``."""

    def __init__(self, base):
        self.base = base
        self.comm = None  # the private duplicate of ``base``, made by the first exchange
        self.arrival = None  # MPI_THREAD_MULTIPLE: the communicator of arrival barriers

    def reduces(self, dtype: str, op: str) -> bool:
        return (dtype, op) in _REDUCES

    def start(self, kind: str, *args):
        if self.comm is None:
            if kind != "all_gather":
                raise RuntimeError(
                    f"the MPI transport's first exchange must be connect's, got {kind}"
                )
            return _Setup(self, *args)
        return getattr(self, "_" + kind)(*args)

    # --- how an exchange waits -----------------------------------------------------------
    def _coll(self, nbytes: int, name: str, *args, **kw):
        """``comm.<name>(*args, **kw)`` across the processes: non-blocking and polled up to
        ``_SMALL`` bytes (``nbytes``: the largest buffer, the same in every process) or below
        MPI_THREAD_MULTIPLE; above, a polled barrier, then MPI's blocking call."""
        if self.arrival is not None and nbytes > _SMALL:
            with _mpi_lock():
                barrier = _Request(self.arrival.Ibarrier())
            return _ThenBlocking(barrier, lambda: getattr(self.comm, name)(*args, **kw))
        nonblocking = getattr(self.comm, "I" + name[0].lower() + name[1:])
        with _mpi_lock():
            return _Request(nonblocking(*args, **kw), (args,))

    @staticmethod
    def _typed(buf):
        """The array, and the buffer spec MPI reduces (mpi4py maps numpy's dtype to MPI's
        predefined type; the reductions are defined on those only)."""
        a = _view(buf)
        return a, a

    @staticmethod
    def _op(op: str):
        MPI = _mpi()
        return {
            "sum": MPI.SUM,
            "prod": MPI.PROD,
            "max": MPI.MAX,
            "min": MPI.MIN,
            "band": MPI.BAND,
            "bor": MPI.BOR,
            "bxor": MPI.BXOR,
        }[op]

    # --- the exchanges -------------------------------------------------------------------
    def _barrier(self):
        with _mpi_lock():
            return _Request(self.comm.Ibarrier())

    def _broadcast(self, buf, root: int):
        a = _view(buf)
        return self._coll(a.nbytes, "Bcast", [a, _mpi().BYTE], root=root)

    def _all_reduce(self, buf, op: str):
        a, spec = self._typed(buf)
        return self._coll(a.nbytes, "Allreduce", _mpi().IN_PLACE, spec, self._op(op))

    def _reduce(self, buf, op: str, root: int):
        a, spec = self._typed(buf)
        if self.comm.Get_rank() == root:
            return self._coll(a.nbytes, "Reduce", _mpi().IN_PLACE, spec, self._op(op), root=root)
        return self._coll(a.nbytes, "Reduce", spec, None, self._op(op), root=root)

    def _all_gather(self, buf, counts: list[int]):
        MPI = _mpi()
        a = _view(buf)
        me = self.comm.Get_rank()
        at = sum(counts[:me])
        # Not MPI_IN_PLACE: MPICH's blocking Allgatherv then trips an overlapping memcpy when
        # processes contribute different counts (seen with 1, 2, 1).
        mine = a[at : at + counts[me]].copy()
        if len(set(counts)) == 1:
            return self._coll(a.nbytes, "Allgather", [mine, MPI.BYTE], [a, MPI.BYTE])
        spec = [a, (counts, _displs(counts)), MPI.BYTE]
        return self._coll(a.nbytes, "Allgatherv", [mine, MPI.BYTE], spec)

    def _reduce_scatter(self, send, recv, counts: list[int], op: str):
        s, sspec = self._typed(send)
        _, rspec = self._typed(recv)
        if len(set(counts)) == 1:
            return self._coll(s.nbytes, "Reduce_scatter_block", sspec, rspec, self._op(op))
        return self._coll(s.nbytes, "Reduce_scatter", sspec, rspec, counts, self._op(op))

    def _all_to_all(self, send, send_counts: list[int], recv, recv_counts: list[int]):
        MPI = _mpi()
        s, r = _view(send), _view(recv)
        if len(set(send_counts)) == 1 and send_counts == recv_counts:
            return self._coll(s.nbytes, "Alltoall", [s, MPI.BYTE], [r, MPI.BYTE])
        # Processes driving different numbers of devices send different amounts, and every
        # process must take the same path: the polled non-blocking call, whatever the size.
        return self._coll(
            0,
            "Alltoallv",
            [s, (send_counts, _displs(send_counts)), MPI.BYTE],
            [r, (recv_counts, _displs(recv_counts)), MPI.BYTE],
        )

    def _gather(self, buf, counts: list[int], root: int):
        MPI = _mpi()
        a = _view(buf)
        if self.comm.Get_rank() == root:
            spec = [a, (counts, _displs(counts)), MPI.BYTE]
            return self._coll(sum(counts), "Gatherv", MPI.IN_PLACE, spec, root=root)
        return self._coll(sum(counts), "Gatherv", [a, MPI.BYTE], None, root=root)

    def _scatter(self, buf, counts: list[int], root: int):
        MPI = _mpi()
        a = _view(buf)
        if self.comm.Get_rank() == root:
            spec = [a, (counts, _displs(counts)), MPI.BYTE]
            return self._coll(sum(counts), "Scatterv", spec, MPI.IN_PLACE, root=root)
        return self._coll(sum(counts), "Scatterv", None, [a, MPI.BYTE], root=root)

    def split(self, processes: list[int], color: int) -> _Transport:
        """A transport over ``processes`` (ranks of this transport's MPI communicator, in the
        order of the new one), for a communicator split from this one: ``MPI_Comm_create_group``,
        called by exactly those processes (the core calls it right after an exchange all of
        them took part in, in the same order of colors everywhere)."""
        with _mpi_lock():
            group = self.comm.Get_group()
            sub_group = group.Incl(processes)
            sub = self.comm.Create_group(sub_group, tag=color % 32767)
            sub_group.Free()
            group.Free()
            arrival = sub.Dup() if _SERIAL_LOCK is None else None
        t = _Transport(sub)
        t.comm = sub
        t.arrival = arrival
        return t

    def _send(self, buf, to: int, tag: int):
        a = _view(buf)
        with _mpi_lock():
            return _Request(self.comm.Isend([a, _mpi().BYTE], dest=to, tag=tag), (a,))

    def _recv(self, buf, source: int, tag: int):
        MPI = _mpi()
        a = _view(buf)
        status = MPI.Status()
        with _mpi_lock():
            req = self.comm.Irecv([a, MPI.BYTE], source=source, tag=tag)
        return _Recv(req, (a,), status, a.nbytes, source)

    def __del__(self):
        MPI = _MPI_MOD
        if MPI is None or MPI.Is_finalized():
            return
        for c in (self.arrival, self.comm):
            if c is not None:
                try:
                    with _mpi_lock():
                        c.Free()
                except Exception:  # noqa: BLE001, S110 - nothing to do about a failed free
                    pass


class MPICommunicator:
    """One rank of an MPI communicator: a device of this process (see :func:`init_mpi`).

    ``rank``, ``size`` and ``device`` as for NCCL; ``mpi_comm`` is the communicator's private
    MPI communicator (a duplicate of the one given to :func:`init_mpi`; for one made by
    ``split`` whose ranks are all in this process, None) and ``process_rank`` this process's
    rank in it. Every method is the core communicator's (``runtime.comm``).
    """

    def __init__(self, inner: Communicator, transport: _Transport | None, timeout: float | None):
        self._c = inner
        self._t = transport
        self._timeout = timeout

    @property
    def rank(self) -> int:
        return self._c.rank

    @property
    def size(self) -> int:
        return self._c.size

    @property
    def device(self) -> _rt.Device:
        return self._c.device

    @property
    def mpi_comm(self):
        t = self._t if self._t is not None else self._c.transport
        return None if t is None else t.comm

    @property
    def process_rank(self) -> int:
        return self._c.process

    @property
    def timeout(self) -> float | None:
        """Seconds an operation waits for its peers (``init_mpi``'s ``timeout``)."""
        return self._timeout

    @property
    def aborted(self) -> bool:
        """Whether the communicator is unusable: ``abort()`` was called or an operation failed."""
        return self._c.aborted

    def __repr__(self) -> str:
        return (
            f"runtime.MPICommunicator(rank={self.rank}, size={self.size}, "
            f"device={self.device.index}, process={self._c.process}/{self._c.processes})"
        )

    def all_reduce(self, send, recv, op="sum", stream=None) -> None:
        """``recv = op(send of every rank)``, elementwise; ``send is recv`` works in place."""
        self._c.all_reduce(send, recv, op, stream)

    def all_reduce_coalesced(self, send, recv=None, op="sum", stream=None) -> None:
        """``all_reduce`` of a list of buffers in one collective (``recv=None``: in place)."""
        self._c.all_reduce_coalesced(send, recv, op, stream)

    def broadcast(self, buf, root: int, stream=None, recv=None) -> None:
        """Every rank's ``buf`` = rank ``root``'s ``buf``; with ``recv``, every rank's
        ``recv`` = rank ``root``'s ``buf`` (out of place; ``buf`` may be None elsewhere)."""
        self._c.broadcast(buf, root, stream, recv)

    def reduce(self, send, recv, root: int, op="sum", stream=None) -> None:
        """Rank ``root``'s ``recv = op(send of every rank)``; ``recv`` is unused elsewhere
        (it may be None there)."""
        self._c.reduce(send, recv, root, op, stream)

    def all_gather(self, send, recv, stream=None) -> None:
        """``recv[r*count:(r+1)*count] = send of rank r`` for every rank, count = send.size."""
        self._c.all_gather(send, recv, stream)

    def all_gatherv(self, send, recv, counts, stream=None) -> None:
        """``recv`` = every rank's ``send`` back to back, ``counts[r]`` elements from rank r."""
        self._c.all_gatherv(send, recv, counts, stream)

    def reduce_scatter(self, send, recv, op="sum", stream=None) -> None:
        """``recv = op(send[rank*count:(rank+1)*count] of every rank)``, count = recv.size."""
        self._c.reduce_scatter(send, recv, op, stream)

    def reduce_scatterv(self, send, recv, counts, op="sum", stream=None) -> None:
        """``recv`` = block ``rank`` (``counts[rank]`` elements) of ``op(send of every rank)``."""
        self._c.reduce_scatterv(send, recv, counts, op, stream)

    def all_to_all(self, send, recv, stream=None) -> None:
        """Chunk ``j`` of ``send`` goes to rank ``j``; chunk ``i`` of ``recv`` comes from rank
        ``i`` (chunks of ``send.size // size`` elements)."""
        self._c.all_to_all(send, recv, stream)

    def all_to_allv(self, send, send_counts, recv, recv_counts, stream=None) -> None:
        """``send_counts[j]`` elements of ``send`` to rank ``j``; ``recv_counts[i]`` from rank
        ``i``, back to back (MPI's ``Alltoallv``)."""
        self._c.all_to_allv(send, send_counts, recv, recv_counts, stream)

    def all_to_all_single(
        self, output, input, output_split_sizes=None, input_split_sizes=None, stream=None
    ) -> None:
        """torch's ``all_to_all_single``: split sizes count rows of dim 0, None splits evenly."""
        self._c.all_to_all_single(output, input, output_split_sizes, input_split_sizes, stream)

    def gather(self, send, recv, root: int, stream=None) -> None:
        """Every rank's ``send`` to rank ``root``'s ``recv``, block ``r`` from rank ``r``."""
        self._c.gather(send, recv, root, stream)

    def scatter(self, send, recv, root: int, stream=None) -> None:
        """Block ``r`` of rank ``root``'s ``send`` to rank ``r``'s ``recv``."""
        self._c.scatter(send, recv, root, stream)

    def barrier(self, stream=None) -> None:
        """Stream-ordered barrier: work queued after it on ``stream`` waits until every rank
        has reached it (``stream.synchronize()`` waits for that on the host)."""
        self._c.barrier(stream)

    def send(self, buf, peer: int, stream=None) -> None:
        """Send ``buf`` to rank ``peer`` (which calls ``recv`` with as many elements); a rank
        may send to itself."""
        self._c.send(buf, peer, stream)

    def recv(self, buf, peer: int, stream=None) -> None:
        """Receive into ``buf`` what rank ``peer`` sends."""
        self._c.recv(buf, peer, stream)

    def split(self, color: int | None, key: int | None = None) -> MPICommunicator | None:
        """``ncclCommSplit``: the ranks of one ``color`` (None: this rank joins none) form a
        new communicator ranked by ``key`` (default: the rank), then rank, grouped by process.
        Every rank calls it; it waits for them, except inside ``runtime.comm.group()``."""
        c = self._c.split(color, key)
        return None if c is None else MPICommunicator(c, None, self._timeout)

    def check_async_error(self) -> None:
        """Raise what made the communicator unusable (an abort, a failed operation), if any."""
        self._c.check_async_error()

    def abort(self) -> None:
        """Abort the communicator now (``ncclCommAbort``): every local rank waiting in it, and
        every operation still queued, fails with ``InvalidOperationError`` instead of waiting.
        Peer processes are not told; they give up at their own timeout."""
        self._c.abort()

    def destroy(self) -> None:
        """Release this rank (``ncclCommDestroy``): later calls on it raise. Operations already
        queued still run; the MPI communicators are freed once nothing uses them."""
        self._c.destroy()


def init_mpi(devices=None, mpi_comm=None, timeout: float | None = 300.0) -> list[MPICommunicator]:
    """Join the MPI job's communicator with this process's ``devices``; one communicator each.

    Every process of ``mpi_comm`` (default ``MPI.COMM_WORLD``) must call it. ``devices``: a
    list of devices (ints or ``runtime.Device``) this process drives, default the current
    device; processes may drive different numbers of devices. Global ranks number process 0's
    devices first, in the order given. ``timeout``: seconds any one operation (and this call)
    waits for its peers before it fails and aborts the communicator (None: wait forever).
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
        if isinstance(devices, (int, str, _rt.Device)):
            raise TypeError(f"devices must be a list of devices, e.g. [0, 1], got {devices!r}")
        devs = list(devices)
    if not MPI.Is_initialized() or MPI.Is_finalized():
        raise _rt.InvalidOperationError("MPI is not initialised (or already finalised)")
    level = MPI.Query_thread()
    if level < MPI.THREAD_SERIALIZED:
        raise _rt.InvalidOperationError(
            "MPI was initialised below MPI_THREAD_SERIALIZED; runtime's exchanges call MPI "
            "from worker threads (let mpi4py initialise MPI: mpi4py.rc.thread_level = "
            "'multiple', the default)"
        )
    if level < MPI.THREAD_MULTIPLE and _SERIAL_LOCK is None:
        _SERIAL_LOCK = threading.Lock()
    _MPI_MOD = MPI
    base = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
    if not isinstance(base, MPI.Intracomm):
        raise TypeError(f"mpi_comm must be an mpi4py intracommunicator, got {type(base)}")
    transport = _Transport(base)
    # No timeout: a deadline ~30 years away.
    limit = 1e9 if timeout is None else timeout
    comms = comm_connect(devs, base.Get_rank(), base.Get_size(), transport, limit)
    return [MPICommunicator(c, transport, timeout) for c in comms]
