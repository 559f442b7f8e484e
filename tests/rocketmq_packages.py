"""RocketMQ's own Python clients as the compatibility tests read them (issue 37).

The 2.x client (PyPI ``rocketmq-client-python``) is a ctypes binding of librocketmq, which
``import`` loads, so it is never installed: its sdist is downloaded once with pip into the
project's cache (``$RMQ_CACHE_DIR``, else ``~/.cache/rmq-semantics``), checked against its
pinned digest, and read from there (its sources parsed, its samples run rewritten). The 5.x
client (``rocketmq-python-client``) is pure Python and comes with the dev extra."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from rmq_semantics.kafka_jars import cache_dir

__all__ = ["V2_NAME", "V2_VERSION", "v2_sdist", "v2_source"]

V2_NAME, V2_VERSION = "rocketmq-client-python", "2.0.0"
# PyPI's sha256 of rocketmq-client-python-2.0.0.tar.gz.
V2_SHA256 = "692324adaa8107eebd0369117043871d90035ddb1562f9999c5681136f16f738"
DOWNLOAD_TIMEOUT_S = 300


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def v2_sdist() -> Path:
    """The 2.x sdist, downloaded with pip the first time."""
    target = cache_dir() / "pypi" / f"{V2_NAME}-{V2_VERSION}.tar.gz"
    if target.is_file() and _digest(target) == V2_SHA256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--no-binary=:all:",
                "--dest",
                tmp,
                f"{V2_NAME}=={V2_VERSION}",
            ],
            capture_output=True,
            text=True,
            timeout=DOWNLOAD_TIMEOUT_S,
        )
        if proc.returncode != 0:
            raise AssertionError(f"pip download {V2_NAME}=={V2_VERSION} failed:\n{proc.stderr}")
        [got] = Path(tmp).glob("*.tar.gz")
        if _digest(got) != V2_SHA256:
            raise AssertionError(f"{got.name}: sha256 {_digest(got)}, expected {V2_SHA256}")
        got.replace(target)
    return target


def v2_source(member: str) -> str:
    """A file of the 2.x sdist (``rocketmq/client.py``, ``samples/producer.py`` ...)."""
    with tarfile.open(v2_sdist()) as tar:
        extracted = tar.extractfile(f"{V2_NAME}-{V2_VERSION}/{member}")
        if extracted is None:
            raise AssertionError(f"{member} is not a file of the {V2_NAME} sdist")
        return extracted.read().decode("utf-8")
