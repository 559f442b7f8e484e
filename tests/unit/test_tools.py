"""rmq_semantics/tools: the coordinator process helper (run against a stand-in process, no
broker) and what a wheel ships, the bench not among it (test_layering checks the tools' lazy
imports)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest

from rmq_semantics.cli import BENCH_ELSEWHERE
from rmq_semantics.errors import ConfigError, RmqError
from rmq_semantics.tools.coordinator_process import CoordinatorProcess

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "rmq_semantics"


def fake(tmp_path: Path, mode: str, **settings: object) -> CoordinatorProcess:
    return CoordinatorProcess(
        "127.0.0.1:1",
        tmp_path / "coordinator.log",
        "--metrics-port",
        "0",
        settings=settings,
        module="tests.unit.fake_coordinator",
        env={"FAKE_COORDINATOR": mode, "PYTHONPATH": str(REPO)},
    )


def test_context_manager_waits_until_up_and_stops_with_sigterm(tmp_path):
    with fake(tmp_path, "obliging", check_max=5, topic_prefix="__rmqx") as coordinator:
        coordinator.require_running()
        pid = coordinator.pid
    assert coordinator.poll() == 0 and not coordinator.killed
    assert not Path(f"/proc/{pid}").exists()
    log = coordinator.log.splitlines()
    assert log[0] == (
        "args: --bootstrap-servers 127.0.0.1:1 --metrics-port 0 --check-max 5 --topic-prefix __rmqx"
    )
    assert log[-1] == "coordinator stopped"


def test_stop_is_idempotent_and_safe_before_start(tmp_path):
    coordinator = fake(tmp_path, "obliging")
    assert coordinator.stop() is None
    coordinator.start()
    coordinator.start()  # a second start is a no-op, not a second process
    coordinator.wait_ready()
    assert coordinator.stop() == 0
    assert coordinator.stop() == 0
    assert coordinator.log.count("transaction service fake-1 running") == 1


def test_sigkill_after_the_stop_timeout_when_sigterm_is_ignored(tmp_path):
    coordinator = fake(tmp_path, "stubborn").start()
    coordinator.wait_ready()
    assert coordinator.stop(timeout_s=0.5) == -9
    assert coordinator.killed


def test_exit_before_up_raises_naming_the_log(tmp_path):
    coordinator = fake(tmp_path, "failing")
    with pytest.raises(RmqError, match=r"exited \(code 1\).*coordinator\.log"), coordinator:
        pass
    assert "broker unreachable" in coordinator.log
    with pytest.raises(RmqError, match="exited"):
        coordinator.require_running()


def test_a_restart_appends_to_the_same_log(tmp_path):
    with fake(tmp_path, "obliging"):
        pass
    with fake(tmp_path, "obliging") as second:
        pass
    assert second.log.count("coordinator stopped") == 2


def test_unknown_or_invalid_settings_are_refused_before_starting(tmp_path):
    with pytest.raises(ConfigError, match="check_max_ms"):
        fake(tmp_path, "obliging", check_max_ms=5)
    with pytest.raises(ConfigError, match="check_max"):
        fake(tmp_path, "obliging", check_max=0)
    assert not (tmp_path / "coordinator.log").exists()


def test_every_data_file_of_the_package_ships_in_the_wheel():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["rmq_semantics"]
    data = [p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.avsc")]
    assert "tools/demo_order.avsc" in data
    assert [f for f in data if not any(fnmatch(f, pattern) for pattern in patterns)] == []
    assert "rmq_semantics*" in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    assert (PACKAGE / "tools" / "__init__.py").exists()


@pytest.mark.filterwarnings("ignore::UserWarning")  # setuptools: pyproject config is "beta"
def test_the_wheel_leaves_the_bench_out(monkeypatch):
    """setuptools' own package list, from pyproject.toml as a build reads it."""
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    monkeypatch.chdir(REPO)
    packages = apply_configuration(Distribution(), REPO / "pyproject.toml").packages or []
    assert {"rmq_semantics", "rmq_semantics.tools", "coordinator", "spark"} <= set(packages)
    assert [p for p in packages if p.split(".")[0] == "benchmarks"] == []
    assert (REPO / "benchmarks" / "runner.py").exists()


def test_an_installed_copy_says_in_one_line_to_run_the_bench_from_a_checkout(tmp_path):
    """The shipped packages alone (as a wheel installs them): every documented bench command
    fails with one line naming `make bench`; the other subcommands are still there."""
    for package in ("rmq_semantics", "coordinator", "spark"):
        shutil.copytree(REPO / package, tmp_path / package)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    cli = [sys.executable, "-m", "rmq_semantics"]
    for args in (
        ["bench", "--out", "bench/results.json"],
        ["bench", "--render", "--out", "bench/results.json", "--page", "docs/benchmarks.md"],
        ["bench", "--help"],
    ):
        proc = subprocess.run(
            [*cli, *args], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env
        )
        assert (proc.returncode, proc.stdout) == (2, ""), args
        assert proc.stderr == f"rmq-semantics: error: {BENCH_ELSEWHERE}\n", args
    proc = subprocess.run(
        [*cli, "--help"], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env
    )
    assert proc.returncode == 0 and "bench" in proc.stdout and "demo" in proc.stdout
