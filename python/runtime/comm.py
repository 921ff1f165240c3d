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
mpi4py) makes communicators with the same methods whose ranks are (MPI process x device).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

from ._mpi import MPICommunicator, init_mpi
from ._runtime import Communicator, Device, comm_init_all

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

    Calls never block here (each one only queues work on its rank's stream, and sends never
    wait for their receive), so a group needs no special handling: it exists so that code
    written for NCCL's grouping runs unchanged.
    """
    yield
