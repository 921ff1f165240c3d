"""Every benchmark row, in the order the table shows them; one module per area.

``streams`` (stream create, event record, idle synchronize), ``memory`` (alloc / free, copies),
``executor`` (launches, graph replay), ``operators`` (the built-in kernels beside numpy and
torch, a numba kernel in blocks, launches with batching off), ``pool`` (allocation through the built-in pool and
plugged Python allocators) and ``pipeline`` (the copy -> compute -> copy pipeline,
multi-stream scaling). ``base`` holds the ``Row`` / ``Ctx`` model they share.
"""

from __future__ import annotations

from ..config import Config
from .base import (
    NO_STREAMS_NUMPY,
    TORCH_NO_EVENTS,
    TORCH_NO_QUEUES,
    Ctx,
    Row,
)
from .executor import graph_rows, launch_rows
from .memory import alloc_rows, async_copy_rows, copy_rows
from .operators import batching_rows, kernel_rows, numba_rows
from .pipeline import pipeline_rows, scaling_rows
from .pool import pool_rows
from .streams import stream_event_rows, sync_idle_rows

__all__ = [
    "NO_STREAMS_NUMPY",
    "TORCH_NO_EVENTS",
    "TORCH_NO_QUEUES",
    "Ctx",
    "Row",
    "rows_for",
]


def rows_for(cfg: Config) -> list[Row]:
    """All rows for ``cfg``: the Ascend 910 reference table first, then the executor rows."""
    return [
        *stream_event_rows(cfg),
        *alloc_rows(cfg),
        *copy_rows(cfg),
        *async_copy_rows(cfg),
        *sync_idle_rows(cfg),
        *launch_rows(cfg),
        *batching_rows(cfg),
        *graph_rows(cfg),
        *pipeline_rows(cfg),
        *scaling_rows(cfg),
        *pool_rows(cfg),
        *kernel_rows(cfg),
        *numba_rows(cfg),
    ]
