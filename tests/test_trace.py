"""The trace (`runtime.profile`, `runtime.trace.to_chrome`): timestamps, durations, lanes and
counters, checked against what the runtime itself reports (event timestamps, memory
statistics, stream ids, engine threads). Orderings and equalities only, never durations
against a clock."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

import runtime
from runtime import kernels
from runtime.trace import to_chrome

WAIT = 10.0


@pytest.fixture(scope="module", autouse=True)
def rt():
    runtime.shutdown()
    runtime.init(device_count=2, memory="64MiB")
    yield
    runtime.shutdown()


def runs(records, stream=None):
    return [r for r in records if r["phase"] == "run" and (stream is None or r["stream"] == stream)]


def test_each_command_is_enqueued_then_run_in_stream_order():
    s = runtime.Stream(0)
    x = runtime.to_device(np.arange(4096, dtype=np.float32))
    with runtime.profile() as records:
        for k in range(5):
            s.launch_kernel(kernels.scale, (x, x, 1.0 + k))
        s.synchronize(timeout=WAIT)
    enq = [r for r in records if r["phase"] == "enqueue" and r["stream"] == s.id]
    ran = runs(records, s.id)
    assert [r["name"] for r in enq] == ["scale"] * 5
    assert [r["name"] for r in ran] == ["scale"] * 5
    for e, r in zip(enq, ran):
        assert e["ts_ns"] <= r["ts_ns"] <= r["end_ns"]  # queued before it ran; end after start
    for a, b in zip(ran, ran[1:]):
        assert a["end_ns"] <= b["ts_ns"]  # one at a time, in order
    assert all(r["device"] == 0 for r in enq + ran)


def test_a_graph_replays_nodes_are_each_traced_as_runs_in_order():
    # A replay runs its nodes on a path of its own (`stream::run_node`); with tracing on,
    # every node, one that uses no memory or one that does, is still a run of its own.
    s = runtime.Stream(0)
    x = runtime.to_device(np.ones(1024, dtype=np.float32))
    s.begin_capture()
    s.launch_kernel(kernels.noop)
    s.launch_kernel(kernels.scale, (x, x, 2.0))
    s.launch_kernel(kernels.noop)
    g = s.end_capture()
    with runtime.profile() as records:
        g.launch(s)
        s.synchronize(timeout=WAIT)
    ran = runs(records, s.id)
    assert [r["name"] for r in ran] == ["noop", "scale", "noop"]
    for a, b in zip(ran, ran[1:]):
        assert a["end_ns"] <= b["ts_ns"]
    np.testing.assert_array_equal(x.copy_to_host(), np.full(1024, 2.0, np.float32))
    # Outside a profile the same replay runs on (and is not recorded).
    g.launch(s)
    s.synchronize(timeout=WAIT)
    np.testing.assert_array_equal(x.copy_to_host(), np.full(1024, 4.0, np.float32))


def test_a_run_span_covers_what_happened_while_it_ran():
    # A host function held by a gate: an event completed (inline, on an idle stream) while it
    # is held has a timestamp inside its span; one recorded behind it, after its end.
    s, idle = runtime.Stream(0), runtime.Stream(1)
    gate = threading.Event()
    started = threading.Event()
    with runtime.profile() as records:
        s.launch_host_func(lambda: (started.set(), gate.wait(WAIT)))
        after = s.record_event()
        assert started.wait(WAIT)
        during = idle.record_event()  # idle: completes now, timestamped now
        gate.set()
        s.synchronize(timeout=WAIT)
    (span,) = [r for r in runs(records, s.id) if r["name"] != f"record(Event#{after.id})"]
    assert span["ts_ns"] <= during.timestamp_ns <= span["end_ns"]
    assert span["end_ns"] <= after.timestamp_ns
    (rec,) = [r for r in records if r["phase"] == "record" and r["stream"] == s.id]
    assert rec["name"] == f"record(Event#{after.id})"
    assert after.timestamp_ns <= rec["ts_ns"]  # the trace notes the record once it completed
    # Chrome's units: microseconds, the duration exactly end - start.
    (x,) = [e for e in to_chrome(records)["traceEvents"] if e.get("ph") == "X"]
    assert x["ts"] == span["ts_ns"] / 1000.0
    assert x["dur"] == (span["end_ns"] - span["ts_ns"]) / 1000.0


def test_lanes_are_devices_and_streams_and_engines_are_named():
    runtime.set_option("enablePipelining", True)
    s0, s1 = runtime.Stream(0), runtime.Stream(1)
    # Pinned sources: a queued copy from pinned memory runs on the stream's copy engine (one
    # from pageable memory on an idle stream would run at once on the caller).
    host = runtime.pinned_empty(1024, np.float32)
    host[:] = np.arange(1024, dtype=np.float32)
    with runtime.profile() as records:
        a = runtime.to_device(host, device=0, stream=s0)
        b = runtime.to_device(host, device=1, stream=s1)
        s0.launch_kernel(kernels.scale, (a, a, 2.0))
        s1.launch_kernel(kernels.scale, (b, b, 3.0))
        s0.synchronize(timeout=WAIT)
        s1.synchronize(timeout=WAIT)
    ran = runs(records)
    lanes = {(r["device"], r["stream"]) for r in ran}
    assert lanes == {(0, s0.id), (1, s1.id)}
    for r in ran:
        kind = "copy" if r["name"].startswith("memcpy") else "compute"
        assert r["engine"].startswith(f"runtime-d{r['device']}-{kind}-"), r
    doc = json.loads(json.dumps(to_chrome(records)))  # what profile(path) writes
    events = doc["traceEvents"]
    names = {
        (e["pid"], e.get("tid")): e["args"]["name"]
        for e in events
        if e["ph"] == "M" and e["name"] == "thread_name"
    }
    assert names == {(0, s0.id): f"stream {s0.id}", (1, s1.id): f"stream {s1.id}"}
    procs = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert procs == {0: "device 0", 1: "device 1"}
    for e in events:
        if e["ph"] == "X":
            assert (e["pid"], e["tid"]) in names
            assert e["args"]["engine"].startswith(f"runtime-d{e['pid']}-")


def test_the_allocated_bytes_counter_follows_the_memory_statistics():
    runtime.synchronize()
    seen = []
    with runtime.profile() as records:
        a = runtime.device_malloc(1, 100_000)
        seen.append(runtime.memory_stats(1)["allocated"])
        b = runtime.device_malloc(1, 300)
        seen.append(runtime.memory_stats(1)["allocated"])
        runtime.device_free(a)
        seen.append(runtime.memory_stats(1)["allocated"])
        runtime.device_free(b)
        seen.append(runtime.memory_stats(1)["allocated"])
    mem = [r for r in records if r["phase"] in ("alloc", "free") and r["device"] == 1]
    assert [(r["phase"], r["bytes"]) for r in mem] == [
        ("alloc", 100_000),
        ("alloc", 300),
        ("free", 100_000),
        ("free", 300),
    ]
    assert [r["allocated"] for r in mem] == seen
    counters = [e for e in to_chrome(records)["traceEvents"] if e["ph"] == "C" and e["pid"] == 1]
    assert [c["args"]["allocated"] for c in counters] == seen
    assert [c["ts"] for c in counters] == [r["ts_ns"] / 1000.0 for r in mem]
    assert all(a["ts"] <= b["ts"] for a, b in zip(counters, counters[1:]))
    # Memory instants sit on the memory lane (tid 0) of their device.
    instants = [e for e in to_chrome(records)["traceEvents"] if e.get("cat") == "memory"]
    assert {(e["pid"], e["tid"]) for e in instants} == {(1, 0)}


def test_nothing_is_recorded_outside_a_profile():
    s = runtime.Stream(0)
    s.launch_kernel(kernels.noop)
    s.synchronize(timeout=WAIT)
    with runtime.profile() as records:
        pass
    assert records == []
