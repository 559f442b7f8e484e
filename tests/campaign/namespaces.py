"""The campaign's own namespaces, and the faults that need them.

The campaign (cluster, workload, nemesis) runs in a fresh network namespace with only its
loopback up, and a fresh mount namespace with private propagation: its firewall rules and
its mounts touch nothing outside. ``python -m tests.campaign.namespaces CMD...`` (or
:func:`ns_command`) runs CMD there; :func:`inside` tells a process that it is there.

- A partition of node N: each node runs under a group id of its own (:func:`node_prefix`,
  the cluster's ``node_prefix``), so iptables can drop every packet N's sockets send
  (``owner --gid-owner``) and every packet to N's ports; heal deletes the two rules.
- A full log directory: :class:`TmpfsLogDir` puts a node's log dir on a size-limited tmpfs
  mounted in this mount namespace; :class:`DiskFull` fills it with a file and heals by
  deleting the file (and restarting the node if the full disk stopped it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from rmq_semantics.kafka_cluster import EmbeddedCluster
from tests.campaign.faultkit import Fault, restart_node

__all__ = [
    "DiskFull",
    "Partition",
    "TmpfsLogDir",
    "heal_partitions",
    "inside",
    "node_gid",
    "node_prefix",
    "ns_command",
]

log = logging.getLogger(__name__)

ENV_MARK = "RMQ_CAMPAIGN_NS"
# Group ids no account uses: node N runs as gid GID_BASE + N.
GID_BASE = 61000
RULE_TAG = "rmq-nemesis"
# Every fill leaves the node's log dir this many bytes short of nothing: appends fail at once.
FILL_SLACK = 0
DEFAULT_TMPFS_MB = 512


def _netns() -> str:
    return os.readlink("/proc/self/ns/net")


def inside() -> bool:
    """Whether this process runs in namespaces :func:`ns_command` made: ``RMQ_CAMPAIGN_NS``
    names the network namespace the wrapper was started in, and this is another one."""
    outer = os.environ.get(ENV_MARK)
    try:
        return bool(outer) and _netns() != outer
    except OSError:
        return False


def require_inside(what: str) -> None:
    if not inside():
        raise RuntimeError(
            f"{what} needs the campaign's namespaces: run under "
            "`python -m tests.campaign.namespaces ...` (ns_command)"
        )


def ns_command(cmd: Sequence[str]) -> list[str]:
    """``cmd`` in a new network + mount namespace with loopback up (root only), to run with
    the env of :func:`ns_env`. Also a PID namespace with ``cmd`` as its init: when it exits
    or crashes, the kernel kills whatever it left (brokers, workers) with it."""
    return [
        "unshare",
        "--net",
        "--mount",
        "--propagation",
        "private",
        "--pid",
        "--fork",
        "--kill-child",
        "--mount-proc",
        "--",
        "sh",
        "-c",
        'ip link set lo up && exec "$@"',
        "sh",
        *cmd,
    ]


def ns_env(env: dict[str, str] | None = None) -> dict[str, str]:
    return {**(os.environ if env is None else env), ENV_MARK: _netns()}


def node_gid(node_id: int) -> int:
    return GID_BASE + node_id


def node_prefix(node_id: int) -> list[str]:
    """The words before node N's ``java`` (EmbeddedCluster's ``node_prefix``): its own gid,
    which the partition rules match. setpriv execs, so the pid stays the JVM's."""
    if shutil.which("setpriv") is None:
        return []
    return ["setpriv", f"--regid={node_gid(node_id)}", "--clear-groups", "--"]


def _process_gid(pid: int) -> int | None:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Gid:"):
                return int(line.split()[2])  # the effective gid
    return None


# -- partition -----------------------------------------------------------------------------
def node_ports(cluster: EmbeddedCluster, node_id: int) -> tuple[int, int]:
    """Node N's client and controller ports."""
    spec = cluster._layout["nodes"][node_id - 1]
    return int(spec["port"]), int(spec["controller_port"])


