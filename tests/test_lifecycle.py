"""init / shutdown: idempotence, configuration, errors before init and after shutdown."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import runtime


@pytest.fixture(autouse=True)
def clean():
    runtime.shutdown()
    yield
    runtime.shutdown()


CALLS_NEEDING_INIT = [
    lambda: runtime.get_device_count(),
    lambda: runtime.get_available_devices(),
    lambda: runtime.Device(0),
    lambda: runtime.get_device_properties(0),
    lambda: runtime.get_device_memory_info(0),
    lambda: runtime.get_device_compute_info(0),
    lambda: runtime.set_device(0),
    lambda: runtime.get_device(),
    lambda: runtime.device_malloc(0, 16),
    lambda: runtime.Stream(),
    lambda: runtime.Event(),
    lambda: runtime.stream_synchronize(),
    lambda: runtime.memory_stats(),
    lambda: runtime.empty_cache(),
    lambda: runtime.current_stream(),
    lambda: runtime.empty((4,), "float32"),
]


@pytest.mark.parametrize("call", CALLS_NEEDING_INIT)
def test_calls_before_init_raise_not_initialized(call):
    with pytest.raises(runtime.NotInitializedError, match=r"runtime\.init\(\)"):
        call()


@pytest.mark.parametrize("call", CALLS_NEEDING_INIT)
def test_calls_after_shutdown_raise_not_initialized(call):
    runtime.init(device_count=2, memory="64MiB")
    runtime.shutdown()
    with pytest.raises(runtime.NotInitializedError):
        call()


def test_options_work_without_init():
    assert runtime.get_option("enableAsync") is True
    runtime.set_option("enablePipelining", False)
    runtime.set_option("enablePipelining", True)
    assert not runtime.is_initialized()


def test_init_is_idempotent_and_shutdown_too():
    runtime.init()
    runtime.init()
    assert runtime.is_initialized() and runtime.get_device_count() == 8
    runtime.shutdown()
    runtime.shutdown()
    assert not runtime.is_initialized()


def test_init_with_other_settings_while_initialised_is_refused():
    runtime.init(device_count=2, memory="64MiB")
    runtime.init(device_count=2, memory="64MiB")
    with pytest.raises(ValueError, match="shutdown"):
        runtime.init(device_count=3)


def test_init_keywords():
    runtime.init(device_count=3, memory="256MiB", profile="host")
    assert runtime.get_device_count() == 3
    p = runtime.get_device_properties(2)
    assert p.total_memory == 256 * 1024**2
    assert p.profile == "host" and "Virtual" in p.name
    assert p.cores == os.cpu_count()
    runtime.shutdown()
    runtime.init(memory=1 << 30, device_count=1)
    assert runtime.get_device_properties(0).total_memory == 1 << 30


@pytest.mark.parametrize(
    "kw, exc, match",
    [
        ({"device_count": 0}, ValueError, "device_count"),
        ({"device_count": 65}, ValueError, "device_count"),
        ({"device_count": -1}, ValueError, "device_count"),
        ({"device_count": "8"}, ValueError, "device_count"),
        ({"device_count": True}, TypeError, "device_count"),
        ({"memory": "lots"}, ValueError, "memory"),
        ({"memory": "1KiB"}, ValueError, "memory"),
        ({"memory": 1.5}, TypeError, "memory"),
        ({"profile": "tpu"}, ValueError, "ascend910"),
        ({"profile": 3}, TypeError, "profile"),
    ],
)
def test_bad_init_arguments(kw, exc, match):
    with pytest.raises(exc, match=match):
        runtime.init(**kw)
    assert not runtime.is_initialized()


def test_unknown_init_keyword_is_type_error():
    with pytest.raises(TypeError):
        runtime.init(devices=3)


def test_environment_variables_configure_init():
    code = (
        "import runtime; runtime.init(); p = runtime.get_device_properties(0); "
        "print(runtime.get_device_count(), p.total_memory, p.profile)"
    )
    env = dict(
        os.environ,
        RUNTIME_DEVICE_COUNT="3",
        RUNTIME_DEVICE_MEMORY="2GiB",
        RUNTIME_DEVICE_PROFILE="host",
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["3", str(2 * 1024**3), "host"]
    env["RUNTIME_DEVICE_COUNT"] = "many"
    bad = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert bad.returncode != 0 and "RUNTIME_DEVICE_COUNT" in bad.stderr


def test_the_suite_takes_every_runtime_setting_out_of_its_environment():
    """A value exported in the developer's shell cannot change what the suite tests:
    `tests/conftest.py` takes every variable the core reads (its `ENV_*` constants) out of
    the environment and names them in the report header."""
    config = Path(__file__).parents[1] / "crates" / "runtime-core" / "src" / "config" / "mod.rs"
    names = re.findall(r'pub const ENV_[A-Z_]+: &str = "([A-Z_]+)";', config.read_text())
    assert {"RUNTIME_DEVICE_COUNT", "RUNTIME_LAUNCH_BLOCKING"} <= set(names)
    assert not set(names) & set(os.environ)
    one_test = f"{Path(__file__).name}::test_unknown_init_keyword_is_type_error"
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", one_test],
        cwd=Path(__file__).parent,
        env=dict(os.environ, RUNTIME_LAUNCH_BLOCKING="1", RUNTIME_DEVICE_COUNT="1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    header = "ignored by the tests: RUNTIME_DEVICE_COUNT=1, RUNTIME_LAUNCH_BLOCKING=1"
    assert header in r.stdout, r.stdout


def test_every_thread_barrier_in_the_suite_gives_up():
    """A thread that fails before its barrier leaves the others waiting there: without a
    timeout they hang until pytest-timeout's 300 s and hide the failure behind a timeout."""
    tests = Path(__file__).parent
    needle = "threading." + "Barrier("  # not spelled out: this line would match itself
    calls = [
        (f"{path.relative_to(tests)}:{n}", line.strip())
        for path in sorted(tests.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if needle in line
    ]
    assert len(calls) >= 8
    assert [c for c in calls if "timeout=" not in c[1]] == []


def test_shutdown_fails_a_communicator_still_forming_and_empties_the_threads_group():
    """A communicator waiting for its ranks at shutdown fails there: its waiter at once, and a
    join of its id after the next `init` too, which used to complete it with a device of each
    runtime. The group open across the shutdown leaves it to the old runtime: the group's
    end returns instead of waiting for it (RELIABILITY.md W7)."""
    import threading

    from runtime import comm

    runtime.init(device_count=2, memory="64MiB")
    uid = comm.get_unique_id()
    out = {}

    def use(c):
        try:
            _ = c.rank
        except runtime.InvalidOperationError as e:
            out["error"] = str(e)

    with comm.group():
        c = comm.Communicator(2, uid, 0, device=0, timeout=60)  # joined; made at the end
        t = threading.Thread(target=use, args=(c,))
        t.start()  # waits for rank 1, or has yet to begin: the outcome is the same
        runtime.shutdown()
        t.join(30)
        assert not t.is_alive()
        runtime.init(device_count=2, memory="64MiB")
    assert "the runtime is shutting down" in out["error"]
    with pytest.raises(runtime.InvalidOperationError, match="shutting down"):
        _ = c.rank
    with pytest.raises(runtime.InvalidOperationError, match="shutting down"):
        comm.Communicator(2, uid, 1, device=1, timeout=60)


class _SilentPeer:
    """A transport whose other process never answers (it stands for MPI in `init_mpi`);
    `started` is set once the exchange has begun."""

    def __init__(self):
        import threading

        self.started = threading.Event()

    def reduces(self, dtype, op):
        return True

    def start(self, kind, *args):
        self.started.set()

        class Pending:
            def test(self):
                return False

        return Pending()


def test_shutdown_ends_a_connect_still_waiting_for_the_other_processes():
    """`comm_connect` (behind `init_mpi`) waiting for another process went on waiting through
    shutdown and the next `init`, and when the other process answered it returned
    communicators over a device of the runtime shut down (RELIABILITY.md W10)."""
    import threading

    from runtime import _runtime as native

    runtime.init(device_count=2, memory="64MiB")
    out = {}
    peer = _SilentPeer()

    def connect():
        try:
            native.comm_connect([0], 0, 2, peer, timeout=60.0)
        except runtime.InvalidHandleError as e:
            out["error"] = str(e)

    t = threading.Thread(target=connect)
    t.start()
    assert peer.started.wait(30)
    runtime.shutdown()
    t.join(30)
    assert not t.is_alive()
    assert "the runtime was shut down" in out["error"]


def event_uses(e, s):
    """Every call that uses event `e` (with stream `s`)."""
    return [
        e.query,
        e.synchronize,
        lambda: e.record(s),
        lambda: e.wait(s),
        lambda: s.wait_event(e),
        lambda: e.elapsed_time(e),
        lambda: e.timestamp_ns,
    ]


def test_old_handles_fail_after_shutdown_and_new_init_works():
    for _ in range(5):
        runtime.init(device_count=2, memory="64MiB")
        buf = runtime.device_malloc(1, 1024)
        s = runtime.Stream(1)
        e = runtime.Event()
        e.record(s)
        dev = runtime.Device(1)
        runtime.shutdown()
        runtime.init(device_count=2, memory="64MiB")
        with pytest.raises(runtime.InvalidHandleError, match="shut down"):
            runtime.memcpy_host_to_device(buf, b"x" * 16)
        with pytest.raises(runtime.InvalidHandleError):
            s.synchronize()
        with pytest.raises(runtime.InvalidHandleError):
            s.launch_kernel(runtime.kernels.noop)
        # Regression: an event belongs to its runtime too (it used to keep working)
        new_stream = runtime.Stream(1)
        for use in event_uses(e, new_stream):
            with pytest.raises(runtime.InvalidHandleError, match=r"Event#\d+ .*shut down"):
                use()
        e.destroy()  # letting go of a stale handle is fine
        fresh = runtime.Event()
        fresh.record(new_stream)
        fresh.synchronize()
        dev.get_properties()  # a Device is an index: it refers to the new runtime's device 1
        runtime.shutdown()


def test_shutdown_waits_for_queued_work():
    runtime.init(device_count=4, memory="64MiB")
    done = []
    streams = [runtime.Stream(i % 4) for i in range(8)]
    import time

    for i, s in enumerate(streams):
        s.launch_host_func(time.sleep, 0.01)
        s.launch_host_func(done.append, i)
    runtime.shutdown()
    assert sorted(done) == list(range(8))


def test_views_survive_shutdown():
    runtime.init(device_count=1, memory="64MiB")
    buf = runtime.to_device(np.arange(16, dtype=np.int64))
    view = np.asarray(buf.view(np.int64))
    runtime.shutdown()
    # The memory stays mapped while the view lives; the handle itself is dead.
    assert view.sum() == sum(range(16))
    with pytest.raises(runtime.InvalidHandleError):
        buf.copy_to_host()


def test_shutdown_resets_every_threads_current_device():
    # issue 11 item 7: a new runtime with fewer devices starts every thread on device 0.
    import threading

    runtime.init(device_count=4, memory="64MiB")
    to_worker, to_main = threading.Event(), threading.Event()
    seen = {}

    def worker():
        runtime.set_device(3)
        seen["before"] = runtime.get_device()
        to_main.set()
        assert to_worker.wait(10)
        seen["after"] = runtime.get_device()
        seen["buffer device"] = runtime.to_device(np.arange(4, dtype=np.int32)).device.index
        to_main.set()

    t = threading.Thread(target=worker)
    t.start()
    assert to_main.wait(10)
    to_main.clear()
    runtime.shutdown()
    runtime.init(device_count=2, memory="64MiB")
    to_worker.set()
    assert to_main.wait(10)
    t.join(10)
    assert seen == {"before": 3, "after": 0, "buffer device": 0}
