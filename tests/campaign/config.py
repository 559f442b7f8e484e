"""One campaign's settings: written once by the runner as ``config.json`` in the out dir,
read by every worker process, so all of them agree on names, timeouts and the seed."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

CONFIG_FILE = "config.json"

# The coordinators' horizons, shortened so checks, leases and rebalances happen within a run
# (a session timeout past which a paused coordinator is a zombie; a check interval in
# seconds). check_max is high: a check the barrier cannot answer in time (a local
# transaction that outlives transaction_timeout_ms) answers UNKNOW, and a discard would be a
# liveness failure rather than a fault's effect.
COORDINATOR_SETTINGS = {
    "transaction_timeout_ms": 2000,
    "check_interval_ms": 3000,
    "check_max": 10,
    "lock_lease_ms": 6000,
    "lock_renew_ms": 2000,
    "half_partitions": 4,
    "check_partitions": 2,
    # Timer messages (issue 35): every coordinator runs the timer service; two timer
    # partitions each (a takeover moves some), and a maximum delay of 5 minutes (9 level
    # topics, not 18) that still covers the longest timer plus a producer's clock skew.
    # The producers take the same timer_partitions and max_delay_ms.
    "timer_service": True,
    "timer_partitions": 2,
    "max_delay_ms": 300_000,
}
SESSION_TIMEOUT_MS = 6000
HEARTBEAT_MS = 1000


@dataclass(frozen=True)
class ConsumerSpec:
    """``count`` processes of one consumer class in one group."""

    role: str  # "push", "orderly-partition", "orderly-key" or "simple"
    group: str
    count: int


@dataclass(frozen=True)
class CampaignConfig:
    seed: int
    run_id: str
    bootstrap: str
    out_dir: str
    topic_prefix: str  # the coordinators' system topics
    topics: tuple[str, ...]  # the workload's topics created before the load
    partitions: int
    load_s: float
    producers: tuple[str, ...]  # one api per process: "sync" or "async"
    consumers: tuple[ConsumerSpec, ...]
    ops_per_s: float  # per producer process
    new_topics_per_producer: int  # created mid-run, used at once
    keys: int = 12  # ordering keys per topic
    coordinator: dict = field(default_factory=lambda: dict(COORDINATOR_SETTINGS))
    session_timeout_ms: int = SESSION_TIMEOUT_MS
    consumer_lease_ms: int = 6000
    consumer_renew_ms: int = 1500
    push_max_reconsume: int = 2
    # The SimpleConsumer group (issue 36): few attempts and a short invisible duration, so
    # the messages its worker leaves unacked come back, and the poison ones reach the DLQ,
    # within seconds.
    simple_max_attempts: int = 3
    simple_invisible_s: float = 2.0
    # Timer messages: due at most this far ahead of their send (0: none are sent).
    timer_max_s: float = 0.0

    @property
    def topic_pattern(self) -> str:
        """Every workload topic, those created mid-run too (librdkafka's regex)."""
        return f"^{self.run_id}-.*"

    @property
    def real_topic_pattern(self) -> str:
        """The workload's real topics only (no retry or dead-letter topics): Java regex."""
        return f"^{self.run_id}-(t[0-9]+|p[0-9]+n[0-9]+)$"

    def new_topic(self, producer: int, n: int) -> str:
        return f"{self.run_id}-p{producer}n{n}"

    def write(self, out_dir: Path) -> Path:
        path = Path(out_dir) / CONFIG_FILE
        path.write_text(json.dumps(asdict(self), indent=1))
        return path

    @classmethod
    def read(cls, path: Path | str) -> CampaignConfig:
        raw = json.loads(Path(path).read_text())
        known = {f.name for f in fields(cls)}
        raw = {k: v for k, v in raw.items() if k in known}
        raw["topics"] = tuple(raw["topics"])
        raw["producers"] = tuple(raw["producers"])
        raw["consumers"] = tuple(ConsumerSpec(**c) for c in raw["consumers"])
        return cls(**raw)
