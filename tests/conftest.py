"""Shared test settings.

The runtime is a process-wide singleton: every test module that needs it initialises it in a
module-scoped fixture and shuts it down afterwards, so modules can use different settings.
Hypothesis profiles: ``ci`` (default) and ``slow`` (``HYPOTHESIS_PROFILE=slow``).
"""

from __future__ import annotations

import os

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
