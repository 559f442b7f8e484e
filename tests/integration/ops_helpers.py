"""Helpers for tests that run the coordinator as an operator would: the real
``python -m coordinator`` process (log in a file), and its HTTP endpoints."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.integration.txn_helpers import FAST, REPO

# A coordinator needs a few seconds to create its topics and join its group.
START_TIMEOUT_S = 60.0
# SIGTERM lets the Kafka transaction in progress finish, then leaves the group.
STOP_TIMEOUT_S = 60.0
HTTP_TIMEOUT_S = 5.0


class CoordinatorProcess:
    """``python -m coordinator`` in a subprocess, its log in a file."""

    def __init__(self, bootstrap: str, log_path: Path, *args: str,
                 env: dict[str, str] | None = None, **settings: object) -> None:
        argv = [sys.executable, "-m", "coordinator", "--bootstrap-servers", bootstrap, *args]
        for key, value in {**FAST, **settings}.items():
            argv += [f"--{key.replace('_', '-')}", str(value)]
        self.log_path = log_path
        self._log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})

    @property
    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(f"coordinator ignored SIGTERM for {timeout_s:.0f} s:\n"
                                 f"{self.log}") from None
        finally:
            self._log.close()


def http_get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}",
                                    timeout=HTTP_TIMEOUT_S) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def health(coordinator: CoordinatorProcess, port: int) -> dict | None:
    """/healthz's JSON once it says ok, else None."""
    assert coordinator.proc.poll() is None, f"coordinator exited:\n{coordinator.log}"
    try:
        status, body = http_get(port, "/healthz")
    except OSError:
        return None
    return json.loads(body) if status == 200 else None


def samples(port: int) -> dict[tuple[str, tuple], float]:
    status, body = http_get(port, "/metrics")
    assert status == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body.decode())
            for s in family.samples}


def value(metrics: dict, name: str, **labels: str) -> float:
    return metrics.get((name, tuple(sorted(labels.items()))), 0.0)
