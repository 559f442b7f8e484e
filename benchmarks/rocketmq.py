"""The ``rocketmq`` case: Apache RocketMQ 5.5.0 on this machine, in the same bench run, so the
product's figures are compared with RocketMQ's taken beside them (issue 34).

Each run starts a name server and one broker of its own (the jars of
``benchmarks/rocketmq/pom.xml``, resolved once from Maven Central into the cache) on free
ports of 127.0.0.1 in a network namespace of its own with only loopback up (the broker's HA
port binds every address), with a fresh store in the run's work dir, and runs
``benchmarks/rocketmq/TxBench.java`` (compiled on first use) twice against them: ``tput-tx``,
32 threads each calling ``sendMessageInTransaction`` in a loop (1 KiB, 8 queues, the local
transaction always COMMIT), the shape of the ``threads`` case's 32-thread row; and
``latency``, commit → visible at the ``latency`` case's offered rate and thread count. Then
it stops both processes by pid and removes the store. Parsing TxBench's output is pure
(:func:`parse_result`, :func:`read_samples`, :func:`run_figures`)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from benchmarks.common import BenchSettings
from rmq_semantics.embedded import free_port
from rmq_semantics.errors import EmbeddedKafkaError, RmqError
from rmq_semantics.kafka_jars import cache_dir, java_executable, resolve_maven_jars

__all__ = [
    "COMPARED_THREADS",
    "LoopbackNamespace",
    "RocketMQBenchError",
    "RocketMQServers",
    "Toolchain",
    "bench_rocketmq",
    "parse_result",
    "prepare_rocketmq",
    "read_samples",
    "rocketmq_version",
    "run_figures",
]

log = logging.getLogger(__name__)

#: The pom, TxBench.java and the two servers' configs.
HERE = Path(__file__).resolve().parent / "rocketmq"
#: The threads case's row the comparison is about (issue 34's goal: 32 threads, >= 1.0x).
COMPARED_THREADS = 32
QUEUES = 8
# Seconds TxBench sends before its window opens (connections, routes, the JIT), per mode.
WARM_UP_S = 5
# The broker boots in 5-10 s on a quiet machine; on 2 busy cores it has taken 40.
BOOT_TIMEOUT_S = 120.0
# A JVM that ignores SIGTERM this long is killed.
STOP_TIMEOUT_S = 30.0
COMPILE_TIMEOUT_S = 300.0
# Making the servers' network namespace and bringing its loopback up.
NAMESPACE_TIMEOUT_S = 10.0
# Beyond TxBench's own warm-up and window: the consumer's rebalance (at most 30 s) and the
# drain of what was sent (at most 30 s), plus the JVM's start.
TXBENCH_SLACK_S = 120.0

# The JVM options of RocketMQ's own start scripts (runserver.sh / runbroker.sh), smaller heaps.
NAMESRV_OPTS = ("-server", "-Xms256m", "-Xmx256m", "-XX:+UseG1GC", "-XX:-OmitStackTraceInFastThrow")
BROKER_OPTS = (
    "-server",
    "-Xms512m",
    "-Xmx512m",
    "-XX:+UseG1GC",
    "-XX:G1HeapRegionSize=16m",
    "-XX:G1ReservePercent=25",
    "-XX:InitiatingHeapOccupancyPercent=30",
    "-XX:SoftRefLRUPolicyMSPerMB=0",
    "-XX:-OmitStackTraceInFastThrow",
    "-XX:+AlwaysPreTouch",
    "-XX:MaxDirectMemorySize=1g",
)
CLIENT_OPTS = (
    "-Xms1g",
    "-Xmx1g",
    "-XX:+UseG1GC",
    # Logback's status lines of RocketMQ's shaded logger would fill the client's output.
    "-Dlogback.statusListenerClass="
    "org.apache.rocketmq.logging.ch.qos.logback.core.status.NopStatusListener",
)
NAMESRV_MAIN = "org.apache.rocketmq.namesrv.NamesrvStartup"
BROKER_MAIN = "org.apache.rocketmq.broker.BrokerStartup"
BOOTED = "boot success"


class RocketMQBenchError(RmqError, RuntimeError):
    """The rocketmq case could not get its tools or jars, start RocketMQ, or run TxBench."""

    code = "bench_rocketmq"


# -- TxBench's output (pure) ----------------------------------------------------------------
def parse_result(output: str, mode: str) -> dict[str, float]:
    """The ``RESULT mode=<mode> key=value ...`` line of TxBench's ``output`` as numbers (the
    last such line); keys whose value is not a number are left out."""
    found: dict[str, float] | None = None
    for line in output.splitlines():
        fields = line.split()
        if not fields or fields[0] != "RESULT" or f"mode={mode}" not in fields[1:]:
            continue
        found = {}
        for field in fields[1:]:
            key, sep, value = field.partition("=")
            if not sep or key == "mode":
                continue
            with contextlib.suppress(ValueError):
                found[key] = float(value)
    if found is None:
        tail = " | ".join(output.strip().splitlines()[-3:]) or "no output"
        raise RocketMQBenchError(f"TxBench {mode} printed no RESULT line ({tail})")
    return found


def read_samples(text: str) -> list[float]:
    """The latencies (ms) TxBench's ``latency`` mode wrote with ``samples=PATH``."""
    return [float(line) for line in text.split() if line]


