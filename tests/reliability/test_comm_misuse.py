"""Misuse battery for collectives (issue 22): what a program does wrong, or does at the wrong
moment, with communicators of this process, beyond bad arguments (``test_bad_inputs.py``
covers those). Three families, each checked for the right values or a clear error within the
communicator's timeout, never a hang:

* mixed graph replays and direct collectives, with the ranks at different speeds;
* long groups: more calls per rank than a stream's backlog, nested groups, a group left by an
  exception, point-to-point in groups;
* dead ranks: a rank that never calls, one whose stream holds an error (it skips the
  collective), one destroyed with work queued, abort from another thread, shutdown with a
  collective pending.

Across processes the same families run under ``mpiexec`` (``test_comm_mpi.py``,
``mpi_collectives.py misuse``). The last test prints the number of checks (``pytest -s``)
for RELIABILITY.md.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import runtime
from runtime import comm

WAIT = 60.0
CHECKS = {"mixed graph/direct": 0, "long groups": 0, "dead ranks": 0}


@pytest.fixture(scope="module", autouse=True)
def _runtime():
    runtime.shutdown()
    runtime.init(device_count=4, memory="128MiB")
    yield
    runtime.shutdown()


def checked(family: str) -> None:
    CHECKS[family] += 1


def ones(c, n=2, dtype="int64"):
    return runtime.to_device(np.ones(n, dtype), device=c.device)


def capture(c, buf, stream, calls=1):
    stream.begin_capture()
    for _ in range(calls):
        c.all_reduce(buf, buf, stream=stream)
    return stream.end_capture()


# --- mixed graph replays and direct collectives --------------------------------------------


@pytest.mark.parametrize(
    "program",
    [
        "direct replay direct",
        "replay direct replay",
        "replay replay direct",
        "direct replay2 direct",
        "replay2 replay2",
    ],
)
@pytest.mark.parametrize("held", [0, 1])
def test_replays_and_direct_collectives_at_different_speeds(program, held):
    """Every rank runs ``program`` (``replay2``: a graph holding two collectives); rank
    ``held``'s stream is held back until the other rank issued everything, so the ranks reach
    each collective at different times. Values are all_reduce sums of ones: 2**k after k."""
    cs = comm.init_all([0, 1], timeout=20.0)
    bufs = [ones(c) for c in cs]
    streams = [runtime.Stream(c.device) for c in cs]
    g1 = [capture(c, b, s) for c, b, s in zip(cs, bufs, streams)]
    g2 = [capture(c, b, s, calls=2) for c, b, s in zip(cs, bufs, streams)]
    gate = runtime.Event.user()
    streams[held].wait_event(gate)
    steps = program.split()
    total = sum(2 if s == "replay2" else 1 for s in steps)
    for r in (1 - held, held):
        for step in steps:
            if step == "direct":
                cs[r].all_reduce(bufs[r], bufs[r], stream=streams[r])
            else:
                (g2 if step == "replay2" else g1)[r].launch(streams[r])
        if r == held:
            gate.set()
    for s in streams:
        s.synchronize(timeout=WAIT)
    for b in bufs:
        np.testing.assert_array_equal(b.copy_to_host(), np.full(2, 2**total))
    checked("mixed graph/direct")


def test_direct_collective_on_another_stream_while_capturing():
    """While rank r captures on one stream it issues a direct collective on another: the
    direct one is numbered at issue, the captured one at each launch, the same on every rank."""
    cs = comm.init_all([0, 1], timeout=20.0)
    a = [ones(c) for c in cs]
    b = [ones(c) for c in cs]
    cap = [runtime.Stream(c.device) for c in cs]
    other = [runtime.Stream(c.device) for c in cs]
    graphs = []
    for r, c in enumerate(cs):
        cap[r].begin_capture()
        c.all_reduce(a[r], a[r], stream=cap[r])
        c.all_reduce(b[r], b[r], stream=other[r])
        graphs.append(cap[r].end_capture())
    for r in range(2):
        graphs[r].launch(cap[r])
    for s in cap + other:
        s.synchronize(timeout=WAIT)
    for r in range(2):
        np.testing.assert_array_equal(a[r].copy_to_host(), np.full(2, 2))
        np.testing.assert_array_equal(b[r].copy_to_host(), np.full(2, 2))
    checked("mixed graph/direct")


def test_a_replay_on_one_rank_only_fails_within_the_timeout():
    """Rank 0 replays a graph with a collective that rank 1 never launches, then both issue a
    direct one: rank 0's replay meets rank 1's direct call (different buffers sizes: an
    argument error on both), or times out; either way an error, never a hang."""
    cs = comm.init_all([0, 1], timeout=1.0)
    small = [ones(c, 2) for c in cs]
    big = [ones(c, 5) for c in cs]
    s0 = runtime.Stream(0)
    g = capture(cs[0], small[0], s0)
    g.launch(s0)
    cs[0].all_reduce(big[0], big[0], stream=s0)
    cs[1].all_reduce(big[1], big[1])
    with pytest.raises((ValueError, runtime.WaitTimeoutError)):
        s0.synchronize(timeout=WAIT)
    with pytest.raises((ValueError, runtime.WaitTimeoutError)):
        runtime.current_stream(1).synchronize(timeout=WAIT)
    checked("mixed graph/direct")


# --- long groups ----------------------------------------------------------------------------


@pytest.mark.parametrize("calls", [1025, 3000])
def test_group_with_more_collectives_than_a_stream_holds(calls):
    cs = comm.init_all([0, 1, 2], timeout=30.0)
    bufs = [ones(c, 1) for c in cs]
    with comm.group():
        for c, b in zip(cs, bufs):
            for _ in range(calls):
                c.all_reduce(b, b, op="min")
    for c in cs:
        runtime.current_stream(c.device).synchronize(timeout=WAIT)
    for b in bufs:
        np.testing.assert_array_equal(b.copy_to_host(), np.ones(1))
    checked("long groups")


def test_group_of_point_to_point_longer_than_a_stream_holds():
    """1,100 sends from rank 0 then 1,100 receives on rank 1, on one stream each."""
    cs = comm.init_all([0, 1], timeout=30.0)
    src = runtime.to_device(np.arange(4, dtype="float32"), device=0)
    dsts = [runtime.empty(4, "float32", 1) for _ in range(1100)]
    with comm.group():
        for _ in dsts:
            cs[0].send(src, 1)
        for d in dsts:
            cs[1].recv(d, 0)
    runtime.synchronize()
    for d in (dsts[0], dsts[-1]):
        np.testing.assert_array_equal(d.copy_to_host(), np.arange(4))
    checked("long groups")


def test_nested_groups_wait_only_at_the_outermost_end():
    cs = comm.init_all([0, 1], timeout=30.0)
    bufs = [ones(c, 1) for c in cs]
    with comm.group():
        with comm.group():
            for _ in range(1100):
                cs[0].all_reduce(bufs[0], bufs[0], op="max")
        # the inner end did not wait for room: rank 1's calls come after it
        for _ in range(1100):
            cs[1].all_reduce(bufs[1], bufs[1], op="max")
    runtime.synchronize()
    for b in bufs:
        np.testing.assert_array_equal(b.copy_to_host(), np.ones(1))
    checked("long groups")


def test_a_group_left_by_an_exception_does_not_wait():
    """An exception inside a group after one rank's 1,100 calls: the group's end must not wait
    for room (the other rank's calls never come); abort then releases the queued work."""
    cs = comm.init_all([0, 1], timeout=600.0)
    b = ones(cs[0], 1)
    with pytest.raises(RuntimeError, match="stop"):
        with comm.group():
            for _ in range(1100):
                cs[0].all_reduce(b, b)
            raise RuntimeError("stop")
    cs[0].abort()
    with pytest.raises(runtime.InvalidOperationError, match="aborted"):
        runtime.current_stream(0).synchronize(timeout=WAIT)
    checked("long groups")


def test_group_end_without_a_start_is_an_error():
    with pytest.raises(RuntimeError, match="without a matching"):
        runtime._runtime.comm_group_end()
    checked("long groups")


# --- dead ranks -----------------------------------------------------------------------------


def test_a_rank_that_never_calls_times_out_the_others_and_is_named():
    cs = comm.init_all([0, 1, 2], timeout=0.3)
    bufs = [ones(c) for c in cs]
    for c, b in zip(cs[:2], bufs):
        c.all_reduce(b, b)
    for c in cs[:2]:
        with pytest.raises(runtime.WaitTimeoutError, match=r"waiting for ranks \[2\]"):
            runtime.current_stream(c.device).synchronize(timeout=WAIT)
    checked("dead ranks")


def test_a_rank_whose_stream_failed_skips_the_collective_and_the_others_time_out():
    """Rank 1's stream holds a kernel error: it skips its collective (as every op until the
    error is reported), so rank 0 times out; once rank 1 reports its error the communicator
    works again for the next collective."""
    cs = comm.init_all([0, 1], timeout=0.5)
    bufs = [ones(c) for c in cs]
    s1 = runtime.current_stream(1)

    def boom():
        raise ValueError("kernel failure")

    s1.launch_host_func(boom)
    for c, b in zip(cs, bufs):
        c.all_reduce(b, b)
    with pytest.raises(runtime.WaitTimeoutError):
        runtime.current_stream(0).synchronize(timeout=WAIT)
    with pytest.raises(runtime.KernelError):
        s1.synchronize(timeout=WAIT)
    for c, b in zip(cs, bufs):
        c.all_reduce(b, b)
    runtime.synchronize()
    for b in bufs:
        np.testing.assert_array_equal(b.copy_to_host(), np.full(2, 2))
    checked("dead ranks")


def test_a_rank_destroyed_with_work_queued_still_runs_it():
    cs = comm.init_all([0, 1], timeout=20.0)
    bufs = [ones(c) for c in cs]
    gate = runtime.Event.user()
    runtime.current_stream(1).wait_event(gate)
    for c, b in zip(cs, bufs):
        c.all_reduce(b, b)
    cs[1].destroy()
    with pytest.raises(runtime.InvalidHandleError):
        cs[1].barrier()
    gate.set()
    runtime.synchronize()
    for b in bufs:
        np.testing.assert_array_equal(b.copy_to_host(), np.full(2, 2))
    checked("dead ranks")


def test_abort_from_another_thread_releases_a_waiting_rank():
    cs = comm.init_all([0, 1], timeout=600.0)
    b = ones(cs[0])
    cs[0].all_reduce(b, b)
    t = threading.Thread(target=lambda: (time.sleep(0.1), cs[1].abort()))
    t.start()
    with pytest.raises(runtime.InvalidOperationError, match="aborted"):
        runtime.current_stream(0).synchronize(timeout=WAIT)
    t.join()
    assert cs[0].aborted
    checked("dead ranks")


def test_shutdown_with_a_collective_waiting_for_a_dead_rank_returns():
    """The process's exit path: ``shutdown()`` aborts every communicator first, so a collective
    waiting (timeout 600 s) for a rank that never comes does not hold the drain."""
    code = (
        "import runtime, numpy as np\n"
        "from runtime import comm\n"
        "runtime.init(device_count=2)\n"
        "cs = comm.init_all([0, 1], timeout=600.0)\n"
        "b = runtime.to_device(np.ones(2), device=0)\n"
        "cs[0].all_reduce(b, b)\n"
        "runtime.shutdown()\n"
        "print('shut down')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "shut down" in out.stdout
    assert "panic" not in out.stderr.lower()
    checked("dead ranks")


def test_zz_report_check_count():
    print("\ncollective misuse checks:", dict(CHECKS), "total", sum(CHECKS.values()))
