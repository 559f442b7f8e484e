"""Coordinator settings: one frozen dataclass behind kwargs, CLI flags and ``RMQ_*`` env vars."""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.marker_auth import MIN_KEY_BYTES
from rmq_semantics.errors import ConfigError
from rmq_semantics.records.timer import (
    DEFAULT_MAX_DELAY_MS,
    DEFAULT_TIMER_CANCELS_MAX,
    DEFAULT_TIMER_PARTITIONS,
)
from rmq_semantics.settings import setting
from rmq_semantics.topics import DEFAULT_TOPIC_PREFIX, validate_prefix

__all__ = ["CoordinatorSettings"]


@dataclass(frozen=True)
class CoordinatorSettings:
    """Every tunable of the coordinator (and the defaults clients share with it)."""

    transaction_timeout_ms: int = setting(
        6000, "first back-check of a half message this long after it was born"
    )
    check_interval_ms: int = setting(60000, "interval between back-checks of one message")
    check_max: int = setting(15, "answered UNKNOWN checks before a message is discarded")
    reappend_horizon_ms: int | None = setting(
        None,
        "a half message pending this long is written again at the end of its half "
        "partition, so no transaction pins the committed offsets or memory "
        "(default: 3 x check_interval_ms)",
    )
    replay_max: int = setting(
        3,
        "aborted Kafka transactions one half message may cause "
        "before it is discarded (replay_limit)",
    )
    max_batch: int = setting(
        4000,
        "records read per step, so decided per Kafka transaction "
        "(a multi-message transaction is never split by it)",
    )
    promotion_sets: int = setting(
        1,
        "Kafka transactions open at once, each over its own set of this instance's half "
        "partitions (set k: the partitions p with p mod promotion_sets = k), so a record waits "
        "only for its own set's commit",
    )
    max_deferred_ends: int = setting(
        100_000,
        "end requests waiting for their half record, per half partition; beyond "
        "it the one addressed farthest ahead is dropped, counted and logged",
    )
    # Timer messages (issue 35): the timing wheel over the timer topics (coordinator/timer_*).
    timer_service: bool = setting(
        True,
        "run the timer service, which delivers scheduled messages (false: this instance does not)",
    )
    timer_partitions: int = setting(
        DEFAULT_TIMER_PARTITIONS,
        "partitions of the timer topics (intake, levels, cancel) when this creates them",
    )
    max_delay_ms: int = setting(
        DEFAULT_MAX_DELAY_MS,
        "longest delay of a timer message, as RocketMQ 5's timerMaxDelaySec (3 days): a "
        "message scheduled further ahead is discarded as too_far; sets the number of levels",
    )
    timer_cancels_max: int = setting(
        DEFAULT_TIMER_CANCELS_MAX,
        "cancel records (recalls) held per timer partition, counted over about two "
        "max_delay_ms; one past it is refused (its message is delivered) and the producer's "
        "recall_message raises: give producers the same value",
    )
    lock_lease_ms: int = setting(60000, "queue-lock lease granted to an orderly consumer")
    lock_renew_ms: int = setting(20000, "how often an orderly consumer renews its locks")
    topic_prefix: str = setting(DEFAULT_TOPIC_PREFIX, "prefix of every system topic")
    half_partitions: int = setting(8, "partitions of the half/op (and lock) topics")
    check_partitions: int = setting(8, "partitions of the check-request topic")
    system_replication_factor: int | None = setting(
        None,
        "replication factor of the system topics this creates, min ISR min(2, it) "
        "(default: min(3, brokers in the cluster))",
    )
    instance_id: str = setting(
        "",
        "stable id of this instance (default: random); reusing "
        "it after a crash fences the old process at once",
    )
    metrics_port: int | None = setting(
        None, "serve Prometheus /metrics and /healthz on this port (default off; 0: any free port)"
    )
    # Loopback by default (DESIGN.md); a container sets 0.0.0.0 so Prometheus can scrape it.
    metrics_host: str = setting(
        "127.0.0.1", "address the metrics server binds (0.0.0.0 in a container)"
    )
    # The HMAC key of Op markers (coordinator/marker_auth.py), shared by every coordinator.
    marker_key: str = setting(
        "",
        f"the coordinators' shared key for Op markers, at least {MIN_KEY_BYTES} bytes",
        secret=True,
    )
    marker_key_file: str = setting(
        "",
        "file holding the coordinators' shared key for Op markers (instead of env RMQ_MARKER_KEY)",
    )
    # Tenant isolation (coordinator/tenancy.py, docs/security.md): off unless a tenants file.
    tenants_file: str = setting(
        "",
        "JSON file naming each producer group's principal and the "
        "real topics it may promote into; turns tenant isolation "
        "on (default off)",
    )
    tenant_key: str = setting(
        "",
        "the key each producer group's key is derived from, at least 16 bytes (tenant isolation)",
        secret=True,
    )
    tenant_key_file: str = setting(
        "", "file holding the tenant key (instead of env RMQ_TENANT_KEY)"
    )

    def __post_init__(self) -> None:
        def positive(name: str) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{name} must be a positive int, got {value!r}")

        for name in (
            "transaction_timeout_ms",
            "check_interval_ms",
            "check_max",
            "replay_max",
            "max_batch",
            "promotion_sets",
            "max_deferred_ends",
            "lock_lease_ms",
            "lock_renew_ms",
            "half_partitions",
            "check_partitions",
            "timer_partitions",
            "max_delay_ms",
            "timer_cancels_max",
        ):
            positive(name)
        if not isinstance(self.timer_service, bool):
            raise ConfigError(f"timer_service must be a bool, got {self.timer_service!r}")
        if self.max_delay_ms < 1000:
            raise ConfigError(
                f"max_delay_ms must be at least 1000 (a second), got {self.max_delay_ms}"
            )
        if not self.lock_renew_ms < self.lock_lease_ms:
            raise ConfigError(
                "need 0 < lock_renew_ms < lock_lease_ms, got "
                f"lock_renew_ms={self.lock_renew_ms}, "
                f"lock_lease_ms={self.lock_lease_ms}"
            )
        if self.reappend_horizon_ms is not None:
            positive("reappend_horizon_ms")
        if self.system_replication_factor is not None:
            positive("system_replication_factor")
        validate_prefix(self.topic_prefix)
        port = self.metrics_port
        if port is not None and (
            isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535
        ):
            raise ConfigError(f"metrics_port must be a port number (0-65535), got {port!r}")
        if not isinstance(self.metrics_host, str) or not self.metrics_host:
            raise ConfigError(
                f"metrics_host must be a non-empty address, got {self.metrics_host!r}"
            )
        if self.marker_key and self.marker_key_file:
            raise ConfigError(
                "set the marker key by env RMQ_MARKER_KEY or by --marker-key-file, not both"
            )
        if self.tenant_key and self.tenant_key_file:
            raise ConfigError(
                "set the tenant key by env RMQ_TENANT_KEY or by --tenant-key-file, not both"
            )
        if bool(self.tenants_file) != bool(self.tenant_key or self.tenant_key_file):
            raise ConfigError(
                "tenant isolation needs both --tenants-file and a tenant key "
                "(env RMQ_TENANT_KEY or --tenant-key-file), got "
                f"tenants_file={self.tenants_file!r} and "
                f"{'a' if self.tenant_key or self.tenant_key_file else 'no'} key"
            )

    @property
    def reappend_after_ms(self) -> int:
        """The re-append horizon in effect: the setting, or a few check intervals (each
        re-append costs one more half record per pending transaction)."""
        if self.reappend_horizon_ms is not None:
            return self.reappend_horizon_ms
        return 3 * self.check_interval_ms