def run_figures(
    tput: dict[str, float], latency: dict[str, float], samples: list[float], s: BenchSettings
) -> dict[str, Any]:
    """One run's figures from TxBench's ``tput-tx`` and ``latency`` results."""
    return {
        "rocketmq_txn_per_s": tput["send_per_s"],
        "rocketmq_consumed_per_s": tput["recv_per_s"],
        "rocketmq_call_ms": {"p50": tput["rt_p50_ms"], "p99": tput["rt_p99_ms"]},
        "rocketmq_commit_to_visible_ms": {
            "samples": samples,
            "offered_msgs_per_s": s.rate,
            "achieved_msgs_per_s": latency["achieved"],
            "threads": s.latency_threads,
        },
    }


# -- tools and jars -------------------------------------------------------------------------
@dataclass(frozen=True)
class Toolchain:
    """The JVM and the class path (TxBench's classes and RocketMQ's jars) the case runs."""

    java: str
    libs: Path
    classes: Path

    @property
    def classpath(self) -> str:
        return f"{self.classes}{os.pathsep}{self.libs / '*'}"


def rocketmq_version() -> str:
    """The RocketMQ release ``benchmarks/rocketmq/pom.xml`` pins."""
    match = re.search(
        r"<rocketmq\.version>([^<]+)</rocketmq\.version>", (HERE / "pom.xml").read_text()
    )
    if not match:
        raise RocketMQBenchError(f"{HERE / 'pom.xml'} does not pin <rocketmq.version>")
    return match.group(1)


def _javac(java: str) -> str:
    beside = Path(java).resolve().parent / "javac"
    javac = str(beside) if beside.is_file() else shutil.which("javac")
    if javac is None:
        raise RocketMQBenchError(
            "the rocketmq case needs a JDK to compile TxBench.java, but there is no 'javac' "
            f"beside {java} or on PATH (apt-get install openjdk-17-jdk-headless)"
        )
    return javac


def _compiled(javac: str, libs: Path) -> Path:
    """TxBench's classes, compiled once per version of its source."""
    source = HERE / "TxBench.java"
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    target = libs.parent / f"txbench-{digest}"
    if (target / "TxBench.class").is_file():
        return target
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    cmd = [javac, "-nowarn", "-d", str(partial), "-cp", str(libs / "*"), str(source)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise RocketMQBenchError(
            f"javac did not compile {source} within {COMPILE_TIMEOUT_S:.0f} s"
        ) from exc
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "error" in ln]
        detail = lines[0] if lines else (proc.stdout + proc.stderr).strip()[-300:]
        shutil.rmtree(partial, ignore_errors=True)
        raise RocketMQBenchError(f"javac could not compile {source}: {detail}")
    if (target / "TxBench.class").is_file():  # another process compiled it meanwhile
        shutil.rmtree(partial, ignore_errors=True)
    else:
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
    return target


def prepare_rocketmq() -> Toolchain:
    """Java, RocketMQ's jars (resolved once with Maven) and TxBench compiled: the first use
    takes a minute or two, later ones only look. A missing tool or an unresolvable jar is a
    :class:`RocketMQBenchError` (or the jar resolver's error) of one line."""
    try:
        java = java_executable()
    except EmbeddedKafkaError as exc:
        raise RocketMQBenchError(
            "the rocketmq case needs Java 17 or newer: no 'java' on PATH and no JAVA_HOME"
        ) from exc
    version = rocketmq_version()
    libs = resolve_maven_jars(
        HERE / "pom.xml", cache_dir() / f"rocketmq-{version}" / "libs", f"Apache RocketMQ {version}"
    )
    tools = Toolchain(java, libs, _compiled(_javac(java), libs))
    LoopbackNamespace().close()  # the servers' namespace can be made: fail before any run
    return tools


# -- the two servers ------------------------------------------------------------------------
def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_ports() -> tuple[int, int, int]:
    """Name server, broker and HA ports; the broker's fast channel takes its port - 2."""
    for _ in range(100):
        namesrv, broker, ha = free_port(), free_port(), free_port()
        if len({namesrv, broker, broker - 2, ha}) == 4 and broker > 1026 and _bindable(broker - 2):
            return namesrv, broker, ha
    raise RocketMQBenchError("no four free ports on 127.0.0.1 for RocketMQ's servers")


