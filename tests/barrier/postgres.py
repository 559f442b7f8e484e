"""A PostgreSQL server of the test session's own: ``initdb`` in a temp dir (as the postgres
user when running as root, which initdb refuses), ``pg_ctl start`` on 127.0.0.1 and a free
port, stopped again by its pid. The binaries come from tests/barrier/postgres.sh."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import re
import select
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from rmq_semantics.embedded import free_port

__all__ = ["PostgresServer", "PostgresUnavailable"]

# initdb and a server start take a few seconds; these bound a wedged one.
INITDB_TIMEOUT_S = 120
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 30
USER = "rmq"


class PostgresUnavailable(Exception):
    """Why no server can be had here (the tests skip with it, or fail under RMQ_REQUIRE)."""


def _binary(name: str) -> str:
    def version(path: str) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", path))

    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=version)
    path = found[-1] if found else shutil.which(name)
    if path is None:
        raise PostgresUnavailable(
            f"no {name} (tests/barrier/postgres.sh ensure installs "
            f"Debian's postgresql; make setup runs it)"
        )
    return path


class PostgresServer:
    """``start()`` returns the DSN; ``stop()`` is idempotent and removes the temp dir."""

    def __init__(self) -> None:
        self.root: Path | None = None
        self.port = 0
        self.dsn = ""
        self._pid: int | None = None

    def _as_owner(self, *cmd: str) -> list[str]:
        if os.geteuid() != 0:
            return list(cmd)
        return ["runuser", "-u", "postgres", "--", *cmd]

    def _run(self, cmd: list[str], timeout_s: float, what: str) -> None:
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True, timeout=timeout_s, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PostgresUnavailable(f"{what}: {exc}") from exc
        if done.returncode != 0:
            raise PostgresUnavailable(
                f"{what} exited {done.returncode}: {(done.stderr or done.stdout).strip()[-500:]}"
            )

    def start(self) -> str:
        initdb, pg_ctl = _binary("initdb"), _binary("pg_ctl")
        self.root = Path(tempfile.mkdtemp(prefix="rmq-test-pg-"))
        if os.geteuid() == 0:
            try:
                owner = pwd.getpwnam("postgres")
            except KeyError as exc:
                raise PostgresUnavailable(
                    "running as root and there is no postgres user to run initdb as"
                ) from exc
            os.chown(self.root, owner.pw_uid, owner.pw_gid)
        data = self.root / "data"
        self._run(
            self._as_owner(
                initdb,
                "-D",
                str(data),
                "-U",
                USER,
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ),
            INITDB_TIMEOUT_S,
            "initdb",
        )
        self.port = free_port()
        # Loopback only; the socket in our own dir; durability is not what the tests test.
        options = (
            f"-h 127.0.0.1 -p {self.port} -k {self.root} -c fsync=off "
            f"-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        self._run(
            self._as_owner(
                pg_ctl,
                "-D",
                str(data),
                "-l",
                str(self.root / "server.log"),
                "-o",
                options,
                "-w",
                "-t",
                str(START_TIMEOUT_S),
                "start",
            ),
            START_TIMEOUT_S + 10,
            "pg_ctl start",
        )
        self._pid = int((data / "postmaster.pid").read_text().split()[0])
        self.dsn = f"postgresql://{USER}@127.0.0.1:{self.port}/postgres"
        return self.dsn

    def log_tail(self, lines: int = 30) -> str:
        log = self.root / "server.log" if self.root else None
        if log is None or not log.exists():
            return ""
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """Fast shutdown of our postmaster by its pid (SIGINT), SIGKILL if it lingers."""
        pid, self._pid = self._pid, None
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGINT)
                if not _exited(pid, STOP_TIMEOUT_S):
                    os.kill(pid, signal.SIGKILL)
        root, self.root = self.root, None
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)


def _exited(pid: int, timeout_s: float) -> bool:
    """Whether ``pid`` (not our child: pg_ctl daemonized it) exits within ``timeout_s``."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout_s)[0])
    finally:
        os.close(fd)
