"""Batching of small commands (``set_option("enableBatching", ...)``, on by default) changes
nothing observable: 4 threads x 5,000 launches with events interleaved (records, waits on
another thread's stream, event synchronizes, queries) give identical, exact results with
batching on and off."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import runtime
from runtime import kernels

WAIT = 60.0
THREADS = 4
LAUNCHES = 5_000


@pytest.fixture(scope="module", autouse=True)
def _runtime():
    runtime.init(device_count=2, memory="512MiB")
    yield
    runtime.set_option("enableBatching", True)
    runtime.shutdown()


def test_batching_is_on_by_default_and_an_option():
    assert "enableBatching" in runtime.option_names()
    assert runtime.get_option("enableBatching") is True


def run(batching: bool) -> dict:
    runtime.set_option("enableBatching", batching)
    streams = [runtime.Stream(t % 2) for t in range(THREADS)]
    counters = [runtime.zeros(1, "int64", device=t % 2) for t in range(THREADS)]
    ones = [runtime.to_device(np.ones(1, np.int64), device=t % 2) for t in range(THREADS)]
    # Snapshots of the counter of the thread two along (same device), taken after waiting on its event; each slot
    # must hold at least the count the event was recorded at.
    snaps = [runtime.zeros(LAUNCHES // 25, "int64", device=t % 2) for t in range(THREADS)]
    latest: list = [None] * THREADS  # (event, count at record)
    lock = threading.Lock()
    violations: list[str] = []
    expected_snaps: list[list[int]] = [[0] * (LAUNCHES // 25) for _ in range(THREADS)]
    # Each thread's first snapshot waits until the thread it watches has recorded an event,
    # so every thread waits across streams at least once however the threads are scheduled
    # (a thread could otherwise run all its launches within one GIL slice, before the other
    # recorded anything).
    recorded = [threading.Event() for _ in range(THREADS)]

    def work(t: int) -> None:
        s, c, one, other = streams[t], counters[t], ones[t], (t + 2) % THREADS
        for i in range(LAUNCHES):
            kernels.add(c, c, one, stream=s)
            if i % 10 == 9:
                ev = runtime.Event()
                ev.record(s)
                with lock:
                    latest[t] = (ev, i + 1)
                recorded[t].set()
            if i == 24:
                assert recorded[other].wait(WAIT)
            if i % 25 == 24:
                with lock:
                    got = latest[other]
                if got is not None:
                    ev, at = got
                    s.wait_event(ev)
                    kernels.copy(snaps[t][i // 25 : i // 25 + 1], counters[other], stream=s)
                    expected_snaps[t][i // 25] = at
            if i % 50 == 49:
                ev, at = latest[t]
                ev.synchronize()
                seen = int(np.asarray(c)[0])
                if seen < at:
                    with lock:
                        violations.append(f"thread {t}: event at {at}, counter {seen}")
            if i % 37 == 0 and s.query():
                seen = int(np.asarray(c)[0])
                if seen != i + 1:
                    with lock:
                        violations.append(f"thread {t}: query true at {seen} of {i + 1}")
        s.synchronize(timeout=WAIT)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for t in range(THREADS):
        got = np.asarray(snaps[t]).tolist()
        for j, (g, want) in enumerate(zip(got, expected_snaps[t])):
            if g < want:
                violations.append(f"thread {t} snapshot {j}: {g} < recorded {want}")
    result = {
        "counters": [int(np.asarray(c)[0]) for c in counters],
        "violations": violations,
        "snapshots_taken": [sum(1 for w in e if w) for e in expected_snaps],
    }
    for s in streams:
        s.destroy()
    return result


def test_four_threads_of_launches_and_events_give_identical_results_batched_or_not():
    on = run(True)
    off = run(False)
    runtime.set_option("enableBatching", True)
    for name, r in (("on", on), ("off", off)):
        assert r["violations"] == [], f"batching {name}: {r['violations'][:5]}"
        assert r["counters"] == [LAUNCHES] * THREADS, f"batching {name}"
        assert all(n > 0 for n in r["snapshots_taken"]), "cross-stream waits happened"
    assert on["counters"] == off["counters"]
    assert on["violations"] == off["violations"] == []


def test_a_lone_launch_runs_promptly_with_batching_on():
    """A command never waits in a batch while the device is idle: no later call is needed."""
    runtime.set_option("enableBatching", True)
    s = runtime.Stream()
    x = runtime.zeros(1, "float32")
    kernels.fill(x, 7.0, stream=s)
    ev = runtime.Event()
    ev.record(s)
    ev.synchronize(timeout=WAIT)  # completes with nothing else submitted
    assert np.asarray(x)[0] == 7.0
    s.destroy()