def _jvm_home(work: Path) -> tuple[str, ...]:
    # RocketMQ's logs go to ${user.home}/logs/rocketmqlogs: into the run's work dir, not ~.
    home = work / "home"
    return (f"-Duser.home={home}", f"-Drocketmq.home.dir={home}", "-Djava.net.preferIPv4Stack=true")


class LoopbackNamespace:
    """A network namespace with only its loopback up, held open by a ``sleep`` process: the
    broker's HA port binds every address (RocketMQ 5.5.0 has no bind option for it), so the
    servers and TxBench run in here, where every address is loopback. Root only (``unshare``,
    ``nsenter``, ``ip``); :meth:`close` (by pid) is idempotent."""

    def __init__(self) -> None:
        missing = [tool for tool in ("unshare", "nsenter", "ip") if shutil.which(tool) is None]
        if os.geteuid() != 0 or missing:
            why = f"{', '.join(missing)} not on PATH" if missing else "not running as root"
            raise RocketMQBenchError(
                "the rocketmq case runs RocketMQ in a network namespace of its own (its broker's "
                f"HA port binds every address), which needs root, unshare, nsenter and ip: {why}"
            )
        self._holder: subprocess.Popen | None = subprocess.Popen(
            ["unshare", "--net", "sleep", "infinity"], stdin=subprocess.DEVNULL
        )
        try:
            self._up_loopback()
        except BaseException:
            self.close()
            raise

    def _up_loopback(self) -> None:
        deadline = time.monotonic() + NAMESPACE_TIMEOUT_S
        # Until unshare has made the namespace, /proc/PID/ns/net is still this one's: an
        # `ip` entered there would set up this namespace's loopback, not the new one's.
        while not self._isolated():
            if time.monotonic() > deadline:
                raise RocketMQBenchError("unshare made no network namespace in time")
            time.sleep(0.02)
        done = subprocess.run(
            self.prefix(["ip", "link", "set", "lo", "up"]),
            capture_output=True,
            text=True,
            timeout=NAMESPACE_TIMEOUT_S,
        )
        if done.returncode != 0:
            raise RocketMQBenchError(
                f"could not bring up the namespace's loopback: {done.stderr.strip()}"
            )

    def _isolated(self) -> bool:
        assert self._holder is not None
        try:
            return os.readlink(f"/proc/{self._holder.pid}/ns/net") != os.readlink(
                "/proc/self/ns/net"
            )
        except OSError:
            return False

    def prefix(self, cmd: list[str]) -> list[str]:
        """``cmd`` run inside the namespace (``nsenter`` execs it: its pid is ``cmd``'s)."""
        assert self._holder is not None, "the namespace is closed"
        return ["nsenter", f"--net=/proc/{self._holder.pid}/ns/net", "--", *cmd]

    def close(self) -> None:
        holder, self._holder = self._holder, None
        if holder is not None and holder.poll() is None:
            holder.kill()
            holder.wait(STOP_TIMEOUT_S)


