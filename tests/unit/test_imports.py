"""Every entry module imports on its own in a fresh interpreter (no import cycles)."""

from __future__ import annotations

import subprocess
import sys

import pytest

ENTRY_MODULES = [
    "rmq_semantics",
    "coordinator",
    "coordinator.server",
    "coordinator.lock",
    "coordinator.kafka_txn",
    "coordinator.lock_service",
    "rmq_semantics.records.codec",
    "rmq_semantics.orderly",
    "rmq_semantics.lock_client",
    "rmq_semantics.cli",
    "spark.job",
    "rmq_semantics.tools.admin",
    "rmq_semantics.tools.demo",
    "benchmarks.runner",
    "benchmarks.orderly_child",
    "rmq_semantics.barrier",
    "rmq_semantics.barrier.postgres",
]


@pytest.mark.parametrize("module", ENTRY_MODULES)
def test_module_imports_first_in_a_fresh_interpreter(module):
    proc = subprocess.run(
        [sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_python_dash_m_coordinator_prints_its_help():
    proc = subprocess.run(
        [sys.executable, "-m", "coordinator", "--help"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and "--check-interval-ms" in proc.stdout, proc.stderr[-2000:]
