"""Hypothesis settings profiles, chosen by ``HYPOTHESIS_PROFILE`` (default ``ci``).

``ci`` (``make test``): derandomized, so every run explores the same histories and a CI
failure replays locally; bounded so the model tests stay within half a minute. ``campaign``
(``make model``, ``make campaign``): random, many more and longer histories; a failure
prints the blob that reproduces it (``@reproduce_failure``).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

PROFILE_ENV = "HYPOTHESIS_PROFILE"

settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=200,
    stateful_step_count=50,
    print_blob=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "campaign",
    derandomize=False,
    database=None,
    deadline=None,
    max_examples=1000,
    stateful_step_count=100,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def load() -> str:
    """Load the profile ``HYPOTHESIS_PROFILE`` names (``ci`` when unset); returns its name."""
    name = os.environ.get(PROFILE_ENV, "ci")
    settings.load_profile(name)
    return name