def _rules(cluster: EmbeddedCluster, node_id: int) -> list[tuple[str, list[str]]]:
    ports = ",".join(str(p) for p in node_ports(cluster, node_id))
    tag = ["-m", "comment", "--comment", f"{RULE_TAG}-{node_id}"]
    return [
        (
            "OUTPUT",
            ["-o", "lo", "-m", "owner", "--gid-owner", str(node_gid(node_id)), *tag, "-j", "DROP"],
        ),
        (
            "INPUT",
            ["-i", "lo", "-p", "tcp", "-m", "multiport", "--dports", ports, *tag, "-j", "DROP"],
        ),
    ]


def _iptables(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["iptables", "-w", "5", *args], capture_output=True, text=True, timeout=30
    )


class Partition(Fault):
    """Node N cut off from everyone (the other nodes, the clients): whatever its sockets send
    is dropped, and so is whatever is sent to its client and controller ports. Established
    connections stay open and stall, as behind a real partition."""

    kind = "partition"

    def __init__(self, cluster: EmbeddedCluster, node_id: int, seed: int | None = None) -> None:
        super().__init__(f"node-{node_id}", seed)
        self.cluster = cluster
        self.node_id = node_id

    def _apply(self) -> None:
        require_inside("a partition")
        pid = self.cluster.node(self.node_id).pid
        if pid is not None and _process_gid(pid) != node_gid(self.node_id):
            raise RuntimeError(
                f"node {self.node_id} (pid {pid}) does not run under gid "
                f"{node_gid(self.node_id)}: start the cluster with "
                "node_prefix=namespaces.node_prefix"
            )
        for chain, rule in _rules(self.cluster, self.node_id):
            proc = _iptables("-I", chain, *rule)
            if proc.returncode != 0:
                raise RuntimeError(f"iptables -I {chain}: {proc.stderr.strip()}")
        self.detail["ports"] = list(node_ports(self.cluster, self.node_id))

    def _heal(self) -> None:
        for chain, rule in _rules(self.cluster, self.node_id):
            _iptables("-D", chain, *rule)


def heal_partitions() -> int:
    """Delete every rule a :class:`Partition` left (a crashed run); returns how many."""
    if not inside():
        return 0
    removed = 0
    for chain in ("INPUT", "OUTPUT"):
        listing = _iptables("-S", chain).stdout.splitlines()
        for line in listing:
            if (
                RULE_TAG in line
                and line.startswith("-A ")
                and _iptables("-D", *line.split()[1:]).returncode == 0
            ):
                removed += 1
    return removed


