"""Helpers for tests that run the coordinator as an operator would: the real
``python -m coordinator`` process (log in a file), and its HTTP endpoints."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from tests.integration.txn_helpers import CoordinatorProcess

# A coordinator needs a few seconds to create its topics and join its group.
START_TIMEOUT_S = 60.0
HTTP_TIMEOUT_S = 5.0


def http_get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}{path}", timeout=HTTP_TIMEOUT_S
        ) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def health(coordinator: CoordinatorProcess, port: int) -> dict | None:
    """/healthz's JSON once it says ok, else None."""
    assert coordinator.poll() is None, f"coordinator exited:\n{coordinator.log}"
    try:
        status, body = http_get(port, "/healthz")
    except OSError:
        return None
    return json.loads(body) if status == 200 else None


def samples(port: int) -> dict[tuple[str, tuple], float]:
    status, body = http_get(port, "/metrics")
    assert status == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def value(metrics: dict, name: str, **labels: str) -> float:
    return metrics.get((name, tuple(sorted(labels.items()))), 0.0)
