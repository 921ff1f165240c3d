"""Process life (issue 11, items 11-13): interpreter exit, Ctrl-C in init/shutdown, fork(),
and thread-start failures.

Each scenario runs in a fresh interpreter (``sys.executable -c script``); a test asserts the
exit code, the printed lines, and that stderr has no panic, traceback or abort text. Tests
check behaviour, never timing.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import runtime

BAD = (
    "panicked",
    "Traceback",
    "Fatal",
    "fatal",
    "Aborted",
    "abort",
    "core dumped",
    "SIGSEGV",
    # The exit hook gave up waiting for a runtime thread in Python code (`interp::close`).
    "still running Python code",
)


def run(code: str, expect_rc: int = 0) -> list[str]:
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=Path(__file__).parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    for word in BAD:
        assert word not in r.stderr, r.stderr
    assert r.returncode == expect_rc, (r.returncode, r.stdout, r.stderr)
    return r.stdout.split()


# -- item 11: interpreter exit -------------------------------------------------------------

SLOW_KERNELS = """
    s = runtime.Stream(0)
    log = []
    for i in range(4):
        s.launch_kernel(lambda i=i: (time.sleep(0.05), log.append(i)))
"""


def test_exit_drains_queued_python_kernels():
    code = f"""
    import atexit
    def report():
        print("ran", len(log))
    atexit.register(report)  # registered before import: runs after the package's shutdown
    import time, runtime
    runtime.init(device_count=1, memory="64MiB")
    {SLOW_KERNELS}
    print("queued")
    """
    assert run(code) == ["queued", "ran", "4"]


@pytest.mark.parametrize("before_import", [True, False])
def test_init_and_launch_in_an_atexit_handler(before_import):
    handler = """
    def late():
        import time, runtime
        from runtime import kernels
        runtime.init(device_count=1, memory="64MiB")
        s = runtime.Stream(0)
        log = []
        for i in range(3):
            s.launch_kernel(lambda i=i: (time.sleep(0.05), log.append(i)))
        x = runtime.empty(1024, "float32")
        s.launch_kernel(kernels.fill, (x, 2.0))
        print("late", len(log) if runtime.get_option("enableAsync") is False else "async")
    atexit.register(late)
    """
    code = f"""
    import atexit
    {handler if before_import else ""}
    import runtime
    runtime.init(device_count=1, memory="64MiB")
    {"" if before_import else handler}
    print("main")
    """
    # After the exit-time shutdown, submissions wait for their work; before it, they do not
    # (and the package's shutdown drains them).
    assert run(code) == ["main", "late", "3" if before_import else "async"]


def test_kernel_still_running_at_sys_exit_keeps_the_exit_code():
    code = """
    import sys, threading, time, runtime
    runtime.init(device_count=1, memory="64MiB")
    s = runtime.Stream(0)
    started = threading.Event()
    def k():
        started.set()
        time.sleep(0.3)
        print("kernel done", flush=True)
    s.launch_kernel(k)
    started.wait()
    print("exiting", flush=True)
    sys.exit(3)
    """
    assert run(code, expect_rc=3) == ["exiting", "kernel", "done"]


def test_exit_code_preserved_with_an_exit_time_runtime():
    code = """
    import atexit, sys
    def late():
        import runtime
        runtime.init(device_count=1, memory="64MiB")
        runtime.Stream(0).launch_kernel(lambda: None)
    atexit.register(late)
    import runtime
    runtime.init(device_count=1, memory="64MiB")
    sys.exit(3)
    """
    assert run(code, expect_rc=3) == []


def interrupt_when_ready(code: str) -> tuple[int, str, str]:
    """Start `code`, wait for its "ready" line, send SIGINT, and return (rc, stdout, stderr)."""
    code = f"MAIN_SOURCE = {textwrap.dedent(code)!r}\n" + textwrap.dedent(code)
    p = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=Path(__file__).parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "ready"
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    return p.returncode, out, err


WAIT_FOR_KERNEL = """
import threading, time, runtime
runtime.init(device_count=1, memory="64MiB")
s = runtime.Stream(0)
stop = threading.Event()
started = threading.Event()
def k():
    started.set()
    deadline = time.monotonic() + 30
    while not stop.is_set() and time.monotonic() < deadline:
        time.sleep(0.01)