# -- a full log directory ------------------------------------------------------------------
def _du_bytes(path: Path) -> int:
    """Bytes allocated under ``path`` (sparse index files count what they use)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


def _run(*cmd: str) -> None:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {(proc.stderr or proc.stdout).strip()}")


class TmpfsLogDir:
    """Node N's log dir on a tmpfs of ``size_mb`` (used + ``size_mb`` when it has data),
    mounted in the campaign's mount namespace. :meth:`install` before the cluster starts
    costs nothing; on a running node it stops the node, copies its data in and starts it.
    :meth:`uninstall` copies the data back to disk the same way."""

    def __init__(
        self, cluster: EmbeddedCluster, node_id: int, size_mb: int = DEFAULT_TMPFS_MB
    ) -> None:
        self.cluster = cluster
        self.node_id = node_id
        self.size_mb = size_mb
        self.log_dir = cluster.node(node_id).data_dir / "logs"

    def mounted(self) -> bool:
        return os.path.ismount(self.log_dir)

    def install(self) -> None:
        require_inside("a tmpfs log dir")
        if self.mounted():
            return
        was_running = self.cluster.node(self.node_id).pid is not None
        if was_running:
            self.cluster.stop(self.node_id)
        aside = self.log_dir.with_name("logs.disk")
        used = 0
        if self.log_dir.exists():
            used = _du_bytes(self.log_dir)
            self.log_dir.rename(aside)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        size = used + self.size_mb * 1024 * 1024
        _run(
            "mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "rmq-nemesis", str(self.log_dir)
        )
        if aside.exists():
            _run("cp", "-a", "--sparse=always", f"{aside}/.", f"{self.log_dir}/")
            shutil.rmtree(aside)
        log.info("node %d's log dir is a tmpfs of %d MiB", self.node_id, size >> 20)
        if was_running:
            self.cluster.start_node(self.node_id)

    def uninstall(self) -> None:
        if not self.mounted():
            return
        was_running = self.cluster.node(self.node_id).pid is not None
        if was_running:
            self.cluster.stop(self.node_id)
        back = self.log_dir.with_name("logs.disk")
        shutil.rmtree(back, ignore_errors=True)
        back.mkdir()
        (self.log_dir / DiskFull.FILLER).unlink(missing_ok=True)
        _run("cp", "-a", "--sparse=always", f"{self.log_dir}/.", f"{back}/")
        _run("umount", str(self.log_dir))
        self.log_dir.rmdir()
        back.rename(self.log_dir)
        if was_running:
            self.cluster.start_node(self.node_id)

    def free_bytes(self) -> int:
        st = os.statvfs(self.log_dir)
        return st.f_bavail * st.f_frsize


class DiskFull(Fault):
    """Node N's (tmpfs) log dir filled to the last byte by one file: its next append fails
    with ENOSPC, and a node whose metadata log is there halts. Heal deletes the file and
    starts the node again if it stopped."""

    kind = "disk_full"
    FILLER = "nemesis-filler"

    def __init__(self, tmpfs: TmpfsLogDir, seed: int | None = None) -> None:
        super().__init__(f"node-{tmpfs.node_id}", seed)
        self.tmpfs = tmpfs

    @property
    def filler(self) -> Path:
        return self.tmpfs.log_dir / self.FILLER

    def _apply(self) -> None:
        if not self.tmpfs.mounted():
            raise RuntimeError(
                f"node {self.tmpfs.node_id}'s log dir is not on a tmpfs: "
                "TmpfsLogDir.install() first"
            )
        free = self.tmpfs.free_bytes() - FILL_SLACK
        # tmpfs takes a fallocate whole or not at all (the broker's own appends can take the
        # last pages first): what does not fit at once is written in chunks to ENOSPC.
        with open(self.filler, "wb", buffering=0) as out:
            with contextlib.suppress(OSError):
                os.posix_fallocate(out.fileno(), 0, free)
            out.seek(0, os.SEEK_END)
            chunk = bytes(1 << 20)
            with contextlib.suppress(OSError):
                while True:
                    if not out.write(chunk):
                        break
        self.detail["filled_bytes"] = self.filler.stat().st_size
        self.detail["pid"] = self.tmpfs.cluster.node(self.tmpfs.node_id).pid

    def _heal(self) -> None:
        self.filler.unlink(missing_ok=True)
        node = self.tmpfs.cluster.node(self.tmpfs.node_id)
        self.detail["stopped"] = node.pid is None
        if node.pid is None:
            self.detail["restart_s"] = restart_node(self.tmpfs.cluster, self.tmpfs.node_id)


def main(argv: list[str]) -> int:
    """``python -m tests.campaign.namespaces CMD...``: CMD inside fresh namespaces. The jars
    are resolved first: there is no network in there."""
    if not argv:
        print("usage: python -m tests.campaign.namespaces CMD [ARG...]", file=sys.stderr)
        return 2
    if inside():
        os.execvp(argv[0], argv)
    from rmq_semantics.embedded import kafka_classpath

    kafka_classpath()
    started = time.monotonic()
    rc = subprocess.call(ns_command(argv), env=ns_env())
    log.info("namespaces: %s exited %d after %.0f s", argv[0], rc, time.monotonic() - started)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
