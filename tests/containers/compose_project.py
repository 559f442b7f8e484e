"""One ``docker compose`` project of ``docker/compose.yaml`` for the compose test: a unique
project name, an override file, the variables the file reads, and ``down -v`` on leaving
(also when the test fails or ``up`` never finished)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker" / "compose.yaml"
# `up --wait`: Kafka's healthcheck, then both coordinators' (start period 60 s, checks every
# 15 s) on two cores shared with the Spark container.
UP_TIMEOUT_S = 420
DOWN_TIMEOUT_S = 180
COMMAND_TIMEOUT_S = 60


class ComposeProject:
    def __init__(self, name: str, override: Path, env: dict[str, str]) -> None:
        self.name = name
        self.base = ["docker", "compose", "-p", name, "-f", str(COMPOSE_FILE), "-f", str(override)]
        self.env = {**os.environ, **env}

    def run(
        self, *args: str, timeout_s: float = COMMAND_TIMEOUT_S, check: bool = True
    ) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [*self.base, *args], env=self.env, capture_output=True, text=True, timeout=timeout_s
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"docker compose {' '.join(args)} exited {proc.returncode}:\n"
                f"{(proc.stderr or proc.stdout)[-3000:]}"
            )
        return proc

    def __enter__(self) -> ComposeProject:
        return self

    def __exit__(self, *exc: object) -> None:
        # -v: the named Kafka volume goes too; bind mounts stay for the test to read.
        with contextlib.suppress(Exception):
            self.run(
                "down",
                "-v",
                "--remove-orphans",
                "--timeout",
                "60",
                timeout_s=DOWN_TIMEOUT_S,
                check=False,
            )

    def up(self) -> None:
        """Start every service; return once Kafka and both coordinators report healthy."""
        self.run(
            "up",
            "-d",
            "--no-build",
            "--wait",
            "--wait-timeout",
            str(UP_TIMEOUT_S),
            timeout_s=UP_TIMEOUT_S + 60,
        )

    def containers(self, service: str) -> list[str]:
        return sorted(self.run("ps", "-q", service).stdout.split())

    def logs(self, tail: int = 60) -> str:
        return self.run("logs", "--no-color", "--tail", str(tail), check=False).stdout


def docker_inspect(container: str, template: str) -> str:
    proc = subprocess.run(
        ["docker", "inspect", "-f", template, container],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def docker_kill(container: str) -> None:
    proc = subprocess.run(
        ["docker", "kill", container], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
    )
    assert proc.returncode == 0, proc.stderr
