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
or for those two, ``send`` may be block ``rank`` of the larger buffer.

Across processes and machines, ``init_mpi(devices=None, mpi_comm=None)`` (from ``_mpi``, over
mpi4py) makes communicators with the same methods whose ranks are (MPI process x device); they
run the same core protocol, MPI only moving the bytes between processes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

from ._mpi import MPICommunicator, init_mpi
from ._runtime import Communicator, Device, comm_group_end, comm_group_start, comm_init_all

__all__ = ["Communicator", "MPICommunicator", "group", "init_all", "init_mpi"]


def init_all(devices: Iterable[Device | int], timeout: float = 300.0) -> list[Communicator]:
    """One communicator per device, rank ``i`` on ``devices[i]`` (``ncclCommInitAll``).

    ``timeout`` is how many seconds a collective waits for the other ranks before it fails
    with :class:`runtime.WaitTimeoutError`.
    """
    return comm_init_all(list(devices), timeout)


@contextlib.contextmanager
def group() -> Iterator[None]:
    """Batch calls, as ``ncclGroupStart``/``ncclGroupEnd``.

    Calls in a group never block: each one only queues work on its rank's stream, and inside
    a group not even a stream's full backlog (1,024 queued commands) makes the call wait, so
    one thread may queue any number of collectives for one rank before the other ranks'. The
    end of the outermost group waits (interruptibly) for room on the streams the group filled,
    once every rank's calls are queued. Groups nest and belong to the calling thread.
    """
    comm_group_start()
    try:
        yield
    except BaseException:
        comm_group_end(False)  # the other ranks' calls may never come: do not wait for room
        raise
    comm_group_end(True)
