"""A local Spark standalone cluster (one master, N workers) from PySpark's own launcher.

The pip package of PySpark has no ``start-master.sh``, but it ships ``bin/spark-class``, which
is what those scripts run: ``spark-class org.apache.spark.deploy.master.Master`` and
``...worker.Worker``. Each process is ours (started here, stopped by pid), binds 127.0.0.1 and
logs to the work directory. Used by the cluster suite and by anyone who wants the job on
``--master spark://127.0.0.1:PORT`` without installing Spark.

    with StandaloneCluster(work_dir, workers=2) as cluster:
        run_job(JobSettings(..., spark_master=cluster.master_url))
        cluster.kill_worker(0)   # SIGKILL, as a crash would
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rmq_semantics.embedded import free_port
from rmq_semantics.errors import RmqError, RmqTimeoutError
from rmq_semantics.kafka_jars import java_executable

__all__ = ["StandaloneCluster"]

START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 20.0
WORKER_MEMORY = "1g"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
# The lines each process logs once it serves (Spark 3.x and 4.x).
MASTER_UP = "I have been elected leader"
WORKER_UP = "Successfully registered with master"


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


class StandaloneCluster:
    """One Spark master and ``workers`` workers of ``cores`` cores each, on 127.0.0.1."""

    def __init__(self, work_dir: Path | str, workers: int = 2, cores: int = 1) -> None:
        self.work_dir = Path(work_dir)
        self.workers = workers
        self.cores = cores
        self.port = free_port()
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self._master: subprocess.Popen | None = None
        self._workers: list[subprocess.Popen] = []

    # -- life cycle ---------------------------------------------------------------------------
    def start(self, timeout_s: float = START_TIMEOUT_S) -> str:
        """Start the master, then the workers; return the master URL once all serve."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + timeout_s
        self._master = self._launch(
            "master",
            MASTER_CLASS,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--webui-port",
            str(free_port()),
        )
        self._await_line(self._master, "master", MASTER_UP, deadline)
        for i in range(self.workers):
            worker = self._launch(
                f"worker-{i}",
                WORKER_CLASS,
                "--host",
                "127.0.0.1",
                "--cores",
                str(self.cores),
                "--memory",
                WORKER_MEMORY,
                "--webui-port",
                str(free_port()),
                "--work-dir",
                str(self.work_dir / f"worker-{i}"),
                self.master_url,
            )
            self._workers.append(worker)
        for i, worker in enumerate(self._workers):
            self._await_line(worker, f"worker-{i}", WORKER_UP, deadline)
        return self.master_url

    def kill_worker(self, index: int) -> None:
        """SIGKILL worker ``index`` (and its executors, children of its process group)."""
        worker = self._workers[index]
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(STOP_TIMEOUT_S)

    def stop(self) -> None:
        """Workers first, then the master: SIGTERM, SIGKILL after STOP_TIMEOUT_S. Idempotent."""
        for proc in [*self._workers, self._master]:
            if proc is None or proc.poll() is not None:
                continue
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(STOP_TIMEOUT_S)

    def __enter__(self) -> StandaloneCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals ----------------------------------------------------------------------------
    def _log(self, name: str) -> Path:
        return self.work_dir / f"{name}.log"

    def _launch(self, name: str, main_class: str, *args: str) -> subprocess.Popen:
        home = _spark_home()
        java = Path(java_executable())
        env = {
            **os.environ,
            "SPARK_HOME": str(home),
            "JAVA_HOME": str(java.parent.parent),
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(self.work_dir),
        }
        with open(self._log(name), "ab") as log:  # the child keeps its own descriptor
            # A session of its own: a kill reaches the executors the worker forked too.
            return subprocess.Popen(
                [str(home / "bin" / "spark-class"), main_class, *args],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _await_line(self, proc: subprocess.Popen, name: str, line: str, deadline: float) -> None:
        log = self._log(name)
        while line not in log.read_text(errors="replace"):
            if proc.poll() is not None:
                raise RmqError(f"spark {name} exited with {proc.returncode}; see {log}")
            if time.monotonic() > deadline:
                raise RmqTimeoutError(f"spark {name} did not start in time; see {log}")
            time.sleep(0.2)
