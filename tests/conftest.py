"""Shared test settings.

The runtime is a process-wide singleton: every test module that needs it initialises it in a
module-scoped fixture and shuts it down afterwards, so modules can use different settings.
Hypothesis profiles: ``ci`` (default) and ``slow`` (``HYPOTHESIS_PROFILE=slow``).
"""

from __future__ import annotations

import faulthandler
import os
import re
import signal
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "slow", max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# The runtime's settings from the environment: the `ENV_*` constants of the core's config
# module, read from its source (as `scripts/test.sh` does). The suite tests the defaults, and
# the tests of a variable set it in the scripts they start, so values exported in the
# developer's shell are taken out of this process (and so of the scripts it starts) and named
# in the report header. Left in, `RUNTIME_LAUNCH_BLOCKING=1` failed 35 tests of
# `test_device.py`, `test_stream.py` and `test_event.py`, and `RUNTIME_DEVICE_COUNT=1` hung one.
RUNTIME_SETTINGS = tuple(
    re.findall(
        r'pub const ENV_[A-Z_]+: &str = "([A-Z_]+)";',
        (Path(__file__).parents[1] / "crates/runtime-core/src/config/mod.rs").read_text(),
    )
)
_IGNORED_SETTINGS = {name: os.environ.pop(name) for name in RUNTIME_SETTINGS if name in os.environ}


def pytest_report_header(config):
    if _IGNORED_SETTINGS:
        pairs = ", ".join(f"{k}={v}" for k, v in _IGNORED_SETTINGS.items())
        return f"runtime settings from the environment, ignored by the tests: {pairs}"
    return None


# The Ctrl-C tests press it with `_thread.interrupt_main()`, and send SIGINT to the scripts
# they start. Both need Python's own SIGINT handler. A process started in the background by a
# shell without job control (`bash .ci/run &`, `nohup`) inherits SIGINT ignored, and Python
# keeps an ignored SIGINT ignored: `interrupt_main()` then does nothing (a wait ran its whole
# 30 s timeout instead of raising KeyboardInterrupt), and the scripts inherit it ignored too.
# So the session installs Python's handler when it finds SIGINT ignored.
@pytest.fixture(autouse=True, scope="session")
def _sigint_raises_keyboard_interrupt():
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
    ):
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


# A per-test timeout, so that a deadlock fails the run (with every thread's stack) instead of
# hanging it: pytest-timeout (scripts/test.sh installs it) with its thread method, which works
# whatever the hung thread is doing; without it, faulthandler ends the process the same way.
# RUNTIME_TEST_TIMEOUT sets the seconds (0: none); the long reliability runs get their own
# length on top, and the slow Hypothesis profile none.
TEST_TIMEOUT = float(os.environ.get("RUNTIME_TEST_TIMEOUT", "300"))


def _timeout_for(item) -> float:
    if TEST_TIMEOUT <= 0:
        return 0.0
    path = str(item.path)
    if path.endswith("test_stateful.py") and os.environ.get("HYPOTHESIS_PROFILE") == "slow":
        return 0.0
    extra = 0.0
    if path.endswith("test_stress.py"):
        extra = float(os.environ.get("RUNTIME_STRESS_SECONDS", "10"))
    if path.endswith("test_fuzz_args.py"):
        extra = float(os.environ.get("FUZZ_SECONDS", "10"))
    return TEST_TIMEOUT + extra


def pytest_collection_modifyitems(config, items):
    if not config.pluginmanager.hasplugin("timeout"):
        return
    for item in items:
        seconds = _timeout_for(item)
        if seconds > 0 and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(seconds, method="thread"))


@pytest.fixture(autouse=True)
def _deadlock_watchdog(request):
    """Without pytest-timeout: end the process with every thread's stack after the timeout."""
    seconds = _timeout_for(request.node)
    if request.config.pluginmanager.hasplugin("timeout") or seconds <= 0:
        yield
        return
    faulthandler.dump_traceback_later(seconds, exit=True, file=_real_stderr(request.config))
    yield
    faulthandler.cancel_dump_traceback_later()


def _real_stderr(config) -> int:
    """The terminal's stderr while pytest captures fd 2 (its saved copy), else fd 2."""
    try:
        capture = config.pluginmanager.getplugin("capturemanager")._global_capturing
        return int(capture.err.targetfd_save)
    except (AttributeError, TypeError, ValueError):
        return 2
