"""The Apache Kafka jars and the JVM that runs them, for the embedded broker, the embedded
cluster and the Spark job's connector: jars resolved once from Maven Central with Maven,
using a pom shipped in the package (``rmq_semantics/kafka/pom.xml`` pins Kafka's version),
into a cache outside the repository."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import subprocess
from importlib import resources
from pathlib import Path

from rmq_semantics.errors import EmbeddedKafkaError

__all__ = [
    "cache_dir",
    "checked_version",
    "java_executable",
    "kafka_classpath",
    "kafka_version",
    "resolve_maven_jars",
]

log = logging.getLogger(__name__)

# Resolving ~40 jars from Maven Central on a cold cache.
MAVEN_TIMEOUT_S = 600.0


def _pom() -> Path:
    return Path(str(resources.files("rmq_semantics") / "kafka" / "pom.xml"))


def kafka_version() -> str:
    """The Apache Kafka release the pom pins: the default of ``--version``."""
    match = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", _pom().read_text())
    if not match:
        raise EmbeddedKafkaError(f"{_pom()} does not pin <kafka.version>")
    return match.group(1)


def cache_dir() -> Path:
    """Where downloaded jars live: $RMQ_CACHE_DIR, else $XDG_CACHE_HOME/rmq-semantics."""
    base = os.environ.get("RMQ_CACHE_DIR")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "rmq-semantics"


def resolve_maven_jars(
    pom: Path, target: Path, what: str, properties: list[str] | None = None
) -> Path:
    """Copy the runtime dependencies of ``pom`` into ``target`` once, atomically."""
    if target.is_dir() and any(target.glob("*.jar")):
        return target
    mvn = shutil.which("mvn")
    if mvn is None:
        raise EmbeddedKafkaError(
            f"Maven ('mvn') is not on PATH; it is needed once to resolve the {what} jars "
            "from Maven Central (apt-get install maven)"
        )
    partial = target.with_name(target.name + f".partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    log.info("resolving %s jars from Maven Central into %s", what, target)
    settings = Path(str(resources.files("rmq_semantics") / "kafka" / "maven-settings.xml"))
    cmd = [
        mvn,
        "-q",
        "-B",
        "-s",
        str(settings),
        "-f",
        str(pom),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={partial}",
        "-DincludeScope=runtime",
        *(properties or []),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=MAVEN_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise EmbeddedKafkaError(
            f"Maven did not resolve the {what} jars within {MAVEN_TIMEOUT_S:.0f} s"
        ) from exc
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "ERROR" in ln]
        detail = lines[0] if lines else (proc.stdout + proc.stderr).strip()[-300:]
        raise EmbeddedKafkaError(f"Maven could not resolve the {what} jars: {detail}")
    target.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(target)
    partial.rename(target)
    return target


def checked_version(version: str) -> str:
    """``version`` if it names a release (it becomes a Maven property and a cache dir)."""
    if not re.fullmatch(r"\d+\.\d+\.\d+", version):
        raise EmbeddedKafkaError(
            f"--version {version!r}: want an Apache Kafka release such as 4.4.0"
        )
    return version


def kafka_classpath(version: str | None = None) -> str:
    """The jars of Apache Kafka ``version`` (default: the pom's), resolved once per version."""
    version = checked_version(version or kafka_version())
    libs = resolve_maven_jars(
        _pom(),
        cache_dir() / f"kafka-{version}" / "libs",
        f"Apache Kafka {version}",
        [f"-Dkafka.version={version}"],
    )
    return str(libs / "*")


def java_executable() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise EmbeddedKafkaError(
            "Java is not installed (no 'java' on PATH and no JAVA_HOME); "
            "Kafka 4 needs Java 17 or newer"
        )
    return java
