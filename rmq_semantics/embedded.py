"""The embedded broker: a single-node Apache Kafka (KRaft) from the official jars.

The jars and the JVM come from :mod:`rmq_semantics.kafka_jars` (Maven Central, into a cache
outside the repository). The broker runs detached; its pid, ports and log live in the data
dir, so ``kafka stop`` and a later ``kafka start`` find it again and keep its data."""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from rmq_semantics.clientconf import shared_conf
from rmq_semantics.errors import EmbeddedKafkaError

# Importable from here as before the jars had a module of their own.
from rmq_semantics.kafka_jars import (
    cache_dir,
    checked_version,
    java_executable,
    kafka_classpath,
    kafka_version,
    resolve_maven_jars,
)

__all__ = [
    "EmbeddedKafka",
    "cache_dir",
    "checked_version",
    "java_executable",
    "kafka_classpath",
    "kafka_version",
    "new_cluster_id",
    "resolve_maven_jars",
]

log = logging.getLogger(__name__)

# A cold JVM plus KRaft formatting and controller election takes 5-15 s on 2 cores.
START_TIMEOUT_S = 90.0
# Controlled shutdown flushes logs and resigns leadership; a few seconds on one node.
STOP_TIMEOUT_S = 30.0
DEFAULT_PORT = 9092
DEFAULT_HEAP = "768m"


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As the JVM's server socket does: connections in TIME_WAIT do not block a restart.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours is dead for our purposes.
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def new_cluster_id() -> str:
    """16 random bytes in URL-safe base64, as StorageTool wants. Like Kafka's own
    Uuid.randomUuid, never one starting with '-': the tool would read it as an option."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def _pid_is_our_broker(pid: int, data_dir: Path) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return _pid_alive(pid)
    return "kafka.Kafka" in cmdline and str(data_dir) in cmdline


@dataclass
class EmbeddedKafka:
    """A single-node KRaft broker in ``data_dir`` listening on ``127.0.0.1:port``.

    ``sasl_users`` (user -> password) makes the bootstrap listener SASL_PLAINTEXT with the
    PLAIN mechanism for these users; the controller listener stays plaintext on loopback, and
    the broker talks to itself (transaction markers) on the SASL listener as the first user.
    ``acls`` turns on Kafka's ACL authorizer as Kafka ships it: the first SASL user is the
    only super user (the controller listener is SASL then too, so the broker's own requests
    to its controller authenticate as that user), and a resource without ACLs is closed to
    everyone else (``allow.everyone.if.no.acl.found=false``): tests grant what they need.
    The broker logs each denial in ``authorizer.log`` of the data dir.
    """

    data_dir: Path
    port: int | None = None
    heap: str = DEFAULT_HEAP
    sasl_users: dict[str, str] | None = None
    acls: bool = False
    version: str | None = None  # the Apache Kafka release; None: the pom's
    # Words put before ``java`` (e.g. a test's ``setpriv --regid N --``), each exec'ing the
    # next so the pid stays the broker's; empty by default.
    command_prefix: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir).expanduser().resolve()
        for user, password in (self.sasl_users or {}).items():
            # They are written into a quoted JAAS string of server.properties.
            if not user or not password or any(c in user + password for c in '"\\\n;='):
                raise EmbeddedKafkaError(
                    f"SASL user {user!r}: user and password must be "
                    "non-empty, without quotes, backslashes, ';', '=' "
                    "or newlines"
                )

    # -- state kept in the data dir ------------------------------------------------------
    @property
    def _state_file(self) -> Path:
        return self.data_dir / "broker.json"

    @property
    def _log_dir(self) -> Path:
        return self.data_dir / "logs"

    def _read_state(self) -> dict:
        try:
            return json.loads(self._state_file.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise EmbeddedKafkaError(
                f"{self._state_file} is corrupt ({exc}); remove it or choose another --data-dir"
            ) from exc

    def running_pid(self) -> int | None:
        pid = self._read_state().get("pid")
        if pid and _pid_alive(pid) and _pid_is_our_broker(pid, self.data_dir):
            return int(pid)
        return None

    @property
    def bootstrap(self) -> str:
        port = self.port or self._read_state().get("port") or DEFAULT_PORT
        return f"127.0.0.1:{port}"

    def client_conf(self) -> dict:
        conf = {"bootstrap.servers": self.bootstrap}
        if self.sasl_users:
            user, password = next(iter(self.sasl_users.items()))
            conf.update(
                {
                    "security.protocol": "SASL_PLAINTEXT",
                    "sasl.mechanisms": "PLAIN",
                    "sasl.username": user,
                    "sasl.password": password,
                }
            )
        return conf

    # -- start ----------------------------------------------------------------------------
    def start(self, timeout_s: float = START_TIMEOUT_S) -> str:
        """Start the broker (or find it running) and return its bootstrap address."""
        state = self._read_state()
        if self.running_pid() is not None:
            self.port = state["port"]
            return self.bootstrap
        proc = self.launch()
        try:
            self._await_ready(proc, timeout_s)
        except BaseException:
            self._kill(proc.pid)
            raise
        return self.bootstrap

    def launch(self) -> subprocess.Popen:
        """Format the data dir if new and spawn the broker, without waiting for it."""
        state = self._read_state()
        self.port = self.port or state.get("port") or DEFAULT_PORT
        if not port_free(self.port):
            raise EmbeddedKafkaError(
                f"port {self.port} on 127.0.0.1 is already in use; "
                "stop whatever listens there or pass --port"
            )
        controller_port = self._controller_port(state)
        java = java_executable()
        classpath = kafka_classpath(self.version)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        props = self._write_properties(controller_port)
        self._format_storage(java, classpath, props)

        log_file = open(self.data_dir / "broker.out", "ab")  # noqa: SIM115 - handed to the child
        log4j = resources.files("rmq_semantics") / "kafka" / "log4j2.properties"
        # G1 with Kafka's own start script's pause goal (kafka-run-class.sh): without it,
        # young pauses set the p99 of every latency (docs/design/measurements.md).
        cmd = [
            *self.command_prefix,
            java,
            f"-Xmx{self.heap}",
            f"-Xms{self.heap}",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:InitiatingHeapOccupancyPercent=35",
            "-XX:+ExplicitGCInvokesConcurrent",
            "-XX:TieredStopAtLevel=1",
            "-Djava.awt.headless=true",
            *self._jvm_extra(),
            f"-Dkafka.logs.dir={self.data_dir}",
            f"-Dlog4j2.configurationFile={log4j}",
            "-cp",
            classpath,
            "kafka.Kafka",
            str(props),
        ]
        with log_file:
            proc = subprocess.Popen(
                cmd,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._state_file.write_text(
            json.dumps({"pid": proc.pid, "port": self.port, "controller_port": controller_port})
        )
        return proc

    # Hooks a node of a multi-node cluster (rmq_semantics/kafka_cluster.py) overrides.
    def _controller_port(self, state: dict) -> int:
        controller_port = state.get("controller_port")
        if not controller_port or not port_free(controller_port):
            controller_port = free_port()
        return controller_port

    def _jvm_extra(self) -> list[str]:
        return []

    def _new_cluster_id(self) -> str:
        return new_cluster_id()

    def _write_properties(self, controller_port: int) -> Path:
        path = self.data_dir / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in self._properties(controller_port).items()))
        return path

    def _properties(self, controller_port: int) -> dict[str, str]:
        listener = "SASL_PLAINTEXT" if self.sasl_users else "PLAINTEXT"
        lines = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
            "listeners": f"{listener}://127.0.0.1:{self.port},"
            f"CONTROLLER://127.0.0.1:{controller_port}",
            "advertised.listeners": f"{listener}://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": listener,
            "listener.security.protocol.map": (
                "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT"
            ),
            "log.dirs": str(self._log_dir),
            # One node: every internal topic has replication factor 1 and min ISR 1.
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "10",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "10",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "default.replication.factor": "1",
            "min.insync.replicas": "1",
            "num.partitions": "1",
            "group.initial.rebalance.delay.ms": "0",
            # Tests shorten client session timeouts and need dead transactions aborted fast.
            "group.min.session.timeout.ms": "1000",
            # The same for groups under KIP-848 (group.protocol=consumer), whose session and
            # heartbeat the broker owns: tests' 6 s / 0.5 s instead of 45 s / 5 s.
            "group.consumer.min.session.timeout.ms": "1000",
            "group.consumer.session.timeout.ms": "6000",
            "group.consumer.min.heartbeat.interval.ms": "500",
            "group.consumer.heartbeat.interval.ms": "500",
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
            "log.flush.interval.messages": "9223372036854775807",
        }
        if self.sasl_users:
            users = " ".join(f'user_{u}="{p}"' for u, p in self.sasl_users.items())
            admin_user, admin_password = next(iter(self.sasl_users.items()))
            lines["sasl.enabled.mechanisms"] = "PLAIN"
            lines["sasl.mechanism.inter.broker.protocol"] = "PLAIN"
            lines["listener.name.sasl_plaintext.plain.sasl.jaas.config"] = (
                "org.apache.kafka.common.security.plain.PlainLoginModule required "
                f'username="{admin_user}" password="{admin_password}" {users};'
            )
            if self.acls:
                # Kafka's own default: a resource without ACLs is closed to all but the
                # super user. The controller listener authenticates as that user too, so no
                # unauthenticated (ANONYMOUS) principal needs to be a super user.
                lines["authorizer.class.name"] = (
                    "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
                )
                lines["super.users"] = f"User:{admin_user}"
                lines["allow.everyone.if.no.acl.found"] = "false"
                lines["listener.security.protocol.map"] = (
                    "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:SASL_PLAINTEXT"
                )
                lines["sasl.mechanism.controller.protocol"] = "PLAIN"
                lines["listener.name.controller.plain.sasl.jaas.config"] = lines[
                    "listener.name.sasl_plaintext.plain.sasl.jaas.config"
                ]
        return lines

    def _format_storage(self, java: str, classpath: str, props: Path) -> None:
        meta = self._log_dir / "meta.properties"
        if self._log_dir.exists() and any(self._log_dir.iterdir()):
            text = meta.read_text() if meta.exists() else ""
            if "cluster.id" not in text:
                raise EmbeddedKafkaError(
                    f"data dir {self.data_dir} is not a usable Kafka data dir "
                    f"({meta} is missing or has no cluster.id); remove it or choose "
                    "another --data-dir"
                )
            return
        cluster_id = self._new_cluster_id()
        cmd = [
            java,
            "-cp",
            classpath,
            "kafka.tools.StorageTool",
            "format",
            "-t",
            cluster_id,
            "-c",
            str(props),
            "--ignore-formatted",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            detail = (proc.stderr or proc.stdout).strip().splitlines()
            raise EmbeddedKafkaError(
                f"formatting {self._log_dir} failed: {detail[-1] if detail else proc.returncode}"
            )

    def _await_ready(self, proc: subprocess.Popen, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        admin = AdminClient(
            {**shared_conf(self.client_conf()), "socket.connection.setup.timeout.ms": 2000}
        )
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise EmbeddedKafkaError(
                    f"the broker exited with code {proc.returncode}: {self._last_error_line()}"
                )
            try:
                meta = admin.list_topics(timeout=2.0)
                if meta.brokers:
                    return
            except KafkaException:
                pass
        raise EmbeddedKafkaError(
            f"the broker did not answer a metadata request within "
            f"{timeout_s:.0f} s; see {self.data_dir / 'broker.log'}"
        )

    def _last_error_line(self) -> str:
        for name in ("broker.out", "broker.log"):
            path = self.data_dir / name
            if not path.exists():
                continue
            lines = path.read_text(errors="replace").splitlines()
            for line in reversed(lines):
                if "ERROR" in line or "Exception" in line:
                    return line.strip()[:400]
        return f"see {self.data_dir / 'broker.log'}"

    # -- stop -----------------------------------------------------------------------------
    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> bool:
        """Stop the broker gracefully (SIGTERM, then SIGKILL after ``timeout_s``).

        Returns False when no broker of this data dir was running. Idempotent.
        """
        pid = self.running_pid()
        if pid is None:
            return False
        os.kill(pid, signal.SIGTERM)
        if not self._wait_exit(pid, timeout_s):
            log.warning("broker pid %d ignored SIGTERM for %.0f s; killing it", pid, timeout_s)
            self._kill(pid)
        return True

    def kill(self) -> None:
        """SIGKILL the broker (used by tests and on failed starts)."""
        pid = self.running_pid()
        if pid is not None:
            self._kill(pid)

    def _kill(self, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        self._wait_exit(pid, 10.0)

    @staticmethod
    def _wait_exit(pid: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            if not _pid_alive(pid):
                # It may have died after a non-blocking wait: reap our zombie child now, or
                # it outlives us (re-parented to an init that reaps it whenever it likes).
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
                return True
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
