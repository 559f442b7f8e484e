"""A Prometheus server of the test session's own (Debian's /usr/bin/prometheus, installed by
tests/monitoring/prometheus.sh): a temp data dir, 127.0.0.1 on a free port, a generated
prometheus.yml scraping the given targets every second and evaluating the given rule files
every second. Stopped by its pid."""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from rmq_semantics.embedded import free_port

__all__ = ["PrometheusServer", "PrometheusUnavailable", "binaries"]

START_TIMEOUT_S = 30.0  # to /-/ready; it takes ~1 s here
STOP_TIMEOUT_S = 15.0  # SIGTERM: it flushes its head block first
JOB = "rmq-coordinator"  # the job name docker/prometheus/alerts.yml selects


class PrometheusUnavailable(Exception):
    """No prometheus/promtool binaries on this machine."""


def binaries() -> tuple[str, str]:
    """Paths of prometheus and promtool, or PrometheusUnavailable naming the set-up step."""
    found = shutil.which("prometheus"), shutil.which("promtool")
    if None in found:
        raise PrometheusUnavailable(
            "prometheus/promtool not installed (make setup runs "
            "tests/monitoring/prometheus.sh ensure: Debian's prometheus, as root with apt-get)"
        )
    return found  # type: ignore[return-value]


class PrometheusServer:
    """``start()`` it, scrape ``targets`` (host:port on 127.0.0.1) as job ``rmq-coordinator``;
    ``url`` is its HTTP API; ``stop()`` is idempotent."""

    def __init__(self, targets: list[str], rule_files: list[Path]) -> None:
        self.binary = binaries()[0]
        self.dir = Path(tempfile.mkdtemp(prefix="rmq-test-prometheus-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        rules = "".join(f"  - {path}\n" for path in rule_files)
        (self.dir / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
            f"rule_files:\n{rules}"
            f"scrape_configs:\n  - job_name: {JOB}\n    static_configs:\n"
            f"      - targets: [{', '.join(targets)}]\n"
        )
        self.log_path = self.dir / "prometheus.log"
        self._proc: subprocess.Popen | None = None

    def start(self) -> PrometheusServer:
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={self.dir / 'prometheus.yml'}",
                    f"--storage.tsdb.path={self.dir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--storage.tsdb.retention.time=1d",
                    "--web.enable-lifecycle",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"prometheus exited ({self._proc.returncode}):\n{self.log}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"prometheus not ready within {START_TIMEOUT_S:.0f} s:\n{self.log}")

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)
