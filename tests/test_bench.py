"""The benchmark's machinery (``runtime.bench``): cells warmed up outside the timing and
sampled in turn, the paired ratio and its confidence interval, and the verdicts built on them.

Timing itself is never asserted: the sample functions here are fakes that return chosen
numbers.
"""

from __future__ import annotations

import math
import statistics
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.bench import Config, Row
from runtime.bench.report import (
    FAR_NS,
    SIBLING_NS,
    add_group_ratios,
    check_targets,
    host_probe_summary,
    paired_ratio,
    quick_verdict,
    ratio_estimate,
    render_host_probes,
    verdict,
)
from runtime.bench.run import Progress, _groups, run_rows

NO_PEERS = SimpleNamespace(missing={}, torch=None)


def _binom_cdf(k: int, n: int) -> float:
    return sum(math.comb(n, i) for i in range(k + 1)) / 2**n


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0.01, 1e6), st.floats(0.01, 1e6)), min_size=0, max_size=60))
def test_paired_ratio_is_the_median_of_round_ratios_with_an_order_statistic_interval(pairs):
    num, den = [a for a, _ in pairs], [b for _, b in pairs]
    got = paired_ratio(num, den)
    if len(pairs) < 5:
        assert got is None
        return
    ratios = sorted(a / b for a, b in pairs)
    mid, lo, hi = got
    assert mid == pytest.approx(statistics.median(ratios))
    assert lo <= mid <= hi
    n = len(ratios)
    # k: the largest with P(Binomial(n, 1/2) <= k - 1) <= 2.5 %, at least 1
    k = max([1] + [j for j in range(1, n // 2 + 1) if _binom_cdf(j - 1, n) <= 0.025])
    assert (lo, hi) == (ratios[k - 1], ratios[n - k])


@pytest.mark.parametrize("n, k", [(5, 1), (15, 4), (20, 6)])
def test_paired_ratio_interval_ranks(n, k):
    num = [float(i + 1) for i in range(n)]
    mid, lo, hi = paired_ratio(num, [1.0] * n)
    assert (lo, hi) == (float(k), float(n - k + 1))


def test_ratio_estimate_quick_is_the_ratio_of_best_samples():
    assert ratio_estimate([5.0, 2.0, 9.0], [4.0, 8.0, 1.0], True) == (2.0, 2.0, 2.0)
    assert ratio_estimate([], [1.0], True) is None


@pytest.mark.parametrize(
    "ratio, goal, margin, lower, expected",
    [
        ((0.5, 0.45, 0.55), 1.0, 0.05, True, "PASS"),
        ((0.98, 0.9, 1.02), 1.0, 0.05, True, "NEAR"),  # the interval holds the goal
        ((0.96, 0.96, 0.96), 1.0, 0.05, True, "NEAR"),  # inside the margin
        ((1.5, 1.3, 1.7), 1.0, 0.05, True, "MISS"),
        ((0.55, 0.55, 0.55), 1.0, 1.0, True, "NEAR"),  # quick: within 2x
        ((0.45, 0.45, 0.45), 1.0, 1.0, True, "PASS"),
        ((12.0, 11.0, 13.0), 5.0, 0.05, False, "PASS"),
        ((3.0, 2.8, 3.2), 5.0, 0.05, False, "MISS"),
        ((3.0, 3.0, 3.0), 5.0, 1.0, False, "NEAR"),
    ],
)
def test_verdict(ratio, goal, margin, lower, expected):
    assert verdict(ratio, goal, margin, lower) == expected


class _Fake:
    """A sample function: the first ``warm`` calls (the warm-up) return a huge time."""

    def __init__(self, name, log, warm):
        self.name, self.log, self.calls, self.warm = name, log, 0, warm

    def __call__(self):
        self.calls += 1
        self.log.append(self.name)
        return 1e12 if self.calls <= self.warm else float(self.calls)


def _rows(log, fakes, warm=2):
    def impl(name):
        def make(ctx):
            fakes[name] = _Fake(name, log, warm)
            return fakes[name]

        return make

    return [
        Row("a", "row a", {"runtime": impl("a/rt"), "numpy": impl("a/np")}, reps=7, group="g"),
        Row("b", "row b", {"runtime": impl("b/rt")}, reps=7, group="g"),
        Row("c", "row c", {"runtime": impl("c/rt")}, reps=7),
    ]


def test_groups_are_consecutive_rows_sharing_a_group():
    rows = _rows([], {})
    assert [[r.key for r in g] for g in _groups(rows)] == [["a", "b"], ["c"]]


def test_cells_are_warmed_up_outside_the_samples_and_sampled_in_turn():
    cfg = Config(quick=True)
    log: list[str] = []
    fakes: dict = {}
    out = run_rows(
        _rows(log, fakes), ["runtime", "numpy"], cfg, NO_PEERS, Progress(0, enabled=False)
    )
    by = {r["key"]: r["results"] for r in out}
    for key, sysname in (("a", "runtime"), ("a", "numpy"), ("b", "runtime"), ("c", "runtime")):
        cell = by[key][sysname]
        assert cell["status"] == "ok" and cell["n"] == 7
        assert max(cell["samples_us"]) < 1e6, "a warm-up call was timed"
    # Warm-ups first (2 calls per cell, reps=7 rows: max(2, min(5, 7 // 3))), then rounds in
    # which each cell of the group gets an untimed call and a timed sample in turn.
    assert log[:6] == ["a/rt", "a/rt", "a/np", "a/np", "b/rt", "b/rt"]
    round_ = ["a/rt", "a/rt", "a/np", "a/np", "b/rt", "b/rt"]
    assert log[6 : 6 + 7 * 6] == round_ * 7
    assert log[6 + 7 * 6 :] == ["c/rt"] * (2 + 7)  # alone: no untimed call between samples


def test_each_group_keeps_the_host_probes_taken_while_it_was_sampled(monkeypatch):
    """The host's cross-core latency is probed before a group's first round, then every
    ``PROBE_EVERY_S`` and after its last, and each row of the group carries the probes of its
    stretch."""
    import runtime.bench.run as run_mod

    readings = iter([30.0, 35.0, 210.0, 220.0])
    monkeypatch.setattr(run_mod, "_probe_host", lambda: next(readings))
    out = run_rows(
        _rows([], {}),
        ["runtime", "numpy"],
        Config(quick=True),
        NO_PEERS,
        Progress(0, enabled=False),
    )
    by = {r["key"]: r["host_one_way_ns"] for r in out}
    assert out[0]["host_probe_group"] == out[1]["host_probe_group"] != out[2]["host_probe_group"]
    # Rows a and b are one group (one stretch: a probe before its first round and one after
    # its last, the rounds being quicker than PROBE_EVERY_S); c is sampled alone after them.
    assert by == {"a": [30.0, 35.0], "b": [30.0, 35.0], "c": [210.0, 220.0]}


def test_the_host_probe_measures_on_this_machine():
    import os

    from runtime import _runtime
    from runtime.bench.run import _probe_host

    # Given time (2 s), the probe measures on any host with two CPUs; the bench's own probe
    # (5 ms) may find a core held by another busy thread throughout, and then says so.
    ns = _runtime._cross_core_ns(1000, 2.0)
    quick = _probe_host()
    if (os.cpu_count() or 1) < 2:
        assert ns is None and quick is None
    else:
        assert ns is not None and 0 < ns < 1e9
        assert quick is None or 0 < quick < 1e9
    with pytest.raises(ValueError, match="limit_s must be between 0 and 10 seconds, got -1"):
        _runtime._cross_core_ns(10, -1.0)


def test_host_probes_fall_in_three_classes_and_name_the_rows_sampled_off_the_middle_one():
    rows = [
        {"key": "a", "host_one_way_ns": [30.0, 28.0], "host_probe_group": 0},
        # a's group: counted once
        {"key": "b", "host_one_way_ns": [30.0, 28.0], "host_probe_group": 0},
        {"key": "c", "host_one_way_ns": [25.0, FAR_NS + 110], "host_probe_group": 1},
        {"key": "d"},  # a row not run
        # the next group, with the same readings as another: counted too
        {"key": "e", "host_one_way_ns": [SIBLING_NS - 7, 31.0], "host_probe_group": 2},
        {"key": "f", "host_one_way_ns": [SIBLING_NS - 7, 31.0], "host_probe_group": 3},
    ]
    s = host_probe_summary(rows)
    assert s == {
        "siblings_below_ns": SIBLING_NS,
        "far_from_ns": FAR_NS,
        "siblings": 2,
        "siblings_ns": [SIBLING_NS - 7, SIBLING_NS - 7],
        "near": 5,
        "near_ns": [25.0, 31.0],
        "far": 1,
        "far_ns": [FAR_NS + 110, FAR_NS + 110],
        "sibling_rows": ["e", "f"],
        "far_rows": ["c"],
    }
    text = render_host_probes(s)
    assert "15-15 ns in 2, 25-31 ns in 5 and 210-210 ns in 1 of 8 probes" in text
    assert "two threads of one core" in text and "rows sampled then: e, f;" in text
    assert text.endswith("rows sampled then: c")
    near_only = host_probe_summary(rows[:2])
    assert near_only["far"] == 0 and near_only["siblings"] == 0
    assert "rows sampled then" not in render_host_probes(near_only)
    assert host_probe_summary([{"key": "a", "host_one_way_ns": []}]) is None
    assert "not measured" in render_host_probes(None)


def test_systems_set_apart_are_sampled_after_the_others():
    """A row's ``apart`` systems (threads that spin on after each call, such as torch's
    OpenMP pool) get a stretch of their own once the others' rounds are done."""
    log: list[str] = []
    fakes: dict = {}

    def impl(name):
        def make(ctx):
            fakes[name] = _Fake(name, log, 2)
            return fakes[name]

        return make

    row = Row(
        "k",
        "kernel row",
        {"runtime": impl("rt"), "numpy": impl("np"), "torch": impl("torch")},
        reps=7,
        apart=("torch",),
    )
    out = run_rows(
        [row],
        ["runtime", "numpy", "torch"],
        Config(quick=True),
        NO_PEERS,
        Progress(0, enabled=False),
    )
    assert all(out[0]["results"][s]["n"] == 7 for s in ("runtime", "numpy", "torch"))
    timed = log[6:]  # after the warm-ups (2 per cell)
    together, alone = timed[: 7 * 4], timed[7 * 4 :]
    assert together == ["rt", "rt", "np", "np"] * 7
    assert alone == ["torch"] * 7  # alone: no untimed call between its samples


def test_a_failing_cell_is_an_error_and_its_group_goes_on():
    cfg = Config(quick=True)

    def bad(ctx):
        state = {"n": 0}

        def fn():
            state["n"] += 1
            if state["n"] > 6:
                raise RuntimeError("boom")
            return 1.0

        return fn

    rows = [
        Row("x", "row x", {"runtime": bad}, reps=9, group="g"),
        Row("y", "row y", {"runtime": lambda ctx: lambda: 2.0}, reps=9, group="g"),
    ]
    out = {
        r["key"]: r["results"]["runtime"]
        for r in run_rows(rows, ["runtime"], cfg, NO_PEERS, Progress(0, enabled=False))
    }
    assert out["x"]["status"] == "error" and "boom" in out["x"]["reason"]
    assert out["y"]["status"] == "ok" and out["y"]["n"] == 9


def _result_rows(samples: dict[tuple[str, str], list[float]]) -> list[dict]:
    rows: dict[str, dict] = {}
    for (key, sysname), vals in samples.items():
        row = rows.setdefault(key, {"key": key, "title": key, "results": {}})
        row["results"][sysname] = {
            "status": "ok",
            "median_us": statistics.median(vals),
            "p90_us": max(vals),
            "samples_us": vals,
        }
    out = list(rows.values())
    add_group_ratios(out)
    return out


def test_quick_run_leaves_the_placement_sensitive_launch_targets_to_the_full_run():
    rows = _result_rows(
        {
            ("launch_amortised", "runtime"): [0.1] * 15,
            ("launch_amortised", "pyopencl"): [1.0] * 15,
            ("alloc_1m", "runtime"): [1.0] * 15,
            ("alloc_1m", "numpy"): [50.0] * 15,
        }
    )
    quick = {t["target"]: t for t in check_targets(rows, Config(quick=True), NO_PEERS)}
    full = {t["target"]: t for t in check_targets(rows, Config(quick=False), NO_PEERS)}
    name = "native no-op launch, amortised <= 0.2x PyOpenCL enqueue"
    assert quick[name]["status"] == "SKIP" and "full run" in quick[name]["detail"]
    assert full[name]["status"] == "PASS"
    alloc = "alloc 1 MiB zeroed <= 0.5x numpy np.zeros"
    assert full[alloc]["status"] == "PASS"
    assert quick[alloc]["status"] == "NEAR" and "full run judges it" in quick[alloc]["detail"]


@pytest.mark.parametrize(
    "ratio, goal, lower, expected",
    [
        (0.02, 0.5, True, "NEAR"),  # far better than the goal: still only the full run passes it
        (1.5, 0.5, True, "NEAR"),  # 3x the goal: the edge of what a quick run calls
        (1.51, 0.5, True, "MISS"),
        (50.0, 5.0, False, "NEAR"),
        (1.7, 5.0, False, "NEAR"),
        (1.6, 5.0, False, "MISS"),
    ],
)
def test_quick_verdict_calls_only_a_miss_by_more_than_3x(ratio, goal, lower, expected):
    assert quick_verdict(ratio, goal, lower) == expected


def test_quick_run_calls_a_gross_miss():
    rows = _result_rows({("alloc_1m", "runtime"): [40.0] * 15, ("alloc_1m", "numpy"): [10.0] * 15})
    quick = {t["target"]: t for t in check_targets(rows, Config(quick=True), NO_PEERS)}
    assert quick["alloc 1 MiB zeroed <= 0.5x numpy np.zeros"]["status"] == "MISS"


def test_scaling_target_is_judged_against_the_hosts_own_scaling():
    # The host gives two threads only 1.0x (a busy core): the runtime's 1.0x is all it can get.
    busy = _result_rows(
        {
            ("matmul_streams_1", "runtime"): [10.0] * 15,
            ("matmul_streams_2", "runtime"): [10.0] * 15,
            ("matmul_streams_1", "stdlib"): [4.0] * 15,
            ("matmul_streams_2", "stdlib"): [4.0] * 15,
        }
    )
    name = next(
        t for t in check_targets(busy, Config(quick=False), NO_PEERS) if "2 streams" in t["target"]
    )
    assert name["status"] == "PASS", name
    # Two idle cores: the host scales 2x, the runtime not at all.
    idle = _result_rows(
        {
            ("matmul_streams_1", "runtime"): [10.0] * 15,
            ("matmul_streams_2", "runtime"): [10.0] * 15,
            ("matmul_streams_1", "stdlib"): [4.0] * 15,
            ("matmul_streams_2", "stdlib"): [2.0] * 15,
        }
    )
    name = next(
        t for t in check_targets(idle, Config(quick=False), NO_PEERS) if "2 streams" in t["target"]
    )
    assert name["status"] == "MISS", name
