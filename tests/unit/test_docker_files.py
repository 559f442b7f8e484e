"""docker/: the compose file is valid, and every flag it gives the coordinator and the Spark
job is one the real CLI parser accepts (no broker, no Docker engine needed)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from coordinator.settings import CoordinatorSettings
from rmq_semantics.cli import build_parser
from rmq_semantics.settings import env_name, load

yaml = pytest.importorskip("yaml", reason="PyYAML is a dev dependency: pip install -e '.[dev]'")

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
COMPOSE = DOCKER / "compose.yaml"
# What an image's ENTRYPOINT means in terms of `rmq-semantics` arguments.
ENTRYPOINT_ARGV = {
    ("python", "-m", "coordinator"): ["coordinator"],
    ("rmq-semantics",): [],
    ("python", "-m", "rmq_semantics"): [],
}
_VAR = re.compile(r"\$\{(\w+)(?::?[-?]([^}]*))?\}")


def _interpolate(value: object) -> object:
    """Compose's ``${VAR:-default}`` with every variable unset (what `config` would do)."""
    if isinstance(value, str):
        return _VAR.sub(lambda m: m.group(2) or "", value)
    if isinstance(value, list):
        return [_interpolate(v) for v in value]
    if isinstance(value, dict):
        return {k: _interpolate(v) for k, v in value.items()}
    return value


@pytest.fixture(scope="module")
def compose() -> dict:
    return _interpolate(yaml.safe_load(COMPOSE.read_text()))


def _dockerfile_entrypoint(dockerfile: Path) -> list[str]:
    lines = [ln for ln in dockerfile.read_text().splitlines() if ln.startswith("ENTRYPOINT")]
    assert len(lines) == 1, f"{dockerfile} should have one ENTRYPOINT"
    entrypoint = json.loads(lines[0].removeprefix("ENTRYPOINT"))  # exec form only
    assert isinstance(entrypoint, list), f"{dockerfile}: ENTRYPOINT must be exec form"
    return entrypoint


def _cli_argv(service: dict) -> list[str]:
    entrypoint = service.get("entrypoint")
    if entrypoint is None:
        build = service["build"]
        context = (COMPOSE.parent / build["context"]).resolve()
        entrypoint = _dockerfile_entrypoint(context / build["dockerfile"])
    prefix = ENTRYPOINT_ARGV[tuple(entrypoint)]
    return [*prefix, *[str(a) for a in service["command"]]]


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def _parse(argv: list[str], capsys: pytest.CaptureFixture) -> argparse.Namespace:
    try:
        return build_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"the CLI refuses {argv}: {capsys.readouterr().err.strip()}")


@pytest.mark.parametrize("service, command", [("coordinator", "coordinator"), ("spark", "spark")])
def test_every_compose_flag_is_a_real_cli_flag(compose, service, command, capsys):
    argv = _cli_argv(compose["services"][service])
    args = _parse(argv, capsys)
    assert args.command == command
    # argparse also accepts unambiguous abbreviations; the file must spell flags in full.
    known = _subparser(command)._option_string_actions
    flags = [a.split("=")[0] for a in argv if a.startswith("--")]
    assert flags and [f for f in flags if f not in known] == []
    if command == "coordinator":
        load(CoordinatorSettings, args, env={})  # values are valid settings, not just strings


def test_coordinator_env_names_are_ones_the_coordinator_reads(compose):
    env = compose["services"]["coordinator"].get("environment", {})
    settings = {env_name(f.name) for f in dataclasses.fields(CoordinatorSettings)}
    readable = settings | {"RMQ_METRICS_PORT", "RMQ_METRICS_HOST"}
    unknown = [k for k in env if k not in readable and not k.startswith("RMQ_KAFKA_")]
    assert unknown == []
    assert int(env["RMQ_METRICS_PORT"]) > 0  # the HEALTHCHECK reads the same variable


def test_compose_runs_kafka_kraft_single_node_and_two_coordinators(compose):
    services = compose["services"]
    kafka = services["kafka"]
    assert kafka["image"] == "apache/kafka:4.4.0"  # the default stays the official image
    env = {k: str(v) for k, v in kafka["environment"].items()}
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller" and env["CLUSTER_ID"]
    for name in (
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR",
    ):
        assert env[name] == "1", name
    assert services["coordinator"]["deploy"]["replicas"] == 2
    assert "container_name" not in services["coordinator"]  # would clash with 2 replicas
    for name in ("coordinator", "spark"):
        assert services[name]["depends_on"]["kafka"]["condition"] == "service_healthy"


