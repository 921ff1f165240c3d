"""Helpers shared by the conformance modules (imported as ``_support``: the folder is on
sys.path under pytest's default import mode)."""

from __future__ import annotations

import threading

WAIT = 10.0  # seconds: a bound for every wait, so a regression fails instead of hanging
MiB = 1 << 20


def gate():
    """A host function that blocks its stream until ``release()`` is called.

    Stands in for CUDA's ``_sleep`` kernels: work queued behind it is provably not done yet,
    without any timing assumption. Returns ``(hold, release)``.
    """
    ev = threading.Event()

    def hold():
        ev.wait(WAIT)

    return hold, ev.set