class RocketMQServers:
    """A name server and one broker of RocketMQ on ports of 127.0.0.1 in a
    :class:`LoopbackNamespace` of their own, each a process with its store and logs under
    ``work``; a context manager, :meth:`stop` (by pid) is idempotent."""

    def __init__(self, tools: Toolchain, work: Path) -> None:
        self.tools, self.work = tools, work
        self.namesrv_port, self.broker_port, self.ha_port = 0, 0, 0
        self._procs: list[tuple[str, subprocess.Popen, IO[bytes]]] = []
        self._netns: LoopbackNamespace | None = None

    def command(self, cmd: list[str]) -> list[str]:
        """``cmd`` run where the servers are (their network namespace): TxBench's too."""
        assert self._netns is not None, "the servers are not started"
        return self._netns.prefix(cmd)

    @property
    def namesrv(self) -> str:
        return f"127.0.0.1:{self.namesrv_port}"

    @property
    def broker(self) -> str:
        return f"127.0.0.1:{self.broker_port}"

    def __enter__(self) -> RocketMQServers:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        self.namesrv_port, self.broker_port, self.ha_port = _free_ports()
        store = self.work / "store"
        namesrv_conf = self._conf("namesrv.properties", {"listenPort": self.namesrv_port})
        broker_conf = self._conf(
            "broker.properties",
            {
                "namesrvAddr": self.namesrv,
                "listenPort": self.broker_port,
                "haListenPort": self.ha_port,
                "storePathRootDir": store,
                "storePathCommitLog": store / "commitlog",
            },
        )
        self._netns = LoopbackNamespace()
        try:
            self._spawn("namesrv", NAMESRV_OPTS, NAMESRV_MAIN, namesrv_conf)
            self._spawn("broker", BROKER_OPTS, BROKER_MAIN, broker_conf)
        except BaseException:
            self.stop()
            raise

    def _conf(self, name: str, run: dict[str, object]) -> Path:
        """A copy of the shipped config with this run's ports and paths appended (a later
        key wins); the broker may write its config back, so it gets a copy."""
        path = self.work / name
        extra = "".join(f"{k}={v}\n" for k, v in run.items())
        path.write_text(f"{(HERE / name).read_text()}\n# this run's\n{extra}")
        return path

    def _spawn(self, name: str, opts: tuple[str, ...], main: str, conf: Path) -> None:
        out_path = self.work / f"{name}.out"
        out = out_path.open("wb")
        cmd = [
            self.tools.java,
            *opts,
            *_jvm_home(self.work),
            "-cp",
            str(self.tools.libs / "*"),
            main,
            "-c",
            str(conf),
        ]
        proc = subprocess.Popen(
            self.command(cmd), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
        )
        self._procs.append((name, proc, out))
        deadline = time.monotonic() + BOOT_TIMEOUT_S
        while BOOTED not in out_path.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = " | ".join(out_path.read_text(errors="replace").strip().splitlines()[-3:])
                state = (
                    f"exited {proc.returncode}"
                    if proc.returncode is not None
                    else (f"not up within {BOOT_TIMEOUT_S:.0f} s")
                )
                raise RocketMQBenchError(f"RocketMQ {name} {state}: {tail or 'no output'}")
            time.sleep(0.1)
        log.debug("RocketMQ %s up: pid %d on 127.0.0.1", name, proc.pid)

    def stop(self) -> None:
        """SIGTERM each process (broker first), SIGKILL one that outlives STOP_TIMEOUT_S."""
        while self._procs:
            name, proc, out = self._procs.pop()
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    log.warning("RocketMQ %s (pid %d) ignored SIGTERM; killing it", name, proc.pid)
                    proc.kill()
                    proc.wait(STOP_TIMEOUT_S)
            out.close()
        if self._netns is not None:
            self._netns.close()
            self._netns = None


# -- one run ----------------------------------------------------------------------------------
def _txbench(
    tools: Toolchain, servers: RocketMQServers, mode: str, args: dict[str, object], seconds: float
) -> dict[str, float]:
    cmd = [
        tools.java,
        *CLIENT_OPTS,
        *_jvm_home(servers.work),
        "-cp",
        tools.classpath,
        "TxBench",
        mode,
        f"ns={servers.namesrv}",
        f"broker={servers.broker}",
        f"queues={QUEUES}",
        *(f"{k}={v}" for k, v in args.items()),
    ]
    timeout = seconds + TXBENCH_SLACK_S
    try:
        proc = subprocess.run(servers.command(cmd), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise RocketMQBenchError(f"TxBench {mode} did not finish within {timeout:.0f} s") from exc
    (servers.work / f"txbench-{mode}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-3:])
        raise RocketMQBenchError(f"TxBench {mode} exited {proc.returncode}: {tail or 'no output'}")
    return parse_result(proc.stdout, mode)


def bench_rocketmq(
    s: BenchSettings,
    work: Path,
    tools: Toolchain | None = None,
    log_line: Callable[[str], None] = print,
) -> dict[str, Any]:
    """One run of the case (servers started, measured, stopped and removed): see
    :func:`run_figures` for what it returns."""
    tools = tools or prepare_rocketmq()
    run_dir = work / f"rocketmq-{uuid.uuid4().hex[:8]}"
    samples_file = run_dir / "latency-samples.txt"
    seconds = max(1, round(s.latency_seconds))
    try:
        with RocketMQServers(tools, run_dir) as servers:
            tput = _txbench(
                tools,
                servers,
                "tput-tx",
                {
                    "threads": COMPARED_THREADS,
                    "size": s.size,
                    "warmup": WARM_UP_S,
                    "duration": s.rocketmq_seconds,
                    "run": run_dir.name,
                },
                WARM_UP_S + s.rocketmq_seconds,
            )
            latency = _txbench(
                tools,
                servers,
                "latency",
                {
                    "rate": s.rate,
                    "size": s.size,
                    "warmup": WARM_UP_S,
                    "duration": seconds,
                    "senders": s.latency_threads,
                    "samples": samples_file,
                    "run": run_dir.name,
                },
                WARM_UP_S + seconds,
            )
            samples = read_samples(samples_file.read_text())
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    lost = {k: tput.get(k, 0.0) for k in ("fail", "missing")} | {
        "latency_missing": latency.get("missing", 0.0)
    }
    if any(lost.values()):
        log_line("  rocketmq: " + ", ".join(f"{k} {v:.0f}" for k, v in lost.items()))
    return run_figures(tput, latency, samples, s)
