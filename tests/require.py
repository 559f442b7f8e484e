"""``RMQ_REQUIRE``: a comma list of components whose absence fails the run instead of
skipping it (CI sets it), e.g. ``RMQ_REQUIRE=docker`` or ``RMQ_REQUIRE=postgres,prometheus``."""

from __future__ import annotations

import os

import pytest

__all__ = ["missing", "required"]


def required(component: str) -> bool:
    return component in {part.strip() for part in os.environ.get("RMQ_REQUIRE", "").split(",")}


def missing(component: str, why: str) -> None:
    """Skip the test for a missing component, or fail it when RMQ_REQUIRE names it."""
    if required(component):
        pytest.fail(f"RMQ_REQUIRE={component}: {why}", pytrace=False)
    pytest.skip(why)
