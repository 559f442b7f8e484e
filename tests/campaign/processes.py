"""The processes a campaign owns: its worker processes and coordinators, each stopped by its
own pid (never by name), each restartable with the same arguments, which is what the
nemesis acts on (``Targets``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from rmq_semantics.kafka_cluster import EmbeddedCluster
from rmq_semantics.tools.coordinator_process import CoordinatorProcess

REPO = Path(__file__).resolve().parents[2]
STOP_TIMEOUT_S = 45.0
REAP_TIMEOUT_S = 10.0


class Ended(NamedTuple):
    """One incarnation's end: its exit code, whether it was killed on purpose (``kill()``:
    the nemesis) or stopped by the harness (``stop()``), and when (time.monotonic())."""

    code: int | None
    killed: bool
    stopped: bool
    mono_s: float


def note_end(
    ended: list[Ended], code: int | None, *, killed: bool = False, stopped: bool = False
) -> None:
    ended.append(Ended(code, killed, stopped, time.monotonic()))


class WorkerProcess:
    """``python -m <module> <args>`` of this checkout, its output appended to ``log_path``.

    ``restart(env=...)`` starts it again with the same arguments (the nemesis restarts a
    killed process, or one under a skewed clock with libfaketime's variables in ``env``).
    """

    def __init__(self, name: str, module: str, args: list[str], log_path: Path, kind: str) -> None:
        self.name, self.module, self.args, self.kind = name, module, list(args), kind
        self.log_path = log_path
        self.extra_env: dict[str, str] = {}
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.exits: list[int] = []  # exit codes of earlier incarnations
        self.ended: list[Ended] = []  # how each incarnation ended (the runner's exit events)
        # Killed on purpose (the nemesis) and not restarted yet: its exit is no failure.
        self.expected_down = False

    def start(self, env: Mapping[str, str] | None = None) -> WorkerProcess:
        if env is not None:
            self.extra_env = dict(env)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"--- start {self.starts + 1} at {time.time():.3f}\n".encode())
            self.proc = subprocess.Popen(
                [sys.executable, "-m", self.module, *self.args],
                cwd=REPO,
                env={**os.environ, "PYTHONPATH": str(REPO), **self.extra_env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.starts += 1
        self.expected_down = False
        return self

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> bool:
        """Send ``sig`` to this process (by its pid); False if it is not running."""
        if not self.alive():
            return False
        assert self.proc is not None
        self.proc.send_signal(sig)
        return True

    def kill(self) -> int | None:
        """SIGKILL now, as a crash would (a paused process too)."""
        if self.proc is None:
            return None
        self.expected_down = True
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(REAP_TIMEOUT_S)
            note_end(self.ended, self.proc.returncode, killed=True)
        return self.proc.returncode

    def restart(self, env: Mapping[str, str] | None = None) -> WorkerProcess:
        if self.alive():
            self.kill()
        if self.proc is not None and self.proc.returncode is not None:
            self.exits.append(self.proc.returncode)
            if not self.expected_down:  # it had exited on its own
                note_end(self.ended, self.proc.returncode)
        return self.start(env)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGCONT (a paused process cannot act on SIGTERM), SIGTERM, then SIGKILL after
        ``timeout_s``; returns the exit code."""
        if self.proc is None:
            return None
        was_down, self.expected_down = self.expected_down, True
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(REAP_TIMEOUT_S)
            note_end(self.ended, self.proc.returncode, stopped=True)
        elif not was_down:  # it had exited on its own before the harness stopped it
            note_end(self.ended, self.proc.returncode)
        return self.proc.returncode


class Coordinator:
    """One coordinator process (``python -m coordinator``) of this checkout, restartable
    with the same instance id (which fences its predecessor)."""

    def __init__(
        self, name: str, bootstrap: str, log_path: Path, settings: dict, kafka_options: list[str]
    ) -> None:
        self.name, self.bootstrap, self.log_path = name, bootstrap, log_path
        self.settings = {**settings, "instance_id": name}
        self.args = [a for opt in kafka_options for a in ("--kafka-option", opt)]
        self.extra_env: dict[str, str] = {}
        self.process: CoordinatorProcess | None = None
        self.starts = 0
        self.exits: list[int | None] = []
        self.ended: list[Ended] = []
        self.expected_down = False

    def start(self, env: Mapping[str, str] | None = None, wait: bool = True) -> Coordinator:
        if env is not None:
            self.extra_env = dict(env)
        self.process = CoordinatorProcess(
            self.bootstrap,
            self.log_path,
            *self.args,
            settings=self.settings,
            env={"PYTHONPATH": str(REPO), **self.extra_env},
        )
        self.process.start()
        self.starts += 1
        self.expected_down = False
        if wait:
            self.process.wait_ready()
        return self

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, sig: int) -> bool:
        pid = self.pid
        if pid is None or not self.alive():
            return False
        os.kill(pid, sig)
        return True

    def kill(self) -> int | None:
        """SIGKILL now, as a crash would."""
        if self.process is None:
            return None
        self.expected_down = True
        if not self.alive():
            return self.process.poll()
        code = self.process.kill()
        note_end(self.ended, code, killed=True)
        return code

    def restart(self, env: Mapping[str, str] | None = None, wait: bool = True) -> Coordinator:
        if self.process is not None:
            if self.alive():
                self.kill()
            elif not self.expected_down:  # it had exited on its own
                note_end(self.ended, self.process.poll())
            self.exits.append(self.process.poll())
        return self.start(env, wait)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        if self.process is None:
            return None
        was_down, self.expected_down = self.expected_down, True
        if self.alive():
            self.signal(signal.SIGCONT)
            code = self.process.stop(timeout_s)
            note_end(self.ended, code, stopped=True)
            return code
        if not was_down:
            note_end(self.ended, self.process.poll())
        return self.process.poll()


@dataclass
class Targets:
    """What the nemesis acts on: the cluster's nodes (``cluster.stop(node_id, kill=True)``,
    ``cluster.start_node(node_id)``, ``cluster.node(i).pid``; a cluster the campaign was
    handed too: it must be whole again after ``heal()``), the coordinators and the
    workers (``pid``, ``signal(sig)``, ``kill()``, ``restart(env=...)``, ``alive()``;
    ``kind`` tells a worker's role)."""

    bootstrap: str
    cluster: EmbeddedCluster | None
    coordinators: list[Coordinator] = field(default_factory=list)
    producers: list[WorkerProcess] = field(default_factory=list)
    consumers: list[WorkerProcess] = field(default_factory=list)

    def workers(self) -> list[WorkerProcess]:
        return [*self.producers, *self.consumers]