s.launch_kernel(k)
started.wait()

def ready_when_main_calls(marker):
    # Print "ready" once the main thread is inside the call on the line ending in `marker`.
    import sys
    lines = MAIN_SOURCE.splitlines()
    line = next(i + 2 for i, t in enumerate(lines) if t.endswith(marker))  # after MAIN_SOURCE
    main = threading.main_thread().ident
    def poll():
        while sys._current_frames()[main].f_lineno != line:
            time.sleep(0.005)
        time.sleep(0.05)
        print("ready", flush=True)
    threading.Thread(target=poll, daemon=True).start()
"""


def test_shutdown_waiting_for_a_long_kernel_is_interruptible():
    code = (
        WAIT_FOR_KERNEL
        + """
ready_when_main_calls("# <- SIGINT")
try:
    runtime.shutdown()  # <- SIGINT
    print("not interrupted")
except KeyboardInterrupt:
    print("interrupted", runtime.is_initialized())
stop.set()
runtime.shutdown()  # finishes the interrupted shutdown
print("after", runtime.is_initialized())
runtime.init(device_count=1, memory="64MiB")
log = []
runtime.Stream(0).launch_kernel(log.append, (1,))
runtime.synchronize()
print("again", log)
"""
    )
    rc, out, err = interrupt_when_ready(code)
    assert rc == 0, err
    assert out.split() == ["interrupted", "True", "after", "False", "again", "[1]"]
    for word in BAD:
        assert word not in err, err


def test_init_waiting_for_an_interrupted_shutdown_is_interruptible():
    code = (
        WAIT_FOR_KERNEL
        + """
try:
    threading.Timer(0.05, lambda: __import__("_thread").interrupt_main()).start()
    runtime.shutdown()
except KeyboardInterrupt:
    pass
ready_when_main_calls("# <- SIGINT")
try:
    runtime.init(device_count=1, memory="64MiB")  # <- SIGINT
    print("not interrupted")
except KeyboardInterrupt:
    print("interrupted")
