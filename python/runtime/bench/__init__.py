"""The benchmark suite: ``python -m runtime bench``.

Measures the Ascend 910 reference table (stream create, event record, allocate 1 MB zeroed,
memcpy, synchronize an idle stream) and the executor rows (launch, Python-callable launch,
graph replay, a copy -> compute -> copy pipeline, multi-stream scaling) for ``runtime`` and,
side by side in the same process, for the peers that are installed:

* ``numpy``: ``np.zeros``, ``del``, ``np.copyto``, BLAS matmul;
* ``pyopencl``: PyOpenCL on PoCL's CPU device (queues, markers, buffers, a no-op kernel);
* ``torch``: torch on the CPU (``torch.zeros``, ``copy_``; torch's CPU streams and events are
  no-op placeholders, so those cells say n/a);
* ``stdlib``: ``bytearray`` / ``memoryview`` and a thread + ``queue.Queue`` executor written
  here (stream = worker thread, event record = a marker that sets a ``threading.Event``,
  launch = put a callable, synchronize = ``Queue.join``).

A missing peer is reported as missing, with its import error; nothing is ever estimated.
Every figure is the time of one operation in microseconds (lower is better): median and p90
over many repetitions after a warm-up, with the garbage collector disabled while timing and
``time.perf_counter_ns`` as the clock. Ratios are runtime / other, so < 1 means runtime is
faster. The speed targets (goals stated in BENCHMARKS.md) are checked and printed as PASS / MISS lines (reported, never
asserted).

The package, by concern (each module imports only modules listed before it):

* ``config``: systems, peers, the Ascend 910 reference figures, ``Config``, ``NotApplicable``;
* ``timing``: median / p90, the timer floor, the ``timed_*`` sample makers;
* ``peers``: ``Peers`` (optional imports), ``ThreadQueueStream``, ``machine_info``;
* ``rows``: the ``Row`` model and the rows, one module per area;
* ``report``: row summaries, targets, the text and markdown tables;
* ``run``: ``run_cell``, ``run_rows``, ``Progress``, ``settle``;
* ``plot``: the PNG chart (matplotlib optional);
* ``cli``: the flags and ``main``.
"""

from __future__ import annotations

from .cli import _parser, main
from .config import ASCEND910_US, PEERS, SYSTEMS, Config, MiB, NotApplicable
from .peers import Peers, ThreadQueueStream, machine_info
from .plot import write_plot
from .report import (
    add_group_ratios,
    check_targets,
    fmt_us,
    render_markdown,
    render_table,
    render_targets,
    summarise_row,
)
from .rows import (
    NO_STREAMS_NUMPY,
    TORCH_NO_EVENTS,
    TORCH_NO_QUEUES,
    Ctx,
    Row,
    rows_for,
)
from .run import Progress, run_cell, run_rows, settle
from .timing import (
    timed_amortised,
    timed_calls,
    timed_create,
    timed_destroy,
    timer_floor_ns,
)

__all__ = [
    "NO_STREAMS_NUMPY",
    "PEERS",
    "ASCEND910_US",
    "SYSTEMS",
    "TORCH_NO_EVENTS",
    "TORCH_NO_QUEUES",
    "Config",
    "Ctx",
    "MiB",
    "NotApplicable",
    "Peers",
    "Progress",
    "Row",
    "ThreadQueueStream",
    "_parser",
    "add_group_ratios",
    "check_targets",
    "fmt_us",
    "machine_info",
    "main",
    "render_markdown",
    "render_table",
    "render_targets",
    "rows_for",
    "run_cell",
    "run_rows",
    "settle",
    "summarise_row",
    "timed_amortised",
    "timed_calls",
    "timed_create",
    "timed_destroy",
    "timer_floor_ns",
    "write_plot",
]
