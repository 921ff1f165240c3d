"""The row model shared by every row module: ``Row``, ``Ctx`` and the small helpers.

``Row.impls`` maps a system to ``impl(ctx) -> sample function``; ``Ctx`` carries the config and
peers and runs the row's cleanups. ``_na`` builds an implementation that reports why a system has
no equivalent; ``_stream`` / ``_tq`` make a runtime stream / stdlib worker closed after the row.
"""

from __future__ import annotations

import sys

import runtime as rt

from ..config import Config, NotApplicable
from ..peers import Peers, ThreadQueueStream


class Row:
    """One benchmark row: ``impls[system](ctx) -> sample function``."""

    def __init__(
        self,
        key,
        title,
        impls,
        *,
        ascend910_us=None,
        nbytes=None,
        reps=None,
        note="",
        group=None,
        references=(),
        apart=(),
    ):
        """``group``: rows sharing one are measured together, their cells sampled in turn
        (they are compared with each other). ``references``: systems whose column is a
        measure of the host, not a peer doing the same work (left out of "best peer").
        ``apart``: systems sampled in a stretch of their own after the others, because
        their threads keep spinning after each call and would take the cores from the cell
        measured next (torch's OpenMP threads; no target compares with them)."""
        self.key = key
        self.references = frozenset(references)
        self.apart = frozenset(apart)
        self.title = title
        self.impls = impls
        self.ascend910_us = ascend910_us
        self.nbytes = nbytes
        self.reps = reps
        self.note = note
        self.group = group


class Ctx:
    """What the implementations need; cleanups run when the row is done."""

    def __init__(self, cfg: Config, peers: Peers):
        self.cfg = cfg
        self.peers = peers
        self._cleanups: list = []

    def defer(self, f):
        self._cleanups.append(f)

    def close(self):
        while self._cleanups:
            f = self._cleanups.pop()
            try:
                f()
            except Exception as e:  # cleanup must not hide the measurement
                print(f"bench: cleanup failed: {type(e).__name__}: {e}", file=sys.stderr)


def _na(reason):
    def impl(ctx):
        raise NotApplicable(reason)

    return impl


def _stream(ctx):
    s = rt.Stream()
    ctx.defer(s.destroy)
    return s


def _tq(ctx):
    w = ThreadQueueStream()
    ctx.defer(w.close)
    return w


def _nothing():
    pass


TORCH_NO_QUEUES = (
    "torch CPU ops run synchronously on the caller; torch.cpu.Stream/Event/synchronize are "
    "no-op placeholders for device-agnostic code"
)
TORCH_NO_EVENTS = (
    "torch.Event(device='cpu').record() raises 'cpu backend doesn't support events'; "
    "torch.cpu.Event.record is a no-op placeholder"
)
NO_STREAMS_NUMPY = "numpy has no streams or queues"