stop.set()
runtime.init(device_count=1, memory="64MiB")  # finishes the old shutdown, then builds anew
import numpy as np
x = runtime.to_device(np.ones(4, "float32"))
out = np.empty(4, np.float32)
runtime.memcpy_device_to_host(out, x)
print("init", runtime.is_initialized(), float(out.sum()))
"""
    )
    rc, out, err = interrupt_when_ready(code)
    assert rc == 0, err
    assert out.split() == ["interrupted", "init", "True", "4.0"]
    for word in BAD:
        assert word not in err, err


# -- item 12: fork() -----------------------------------------------------------------------

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork() here")


@needs_fork
def test_fork_child_gets_errors_from_inherited_handles_and_can_init():
    code = """
    import os, numpy as np, runtime
    from runtime import kernels
    runtime.init(device_count=2, memory="64MiB")
    buf = runtime.to_device(np.arange(8, dtype=np.float32))
    s = runtime.Stream(0)
    e = runtime.Event()
    s.launch_kernel(kernels.fill, (buf, 1.0))
    e.record(s)
    pid = os.fork()
    if pid == 0:
        errors = (runtime.InvalidHandleError, runtime.NotInitializedError)
        calls = {
            "buffer": lambda: runtime.memcpy_device_to_host(np.empty(8, np.float32), buf),
            "stream": s.synchronize,
            "query": s.query,
            "event": e.synchronize,
            "launch": lambda: s.launch_kernel(kernels.fill, (buf, 2.0)),
            "device": lambda: runtime.Device(0).synchronize(),
        }
        for name, call in calls.items():
            try:
                call()
                print(name, "no-error")
            except errors:
                print(name, "error")
        runtime.init(device_count=2, memory="64MiB")
        x = runtime.to_device(np.arange(8, dtype=np.float32))
        y = runtime.empty(8, "float32", device=0)
        s2 = runtime.Stream(0)
        s2.launch_kernel(kernels.add, (y, x, x))
        big = runtime.to_device(np.arange(1 << 20, dtype=np.float32))  # a split copy
        back = np.empty(1 << 20, np.float32)
        runtime.memcpy_device_to_host(back, big)
        out = np.empty(8, np.float32)
        runtime.memcpy_device_to_host(out, y, s2)
        s2.synchronize()
        try:
            s.synchronize()
        except runtime.InvalidHandleError:
            print("old-stream", "error")
        ok = out.tolist() == [2.0 * i for i in range(8)] and (back == np.arange(1 << 20)).all()
        print("child", ok, flush=True)
        del buf, s, e
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    s.synchronize()
    got = np.empty(8, np.float32)
    runtime.memcpy_device_to_host(got, buf)
    print("parent", os.waitstatus_to_exitcode(status), got.tolist() == [1.0] * 8)
    """
    out = run(code)
    child = dict(zip(out[:12:2], out[1:12:2]))
    assert child == {k: "error" for k in ("buffer", "stream", "query", "event", "launch", "device")}
    assert out[12:] == ["old-stream", "error", "child", "True", "parent", "0", "True"]


@needs_fork
def test_fork_from_a_process_with_busy_engines():
    code = """
    import os, time, numpy as np, runtime
    from runtime import kernels
    runtime.init(device_count=1, memory="256MiB")
    a = runtime.to_device(np.ones((256, 256), np.float32))
    c = runtime.empty((256, 256), "float32")
    streams = [runtime.Stream(0) for _ in range(3)]
    for _ in range(3):
        for s in streams:
            for _ in range(20):
                s.launch_kernel(kernels.matmul, (c, a, a))
        pid = os.fork()
        if pid == 0:
            runtime.init(device_count=1, memory="64MiB")
            x = runtime.to_device(np.full(4, 3.0, np.float32))
            y = runtime.empty(4, "float32")
            runtime.Stream(0).launch_kernel(kernels.add, (y, x, x))
            runtime.synchronize()
            out = np.empty(4, np.float32)
            runtime.memcpy_device_to_host(out, y)
            os._exit(0 if out.tolist() == [6.0] * 4 else 1)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), end=" ")
    runtime.synchronize()
    out = np.empty((256, 256), np.float32)
    runtime.memcpy_device_to_host(out, c)
    print(bool((out == 256.0).all()))
    """
    assert run(code) == ["0", "0", "0", "True"]


@needs_fork
def test_a_child_forked_inside_a_completion_callback_exits_without_waiting():
    """The callback runs on the forking thread (its event has completed), inside the
    interpreter gate: the child counts just that entry, which leaves as the callback returns,
    so the child's exit hook finds nobody inside. The child used to count nobody, the
    callback's leaving wrapped the count, and its exit waited 5 s and gave up (RELIABILITY.md
    W2); the warning it prints then is one of `BAD`."""
    code = """
    import os, sys, runtime
    runtime.init(device_count=1, memory="64MiB")
    s = runtime.Stream(0)
    e = runtime.Event()
    e.record(s)
    e.synchronize()
    pids = []
    e._on_complete(lambda err: pids.append(os.fork()))
    if pids == [0]:
        runtime.init(device_count=1, memory="64MiB")
        runtime.Stream(0).synchronize()
        print("child", flush=True)
        sys.exit(3)
    _, status = os.waitpid(pids[0], 0)
    print("parent", os.waitstatus_to_exitcode(status))
    """
    assert run(code) == ["child", "parent", "3"]


@needs_fork
def test_a_child_forked_inside_a_group_ends_it_without_waiting_for_the_parents_ranks():
    """A communicator made inside a group forms at the group's end, and a child forked
    before that end runs the end too. Its communicator waits for a rank the parent's thread
    joins: the child's end used to wait the communicator's whole timeout for it. The child now
    leaves what the group holds to the parent's runtime, and the communicator's first use fails
    at once, naming the fork (RELIABILITY.md W7)."""
    code = """
    import os, runtime
    from runtime import comm
    runtime.init(device_count=2, memory="64MiB")
    uid = comm.get_unique_id()
    with comm.group():
        c0 = comm.Communicator(2, uid, 0, device=0, timeout=60)
        pid = os.fork()
        if pid:
            c1 = comm.Communicator(2, uid, 1, device=1, timeout=60)
    if pid == 0:
        try:
            c0.rank
        except runtime.InvalidHandleError as e:
            print("child", "forked" in str(e), flush=True)
        os._exit(3)
    _, status = os.waitpid(pid, 0)
    print("parent", c0.rank, c1.rank, os.waitstatus_to_exitcode(status))
    """
    assert run(code) == ["child", "True", "parent", "0", "1", "3"]


def _pool_worker(n: int) -> list[float]:
    from runtime import kernels

    runtime.init(device_count=1, memory="64MiB")
    x = runtime.to_device(np.arange(n, dtype=np.float32))
    y = runtime.empty(n, "float32")
    s = runtime.Stream(0)
    s.launch_kernel(kernels.add, (y, x, x))
    out = np.empty(n, np.float32)
    runtime.memcpy_device_to_host(out, y, s)
    s.synchronize()
    return out.tolist()


@needs_fork
def test_multiprocessing_fork_pool_workers_init_their_own_runtime():
    runtime.init(device_count=1, memory="64MiB")  # the parent uses the runtime too
    try:
        s = runtime.Stream(0)
        s.launch_kernel(lambda: None)
        s.synchronize()
        with multiprocessing.get_context("fork").Pool(2) as pool:
            got = pool.map(_pool_worker, [1, 2, 3, 4])
        assert got == [[2.0 * i for i in range(n)] for n in [1, 2, 3, 4]]
        s.launch_kernel(lambda: None)
        s.synchronize()
    finally:
        runtime.shutdown()


# -- item 13: thread-start failures --------------------------------------------------------


def test_engine_thread_start_failure_is_an_error_and_nothing_is_queued():
    code = """
    import numpy as np, runtime
    from runtime import kernels
    runtime.init(device_count=1, memory="64MiB")
    x = runtime.empty(16, "float32")
    s = runtime.Stream(0)
    for n in (1, 3, 1000):
        runtime._runtime._inject_thread_spawn_failures(n)
        try:
            s.launch_kernel(kernels.fill, (x, 1.0))
            print("launched")
        except runtime.Error as e:
            print("error", "cannot start" in str(e), isinstance(e, runtime.Error))
        print("idle", s.query())
    runtime._runtime._inject_thread_spawn_failures(0)
    s.launch_kernel(kernels.fill, (x, 5.0))
    log = []
    s.launch_kernel(log.append, (1,))
    out = np.empty(16, np.float32)
    runtime.memcpy_device_to_host(out, x, s)
    s.synchronize()
    print("works", out.tolist() == [5.0] * 16, log)
    runtime.shutdown()
    print("down")
    """
    out = run(code)
    assert out == ["error", "True", "True", "idle", "True"] * 3 + ["works", "True", "[1]", "down"]


def test_scrubber_and_copy_helper_start_failures_fall_back_to_inline_work():
    code = """
    import numpy as np, runtime
    runtime.init(device_count=1, memory="256MiB")
    runtime.Stream(0).launch_kernel(lambda: None)  # the engines start here
    runtime.synchronize()
    runtime._runtime._inject_thread_spawn_failures(1000)
    big = np.arange(4 << 20, dtype=np.uint8)  # large enough to be split across copy helpers
    for _ in range(3):
        b = runtime.to_device(big)
        back = np.empty_like(big)
        runtime.memcpy_device_to_host(back, b)
        assert (back == big).all()
        del b  # a cached large block: scrubbed inline, as no scrubber can start
    fresh = runtime.empty(4 << 20, "uint8")
    back = np.empty(4 << 20, np.uint8)
    runtime.memcpy_device_to_host(back, fresh)
    print("zeroed", not back.any())
    runtime._runtime._inject_thread_spawn_failures(0)
    print("ok")
    """
    assert run(code) == ["zeroed", "True", "ok"]


def test_ctrl_c_while_the_exit_time_shutdown_waits_for_a_kernel_that_never_ends():
    # The interpreter's exit-time shutdown waits for queued work; a kernel that never ends
    # would hold the process for ever. Ctrl-C there says so in one line and ends the process
    # as an unhandled Ctrl-C does (killed by SIGINT), without a traceback and without waiting.
    code = """
    import threading, time, runtime
    runtime.init(device_count=1, memory="64MiB")
    s, probe = runtime.Stream(0), runtime.Stream(0)
    def forever():
        told = False
        while True:
            time.sleep(0.01)
            if not told:
                try:
                    probe.launch_kernel(lambda: None)
                except runtime.Error:  # refused: the exit-time shutdown is draining
                    told = True
                    print("ready", flush=True)
    s.launch_kernel(forever)
    print("main done", flush=True)
    """
    p = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=Path(__file__).parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "main done"
        assert p.stdout.readline().strip() == "ready"  # main returned; shutdown waits
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == -signal.SIGINT, (p.returncode, err)
    assert err.strip().splitlines() == [
        "runtime: interrupted while waiting for queued work at exit; the work still queued "
        "or running is abandoned"
    ]


@needs_fork
def test_fork_child_starts_with_no_defer_scope_open():
    """Defer scopes belong to the process that opened them. A child forked while another
    thread's scope was open used to start with it open for ever, holding every buffer it let
    go of until the device ran out of memory; a scope of the forking thread's closes in the
    child without effect (its exit must not take the child's count below zero)."""
    code = """
    import os, threading, runtime
    from runtime import _runtime as N
    runtime.init(device_count=1, memory="64MiB")
    def churn():  # 200 MiB through a 64 MiB device: each buffer must be freed at once
        for _ in range(200):
            b = runtime.empty((1 << 20,), "uint8")
            del b
        return runtime.memory_allocated()
    inside, leave = threading.Event(), threading.Event()
    def worker():
        with runtime.defer_cleanup():
            inside.set()
            leave.wait()
    t = threading.Thread(target=worker)
    t.start()
    inside.wait()
    held = runtime.empty((1 << 20,), "uint8")
    del held  # held for the worker's scope
    pid = os.fork()
    if pid == 0:
        print("child1", *N._defer_state(), flush=True)
        runtime.init(device_count=1, memory="64MiB")
        print("churn", churn(), *N._defer_state(), flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
    with runtime.defer_cleanup():
        pid = os.fork()
        if pid == 0:
            print("child2", *N._defer_state(), flush=True)
            runtime.init(device_count=1, memory="64MiB")
            print("churn", churn(), *N._defer_state(), flush=True)
    if pid == 0:
        print("closed", *N._defer_state(), flush=True)
        with runtime.defer_cleanup():
            b = runtime.empty((1 << 20,), "uint8")
            del b
            print("own", *N._defer_state(), runtime.memory_allocated() >> 20, flush=True)
        print("after", *N._defer_state(), runtime.memory_allocated(), flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
    print("parent", *N._defer_state(), flush=True)
    leave.set()
    t.join()
    print("parent", *N._defer_state(), runtime.memory_allocated())
    """
    assert run(code) == (
        ["child1", "0", "0", "churn", "0", "0", "0"]
        + ["child2", "0", "0", "churn", "0", "0", "0", "closed", "0", "0"]
        + ["own", "1", "1", "1", "after", "0", "0", "0"]
        + ["parent", "1", "1", "parent", "0", "0", "0"]
    )


@needs_fork
def test_fork_child_starts_with_an_empty_pinned_cache_and_statistics():
    """The pinned cache and its statistics start over in a forked child, as after a
    shutdown. The child used to count the parent's blocks as its own and serve its requests
    from the parent's cache, whose pages are not locked in the child (``mlock`` is not
    inherited) although the statistics said so: the locked bytes must match the kernel's
    count (``VmLck``) in both processes."""
    code = """
    import os, runtime
    KEYS = ("allocations.current", "allocated_bytes.current", "reserved_bytes.current",
            "cache_hits")
    def show(tag):
        st = runtime.host_memory_stats()
        line = [x for x in open("/proc/self/status") if x.startswith("VmLck")][0]
        locked = st["locked_bytes.current"] == int(line.split()[1]) * 1024
        print(tag, *(st[k] for k in KEYS), locked, flush=True)
    runtime.init(device_count=1)
    keep = runtime.malloc_host(1 << 20)
    tmp = runtime.malloc_host(4 << 20)
    del tmp  # cached in the parent
    pid = os.fork()
    if pid == 0:
        try:
            show("fork")
            runtime.init(device_count=1)
            show("init")
            b = runtime.malloc_host(4 << 20)
            show("alloc")
            del keep  # the parent's block, counted nowhere in the child
            show("gone")
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    show("parent")
    """
    mib = 1 << 20
    child_alloc = ["1", str(4 * mib), str(4 * mib), "0", "True"]
    assert run(code) == (
        ["fork", "0", "0", "0", "0", "True", "init", "0", "0", "0", "0", "True"]
        + ["alloc", *child_alloc, "gone", *child_alloc]
        + ["parent", "1", str(mib), str(5 * mib), "0", "True"]
    )


@needs_fork
def test_fork_child_starts_with_tracing_off_and_an_empty_log():
    """Tracing belongs to the process that started it. A forked child used to go on
    tracing, and its log began with the parent's records from before the fork."""
    code = """
    import os, numpy as np, runtime
    from runtime import _runtime as N
    def allocs(recs):
        return sorted(r["bytes"] for r in recs if r["phase"] == "alloc")
    runtime.init(device_count=1)
    N.trace_start()
    a = runtime.to_device(np.ones(1024, np.float32))
    runtime.synchronize()
    pid = os.fork()
    if pid == 0:
        try:
            print("child", N.trace_enabled(), flush=True)
            runtime.init(device_count=1)
            b = runtime.to_device(np.ones(16, np.float32))
            runtime.synchronize()
            print("off", len(N.trace_stop()), flush=True)
            N.trace_start()
            c = runtime.to_device(np.ones(32, np.float32))
            runtime.synchronize()
            print("own", *allocs(N.trace_stop()), flush=True)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    print("parent", N.trace_enabled(), *allocs(N.trace_stop()))
    """
    out = run(code)
    assert out == ["child", "False", "off", "0", "own", "128", "parent", "True", "4096"]


@needs_fork
def test_fork_while_another_thread_holds_the_acl_faces_lock():
    """`runtime.acl` guards its registered host memory with one lock. A fork while another
    thread held it left the child's copy held by a thread that does not exist there, and the
    child's first call under it hung. The fork now waits for the lock, and the child makes
    a lock of its own."""
    code = """
    import os, threading
    from runtime.acl import _state
    held, release = threading.Event(), threading.Event()
    def hold():
        with _state.lock:
            held.set()
            release.wait()
    threading.Thread(target=hold).start()
    held.wait()
    threading.Timer(0.2, release.set).start()
    pid = os.fork()
    if pid == 0:
        with _state.lock:
            print("child", flush=True)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    print("parent", os.waitstatus_to_exitcode(status))
    """
    assert run(code) == ["child", "parent", "0"]
