"""Collectives between the devices of this process, in the mould of NCCL.

``init_all(devices)`` makes one :class:`Communicator` per device (rank ``i`` on
``devices[i]``, as ``ncclCommInitAll``). Every collective is queued on a stream of its rank's
device (the device's current stream when ``stream`` is None) and returns at once; it completes
on every rank once all ranks' streams have reached it, so one thread may issue all ranks'
calls in turn. Collectives of a communicator are matched by issue order; the ranks must agree
on the collective, dtype, count, operator and root, or it fails on every rank with
``ValueError``. A rank that does not join within the communicator's ``timeout`` fails the
others with :class:`runtime.WaitTimeoutError`; ``abort()`` releases every pending collective
with :class:`runtime.InvalidOperationError`. Errors are raised by the stream's
``synchronize``, like a kernel's.

Counts follow NCCL: ``all_gather`` receives ``size`` times the send count, ``reduce_scatter``
sends ``size`` times the receive count; ``send`` and ``recv`` may be the same buffer (in place),
or for those two, ``send`` may be block ``rank`` of the larger buffer. ``gather``/``scatter``
move one block per rank to or from a root; ``all_gatherv``, ``reduce_scatterv`` and
``all_to_allv`` (and torch's ``all_to_all_single`` with split sizes) take a count per rank;
``all_reduce_coalesced`` reduces a list of buffers in one collective; ``broadcast(buf, root,
recv=out)`` is out of place. Operators: ``sum``, ``prod``, ``max``, ``min``, ``avg``,
``band``, ``bor``, ``bxor`` (integers and bool) and :func:`premul_sum`.

``c.split(color, key)`` makes new communicators from an existing one (``ncclCommSplit``);
``Communicator(nranks, get_unique_id(), rank)`` builds one rank by rank, for ranks on
different threads (``ncclCommInitRank``). Both wait for the other ranks, except inside
:func:`group`, whose end waits (so one thread may make every rank's). ``check_async_error()``
raises what made a communicator unusable (an abort, a failure across processes).

Across processes and machines, ``init_mpi(devices=None, mpi_comm=None)`` (from ``_mpi``, over
mpi4py) makes communicators with the same methods whose ranks are (MPI process x device); they
run the same core protocol, MPI only moving the bytes between processes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

from ._mpi import MPICommunicator, init_mpi
from ._runtime import (
    Communicator,
    Device,
    comm_get_unique_id,
    comm_group_end,
    comm_group_start,
    comm_init_all,
)

__all__ = [
    "Communicator",
    "MPICommunicator",
    "get_unique_id",
    "group",
    "init_all",
    "init_mpi",
    "premul_sum",
]


def init_all(devices: Iterable[Device | int | str], timeout: float = 300.0) -> list[Communicator]:
    """One communicator per device, rank ``i`` on ``devices[i]`` (``ncclCommInitAll``).

    ``timeout`` is how many seconds a collective waits for the other ranks before it fails
    with :class:`runtime.WaitTimeoutError`.
    """
    if isinstance(devices, str):
        # A str is iterable, but its characters are no devices.
        raise TypeError(
            f"devices must be a list of devices, e.g. ['npu:0', 'npu:1'], got {devices!r}"
        )
    return comm_init_all(list(devices), timeout)


def get_unique_id() -> bytes:
    """A new id (128 bytes) for ``Communicator(nranks, comm_id, rank)``: ``ncclGetUniqueId``.

    Every rank of the new communicator joins with the same id, from any thread of this
    process. (Ranks in other processes join with :func:`init_mpi`.)
    """
    return comm_get_unique_id()


def premul_sum(factor: float) -> tuple[str, float]:
    """The ``premul_sum`` operator with this rank's ``factor`` (NCCL's
    ``ncclRedOpCreatePreMulSum``, torch's ``_make_nccl_premul_sum``): each rank's input is
    multiplied by its own factor, then summed. Pass it as ``op=``."""
    if isinstance(factor, bool) or not isinstance(factor, (int, float)):
        raise TypeError(f"factor must be a real number, got {type(factor).__name__}")
    return ("premul_sum", float(factor))


@contextlib.contextmanager
def group() -> Iterator[None]:
    """Batch calls, as ``ncclGroupStart``/``ncclGroupEnd``.

    Calls in a group never block: each one only queues work on its rank's stream, and inside
    a group not even a stream's full backlog (1,024 queued commands) makes the call wait, so
    one thread may queue any number of collectives for one rank before the other ranks'. The
    end of the outermost group waits (interruptibly) for room on the streams the group filled,
    once every rank's calls are queued. Communicators made inside a group (``split``,
    ``Communicator(nranks, comm_id, rank)``) are made at its end, or at their first use.
    Groups nest and belong to the calling thread.
    """
    comm_group_start()
    try:
        yield
    except BaseException:
        comm_group_end(False)  # the other ranks' calls may never come: do not wait for room
        raise
    comm_group_end(True)