KAFKA_IMAGE_VARIABLE = "${RMQ_KAFKA_IMAGE:-apache/kafka:4.4.0}"


def test_one_variable_picks_the_kafka_image_of_every_service_that_runs_it():
    raw = yaml.safe_load(COMPOSE.read_text())["services"]
    kafka_services = sorted(n for n, s in raw.items() if "kafka" in s.get("image", ""))
    assert kafka_services == ["kafka", "topics"]
    assert {raw[n]["image"] for n in kafka_services} == {KAFKA_IMAGE_VARIABLE}
    # The broker advertises the host port it is published on, both from one variable.
    port = "${RMQ_KAFKA_HOST_PORT:-19092}"
    assert f"HOST://127.0.0.1:{port}" in raw["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    assert raw["kafka"]["ports"] == [f"127.0.0.1:{port}:19092"]


def test_the_kafka_tools_compose_runs_exist_in_our_kafka_image_too(compose):
    """apache/kafka has every /opt/kafka/bin tool; our image only those images.sh installs
    (kafka-tool.sh under each name), so each one the compose file runs must be among them."""
    services = compose["services"]
    used = set(
        re.findall(
            r"/opt/kafka/bin/([\w.-]+)",
            json.dumps(
                [services["kafka"]["healthcheck"]["test"], services["topics"]["entrypoint"]]
            ),
        )
    )
    assert used == {"kafka-broker-api-versions.sh", "kafka-topics.sh"}
    installed = re.search(r"for tool in ([^;]+);", (DOCKER / "images.sh").read_text())
    assert installed and used <= set(installed.group(1).split())
    launcher = (DOCKER / "kafka" / "kafka-tool.sh").read_text()
    assert all(
        re.search(rf"^\s+{re.escape(tool)}\) class=org\.apache\.kafka\.tools\.", launcher, re.M)
        for tool in used
    )
    assert (
        services["spark"]["depends_on"]["topics"]["condition"] == "service_completed_successfully"
    )


def test_coordinator_image_is_small_non_root_and_signal_friendly():
    text = (DOCKER / "Dockerfile").read_text()
    froms = re.findall(r"^FROM\s+(\S+)", text, re.M)
    defaults = dict(re.findall(r"^ARG\s+(\w+)=(\S+)", text, re.M))
    assert all(defaults.get(f.strip("${}"), f).startswith("python:3.11-slim") for f in froms)
    assert _dockerfile_entrypoint(DOCKER / "Dockerfile") == ["python", "-m", "coordinator"]
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert re.search(r"^HEALTHCHECK .*coordinator\.healthcheck", text, re.M | re.S)
    installs = " ".join(re.findall(r"^RUN .*pip install.*$", text, re.M))
    extras = re.findall(r"rmq-semantics\[([^\]]*)\]", installs)
    assert extras == ["otel"] and "pyspark" not in installs  # the SDK for its spans only


def test_spark_image_runs_the_cli_as_non_root():
    text = (DOCKER / "Dockerfile.spark").read_text()
    assert _dockerfile_entrypoint(DOCKER / "Dockerfile.spark") == ["rmq-semantics"]
    assert re.findall(r"^USER\s+(\S+)", text, re.M)[-1].split(":")[0] not in ("root", "0")
    assert "RMQ_CACHE_DIR" in text  # the Kafka source jars are baked in, not fetched at run time


def test_dockerignore_keeps_only_what_the_images_build_from():
    lines = (REPO / ".dockerignore").read_text().splitlines()
    kept = {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}
    assert {"pyproject.toml", "README.md", "rmq_semantics", "coordinator", "spark"} <= kept
    assert "*" in lines  # .venv, .git and caches stay out of the context


def _compose_cli() -> str | None:
    docker = shutil.which("docker")
    if docker is None:
        return "no docker client on PATH"
    try:
        proc = subprocess.run(
            [docker, "compose", "version"], capture_output=True, text=True, timeout=30
        )
    except subprocess.TimeoutExpired:
        return "`docker compose version` did not answer within 30 s"
    if proc.returncode != 0:
        return (
            "the docker client has no compose plugin (`docker compose version`: "
            f"{(proc.stderr or proc.stdout).strip().splitlines()[0]})"
        )
    return None


def test_docker_compose_config_accepts_the_file():
    reason = _compose_cli()
    if reason is not None:
        pytest.skip(reason)
    proc = subprocess.run(
        ["docker", "compose", "-f", str(COMPOSE), "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr


# -- monitoring: Prometheus and Grafana under a profile, the dashboard, the alert rules -------
DEFAULT_SERVICES = {"kafka", "topics", "coordinator", "spark"}
MONITORING = DOCKER / "prometheus", DOCKER / "grafana"


def test_the_default_profile_is_unchanged_and_monitoring_needs_its_profile(compose):
    services = compose["services"]
    default = {name for name, s in services.items() if not s.get("profiles")}
    assert default == DEFAULT_SERVICES  # what `up -d --wait` starts and waits for
    assert {name: s.get("profiles") for name, s in services.items() if name not in default} == {
        "prometheus": ["monitoring"],
        "grafana": ["monitoring"],
    }
    # Nothing of the default run waits on a monitoring service.
    for name in default:
        assert not set(services[name].get("depends_on", {})) & {"prometheus", "grafana"}


def test_monitoring_services_mount_files_that_exist_and_publish_on_loopback_only(compose):
    services = compose["services"]
    for name in ("prometheus", "grafana"):
        for volume in services[name]["volumes"]:
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (COMPOSE.parent / source).exists(), f"{name}: {source}"
        assert all(p.startswith("127.0.0.1:") for p in services[name]["ports"]), name
    config = yaml.safe_load((DOCKER / "prometheus" / "prometheus.yml").read_text())
    assert config["rule_files"] == ["/etc/prometheus/alerts.yml"]
    [job] = config["scrape_configs"]
    assert job["job_name"] == "rmq-coordinator"  # the job the alert rules select
    env = compose["services"]["coordinator"]["environment"]
    assert job["dns_sd_configs"][0]["port"] == int(env["RMQ_METRICS_PORT"])
    assert job["dns_sd_configs"][0]["names"] == ["coordinator"]
    prov = DOCKER / "grafana" / "provisioning"
    [source] = yaml.safe_load((prov / "datasources" / "prometheus.yml").read_text())["datasources"]
    providers = yaml.safe_load((prov / "dashboards" / "rmq-semantics.yml").read_text())
    [provider] = providers["providers"]
    dashboard_mount = next(v for v in services["grafana"]["volumes"] if "rmq-semantics.json" in v)
    assert dashboard_mount.split(":")[1].startswith(provider["options"]["path"] + "/")
    dashboard = json.loads((DOCKER / "grafana" / "rmq-semantics.json").read_text())
    assert {t["datasource"]["uid"] for p in dashboard["panels"] for t in p["targets"]} == {
        source["uid"]
    }


def _metric_names(text: str) -> set[str]:
    return set(re.findall(r"\b(rmq_[a-z_]+)", text))


def test_the_dashboard_and_the_alerts_use_only_metrics_the_coordinator_exports():
    from coordinator.metrics import CoordinatorMetrics

    exported = set()
    for family in CoordinatorMetrics().registry.collect():
        exported |= {sample.name for sample in family.samples} | {family.name}
    dashboard = json.loads((DOCKER / "grafana" / "rmq-semantics.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for wanted in (
        "promotions",
        "pending",
        "oldest pending",
        "checks",
        "discards",
        "rejected",
        "aborted",
        "latency",
        "lock",
        "timer messages scheduled",
        "timer lateness",
        "held",
        "timer discards",
    ):
        assert wanted in titles, wanted
    rules = [
        r
        for g in yaml.safe_load((DOCKER / "prometheus" / "alerts.yml").read_text())["groups"]
        for r in g["rules"]
    ]
    used = _metric_names(" ".join(exprs + [r["expr"] for r in rules]))
    assert used and used <= exported, used - exported
    assert {r["alert"] for r in rules} >= {
        "RmqPendingPastCheckHorizon",
        "RmqHalfMessagesDiscarded",
        "RmqEndRequestsRejected",
        "RmqCoordinatorDown",
        "RmqPartitionWithoutOwner",
    }
    assert all(
        r["labels"]["severity"] in ("warning", "critical") and r["annotations"]["summary"]
        for r in rules
    )
