"""The dashboard and the alert rules against a real Prometheus scraping a real coordinator
under traffic (conftest.py: ``monitored_run``): every panel's query moved during the run,
the alerts for what the run provoked fire, the others stay quiet, and the rule file passes
``promtool check rules``."""

from __future__ import annotations

import json
import math
import subprocess
import urllib.request

import pytest
import yaml

from rmq_semantics.tools.dashboard_plots import panels, query, query_range
from tests.integration.txn_helpers import wait_for
from tests.monitoring.conftest import ALERTS, DASHBOARD

pytestmark = pytest.mark.integration

PANELS = panels(json.loads(DASHBOARD.read_text()))
RULES = {
    rule["alert"]: rule
    for group in yaml.safe_load(ALERTS.read_text())["groups"]
    for rule in group["rules"]
}
# What the run provokes on purpose: a discard (check_max, too_large) and a forged request.
MUST_FIRE = {"RmqHalfMessagesDiscarded", "RmqEndRequestsRejected"}
QUIET = sorted(set(RULES) - MUST_FIRE)


def test_promtool_accepts_the_alert_rules(prometheus_binaries):
    promtool = prometheus_binaries[1]
    proc = subprocess.run(
        [promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(RULES)} rules found" in proc.stdout


@pytest.mark.parametrize("panel", PANELS, ids=[p.title for p in PANELS])
def test_every_query_of_the_panel_moved_during_the_run(monitored_run, panel):
    """Each query gives a positive value at some point of the window: a rate or an increase
    above 0, a gauge above 0 (a series that merely exists at 0 does not count)."""
    url = monitored_run.prometheus.url
    for target in panel.targets:
        series = query_range(url, target.expr, monitored_run.start, monitored_run.end, 1)
        peak = max((v for s in series for _, v in s.points if math.isfinite(v)), default=0.0)
        assert peak > 0, f"{panel.title}: {target.expr} never above 0 ({len(series)} series)"


def test_every_rule_evaluates_without_error(monitored_run):
    data = json.loads(_get(monitored_run.prometheus.url + "/api/v1/rules"))["data"]
    rules = {r["name"]: r for g in data["groups"] for r in g["rules"]}
    assert set(rules) == set(RULES)
    assert {name: r["health"] for name, r in rules.items()} == dict.fromkeys(RULES, "ok")


@pytest.mark.parametrize("alert", sorted(MUST_FIRE))
def test_the_alerts_for_what_the_run_provoked_fire(monitored_run, alert):
    url = monitored_run.prometheus.url
    assert query(url, RULES[alert]["expr"]), f"{alert}: its expression is empty"
    wait_for(
        lambda: query(url, f'ALERTS{{alertname="{alert}", alertstate="firing"}}'),
        15,
        f"{alert} to fire",
    )


@pytest.mark.parametrize("alert", QUIET)
def test_the_other_alerts_stay_quiet(monitored_run, alert):
    """Not firing, not even pending, at any point of the run; and the condition itself is
    false at its end (so a ``for:`` clause is not what kept it quiet)."""
    url = monitored_run.prometheus.url
    seen = query_range(
        url, f'ALERTS{{alertname="{alert}"}}', monitored_run.start, monitored_run.end, 1
    )
    assert [s.labels for s in seen] == []
    assert query(url, RULES[alert]["expr"], at=monitored_run.end) == []


def test_a_stopped_coordinator_trips_the_down_alert(monitored_run):
    """Last in this module: it ends the coordinator."""
    url = monitored_run.prometheus.url
    assert monitored_run.coordinator.stop() == 0
    wait_for(
        lambda: query(url, RULES["RmqCoordinatorDown"]["expr"]),
        15,
        "the RmqCoordinatorDown condition after the coordinator stopped",
    )
    wait_for(
        lambda: query(url, 'ALERTS{alertname="RmqCoordinatorDown"}'),
        15,
        "RmqCoordinatorDown to be pending",
    )


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()
