"""Shared setup for the conformance suite (peer test suites translated onto ``runtime``).

Every test gets a fresh runtime: ``init`` is cheap (tens of microseconds), so each test starts
from 4 devices of 256 MiB with device 0 current and the options at their defaults, and ends
with ``shutdown``. The hypothesis profiles of ``tests/conftest.py`` apply here too.
"""

from __future__ import annotations

import pytest
from _support import WAIT

import runtime

DEVICES = 4
MEMORY = "256MiB"


def fresh_init() -> None:
    """(Re)initialise with the suite's configuration and device 0 current."""
    runtime.init(device_count=DEVICES, memory=MEMORY)
    runtime.set_device(0)


@pytest.fixture(autouse=True)
def rt():
    """A fresh runtime per test; options restored afterwards."""
    runtime.shutdown()
    options = {name: runtime.get_option(name) for name in runtime.option_names()}
    fresh_init()
    yield runtime
    try:
        runtime.shutdown()
    finally:
        for name, value in options.items():
            runtime.set_option(name, value)


@pytest.fixture
def stream():
    """A user stream on device 0, synchronised (and its capture ended) at teardown."""
    s = runtime.Stream(0)
    yield s
    if runtime.is_initialized():
        if s.is_capturing:
            s.end_capture()
        s.synchronize(timeout=WAIT)
