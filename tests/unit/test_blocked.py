"""Why promotion is blocked: the cause read from the cluster's metadata and topic configs,
shown in a gauge until a transaction commits again."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace

from prometheus_client import CollectorRegistry, Gauge

from coordinator.blocked import (
    NO_LEADER,
    NOT_ENOUGH_REPLICAS,
    TIMED_OUT_REASON,
    Blockage,
    BlockProbe,
    blocked_reason,
)


class FakeAdmin:
    """list_topics/describe_configs of a cluster: topic -> [(leader, in-sync count)]."""

    def __init__(self, partitions: dict[str, list[tuple[int, int]]], min_isr: dict[str, int]):
        self.partitions = partitions
        self.min_isr = min_isr

    def list_topics(self, timeout: float):
        return SimpleNamespace(
            topics={
                t: SimpleNamespace(
                    partitions={
                        n: SimpleNamespace(leader=leader, isrs=list(range(isr)))
                        for n, (leader, isr) in enumerate(parts)
                    }
                )
                for t, parts in self.partitions.items()
            }
        )

    def describe_configs(self, resources, request_timeout: float):
        out = {}
        for res in resources:
            future: Future = Future()
            future.set_result(
                {"min.insync.replicas": SimpleNamespace(value=str(self.min_isr[res.name]))}
            )
            out[res] = future
        return out


def test_the_most_specific_reason_of_a_partition_wins():
    assert blocked_reason(1, 2, leader=-1) == NO_LEADER
    assert blocked_reason(2, 3, leader=1) == NOT_ENOUGH_REPLICAS
    assert blocked_reason(3, 2, leader=1) == TIMED_OUT_REASON


def test_a_partition_placed_by_key_is_looked_for_in_every_partition_of_its_topic():
    admin = FakeAdmin(
        {"orders": [(1, 3), (2, 2), (3, 3)], "fine": [(1, 3)]}, {"orders": 3, "fine": 2}
    )
    probe = BlockProbe(lambda: admin)
    assert probe.reason({("orders", None)}) == NOT_ENOUGH_REPLICAS
    assert probe.reason({("orders", 0), ("fine", None)}) == TIMED_OUT_REASON
    assert probe.reason({("missing", None)}) == TIMED_OUT_REASON


def test_the_gauge_shows_the_reason_until_a_commit():
    gauge = Gauge("blocked", "", ["reason"], registry=CollectorRegistry())
    admin = FakeAdmin({"orders": [(1, 2)]}, {"orders": 3})
    blockage = Blockage(BlockProbe(lambda: admin), gauge)
    blockage.aborted(set())  # nothing timed out: not blocked
    assert blockage.reason is None
    blockage.aborted({("orders", None)})
    assert gauge.labels(NOT_ENOUGH_REPLICAS)._value.get() == 1
    blockage.committed()
    assert blockage.reason is None and gauge.labels(NOT_ENOUGH_REPLICAS)._value.get() == 0
