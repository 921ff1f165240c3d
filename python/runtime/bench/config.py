"""What the benchmark compares and how hard: the systems, the Ascend 910 reference figures, ``Config``.

Owns the constants every other module shares (``SYSTEMS``, ``PEERS``, ``MiB``, ``ASCEND910_US``), the
``NotApplicable`` signal a row raises for a system with no equivalent, and the sizes and
repetition counts of a run.
"""

from __future__ import annotations

SYSTEMS = ("runtime", "numpy", "pyopencl", "torch", "stdlib")
PEERS = SYSTEMS[1:]

MiB = 1 << 20

# The Ascend 910 reference figures (measured on an Ascend 910), in microseconds. memcpy: 500 us per MiB.
ASCEND910_US = {
    "stream create": 10.0,
    "event record": 1.0,
    "alloc 1 MiB": 100.0,
    "memcpy per MiB": 500.0,
    "sync idle": 1.0,
}


class NotApplicable(Exception):
    """The system has no equivalent of this row (the reason is shown)."""


class Config:
    """Sizes and repetition counts; ``quick`` shrinks everything for a smoke run."""

    def __init__(self, quick: bool, reps: int | None = None):
        self.quick = quick
        # Quick mode keeps the sample counts that the printed ratios need (their confidence
        # intervals come from order statistics: 15 pairs give a ~96 % interval between the 4th
        # and the 12th) and shrinks the work per sample instead.
        self.reps = reps or (20 if quick else 300)  # latency rows
        self.warmup = 5 if quick else 30
        self.budget_s = 0.15 if quick else 2.0  # per latency cell, after the minimum reps
        self.min_reps = 15 if quick else 5
        self.batch = 8  # ops per sample in latency rows
        self.big = (16 if quick else 64) * MiB  # the "large copy" size
        self.big_reps = 30 if quick else 40
        self.n_launch = 1000 if quick else 10_000  # native no-op launches per sample
        self.n_pylaunch = 250 if quick else 2000  # Python-callable launches per sample
        # Samples of the N-launch rows. A full run's verdict on them comes from the interval
        # between order statistics of the per-round ratios: with 10 samples it ran from the
        # 2nd to the 9th, and an amortised launch at 0.08-0.09x PyOpenCL's read NEAR against
        # a 0.1x goal in four runs of five; with 30 it runs from the 10th to the 21st.
        self.loop_reps = 15 if quick else 30
        self.graph_nodes = 100
        self.graph_replays = 10 if quick else 100  # replays per amortised sample
        self.pipe_chunks = 8
        self.pipe_chunk = (1 if quick else 4) * MiB
        self.pipe_reps = 15 if quick else 20
        self.mm_n = 128 if quick else 256
        self.mm_per_stream = 16 if quick else 32
        self.mm_streams = 4
        self.mm_reps = 15 if quick else 21
