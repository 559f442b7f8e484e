"""``python -m coordinator`` as a child process: the one way demo, bench and the tests run it.

The child's output is copied line by line into a log file by a reader thread, which also
sets an event when the coordinator logs that it is up, so starting waits on that event
rather than sleeping. Stopping is SIGTERM (the coordinator finishes the Kafka transaction in
progress), then SIGKILL after a timeout; it is idempotent.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from rmq_semantics.errors import RmqError, RmqTimeoutError
from rmq_semantics.settings import flag_name

__all__ = ["CoordinatorProcess"]

log = logging.getLogger(__name__)

# The coordinator gives up creating its topics after 120 s (txn_service.STARTUP_DEADLINE_S).
START_TIMEOUT_S = 120.0
# SIGTERM lets the Kafka transaction in progress finish, which takes well under this.
STOP_TIMEOUT_S = 60.0
# After SIGKILL, or after the child closed its output, the exit status is a moment away.
REAP_TIMEOUT_S = 10.0
# What the transaction service logs once it has subscribed (coordinator/txn_service.py).
READY_LINE = re.compile(rb"transaction service \S+ running")


# Lines of the child's log quoted when it exited unexpectedly (its last words).
EXIT_LOG_LINES = 12


class CoordinatorProcess:
    """One coordinator child process, its log in ``log_path`` (appended to, so a restart
    with the same path keeps the history).

    ``settings`` are :class:`coordinator.settings.CoordinatorSettings` fields, passed as their
    CLI flags; ``args`` are further CLI arguments (``--kafka-option``, ``--metrics-port``);
    ``env`` adds to this process's environment. As a context manager it starts, waits until
    the coordinator is up, and stops it on exit.
    """

    def __init__(
        self,
        bootstrap: str,
        log_path: Path | str | None = None,
        *args: str,
        settings: Mapping[str, object] | None = None,
        env: Mapping[str, str] | None = None,
        module: str = "coordinator",
    ) -> None:
        settings = dict(settings or {})
        _validate(settings)
        self.argv = [sys.executable, "-m", module, "--bootstrap-servers", bootstrap, *args]
        for name, value in settings.items():
            self.argv += [flag_name(name), str(value)]
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix="rmq-coordinator-", suffix=".log")
            os.close(fd)
        self.log_path = Path(log_path)
        self.env = {**os.environ, **(env or {})}
        self.killed = False  # whether stop() had to use SIGKILL
        self._proc: subprocess.Popen | None = None
        self._pump: threading.Thread | None = None
        self._up = threading.Event()
        self._settled = threading.Event()  # up, or the child closed its output (exited)
        self._lock = threading.Lock()

    # -- life cycle ---------------------------------------------------------------------------
    def start(self) -> CoordinatorProcess:
        """Start the child (once; later calls do nothing) without waiting for it."""
        with self._lock:
            if self._proc is not None:
                return self
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._proc = subprocess.Popen(
                self.argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed by the pump thread
            self._pump = threading.Thread(
                target=self._copy_output,
                args=(self._proc.stdout, log_file),
                name=f"coordinator-{self._proc.pid}-log",
                daemon=True,
            )
            self._pump.start()
            log.info("coordinator started (pid %d), log in %s", self._proc.pid, self.log_path)
            return self

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Block until the coordinator is up; raise if it exits or times out first."""
        if self._proc is None:
            raise RmqError("the coordinator process was never started")
        if not self._settled.wait(timeout_s):
            raise RmqTimeoutError(
                f"the coordinator was not up within {timeout_s:.0f} s; see {self.log_path}"
            )
        if not self._up.is_set():
            self._raise_exited()

    def require_running(self) -> None:
        """Raise (naming the log) if the coordinator has exited."""
        if self._proc is None:
            raise RmqError("the coordinator process was never started")
        if self._proc.poll() is not None:
            self._raise_exited()

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM, then SIGKILL if it has not exited within ``timeout_s``. Idempotent;
        returns the exit code (None if it was never started)."""
        with self._lock:
            proc = self._proc
            if proc is None:
                return None
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    log.warning(
                        "coordinator (pid %d) ignored SIGTERM for %.0f s: killing it",
                        proc.pid,
                        timeout_s,
                    )
                    self.killed = True
                    proc.kill()
                    proc.wait(REAP_TIMEOUT_S)
            self._join_pump()
            return proc.returncode

    def kill(self) -> int | None:
        """SIGKILL at once, as a crash would. Returns the exit code."""
        with self._lock:
            if self._proc is None:
                return None
            if self._proc.poll() is None:
                self._proc.kill()
                self._proc.wait(REAP_TIMEOUT_S)
            self._join_pump()
            return self._proc.returncode

    def __enter__(self) -> CoordinatorProcess:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- state ----------------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def poll(self) -> int | None:
        """The exit code once exited, else None (also before start)."""
        return None if self._proc is None else self._proc.poll()

    def wait(self, timeout_s: float) -> int:
        """Wait for the child to exit on its own; raises ``subprocess.TimeoutExpired``."""
        if self._proc is None:
            raise RmqError("the coordinator process was never started")
        return self._proc.wait(timeout_s)

    @property
    def log(self) -> str:
        """The log so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    # -- internals ------------------------------------------------------------------------------
    def _copy_output(self, output: IO[bytes], log_file: IO[bytes]) -> None:
        with output, log_file:
            for line in output:
                log_file.write(line)
                log_file.flush()
                if not self._up.is_set() and READY_LINE.search(line):
                    self._up.set()
                    self._settled.set()
        self._settled.set()

    def _join_pump(self) -> None:
        # The child has exited, so its output ends and the thread finishes at once.
        if self._pump is not None:
            self._pump.join(REAP_TIMEOUT_S)

    def _raise_exited(self) -> None:
        try:
            code = self._proc.wait(REAP_TIMEOUT_S) if self._proc is not None else None
        except subprocess.TimeoutExpired:
            code = None
        last = self.log.splitlines()[-EXIT_LOG_LINES:]
        raise RmqError(
            f"the coordinator exited (code {code}); see {self.log_path}; it ended "
            "with:\n" + "\n".join(last)
        )


def _validate(settings: dict[str, object]) -> None:
    """Refuse unknown or invalid settings here rather than in the child's log."""
    from coordinator.settings import CoordinatorSettings
    from rmq_semantics.settings import load

    load(CoordinatorSettings, {k: str(v) for k, v in settings.items()}, env={})
