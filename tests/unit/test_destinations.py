"""Where promotions go, without a broker (coordinator/destinations.py): only a successful
metadata read taken after the decision, lacking the topic or partition, discards a COMMIT;
a failed read, a stale cache or a transient topic error is retried, blaming no record."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from coordinator import destinations as module
from coordinator.destinations import Destinations
from coordinator.poison import PoisonLedger
from coordinator.state import Action, Discard, PartitionState
from rmq_semantics.errors import KafkaOperationError
from rmq_semantics.records.half import HalfMessage
from rmq_semantics.records.reasons import DiscardReason

T0 = 1_000_000


class Clock:
    """time.monotonic, time.time and time.sleep of the module under test."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.mono, self.wall = 100.0, T0 / 1000
        monkeypatch.setattr(module.time, "monotonic", lambda: self.mono)
        monkeypatch.setattr(module.time, "time", lambda: self.wall)
        monkeypatch.setattr(module.time, "sleep", self.advance)

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds


class Admin:
    """list_topics of a cluster holding ``topics`` (name -> partitions), or failing with
    ``error``; ``topic_errors`` puts a topic-level error on a topic."""

    def __init__(self, topics: dict[str, int]) -> None:
        self.topics = dict(topics)
        self.topic_errors: dict[str, KafkaError] = {}
        self.error: KafkaError | None = None
        self.listed = 0

    def list_topics(self, timeout: float):
        self.listed += 1
        if self.error is not None:
            raise KafkaException(self.error)
        names = set(self.topics) | set(self.topic_errors)
        return type(
            "Meta",
            (),
            {
                "topics": {
                    name: type(
                        "T",
                        (),
                        {
                            "error": self.topic_errors.get(name),
                            "partitions": dict.fromkeys(range(self.topics.get(name, 0))),
                        },
                    )()
                    for name in names
                }
            },
        )()


def half(
    offset: int, topic: str, partition: int | None = None, timestamp_ms: int = T0
) -> HalfMessage:
    return HalfMessage(
        0,
        offset,
        timestamp_ms,
        f"t{offset}",
        "pg",
        topic,
        partition,
        timestamp_ms,
        None,
        b"k",
        b"v",
        [],
    )


def commit(
    st: PartitionState,
    offset: int,
    topic: str,
    partition: int | None = None,
    timestamp_ms: int = T0,
) -> list[Action]:
    from coordinator.state import EndRequest

    st.on_half(offset, half(offset, topic, partition, timestamp_ms), T0)
    return st.on_end_request(
        EndRequest(100 + offset, f"t{offset}", "pg", offset, "COMMIT", False, 0, T0), T0
    )


def live() -> PartitionState:
    st = PartitionState(0, 6000, 60000, 1)
    st.on_eof("half", T0)
    st.on_eof("op", T0)
    return st


def reasons(actions: list[Action]) -> list[DiscardReason | None]:
    return [a.reason if isinstance(a, Discard) else None for a in actions]


def past_grace(clock: Clock, vet):
    """``vet()`` replayed until the metadata has lacked a topic for the grace: the first try
    is replayed (a broker may lag the controller), the one after the grace decides."""
    with pytest.raises(KafkaOperationError, match="not in the cluster's metadata yet"):
        vet()
    clock.advance(module.MISSING_GRACE_S)
    return vet()


def test_a_failed_metadata_read_discards_nothing_and_blames_no_record(monkeypatch):
    Clock(monkeypatch)
    admin = Admin({"orders": 1})
    admin.error = KafkaError(KafkaError._TIMED_OUT)
    ledger = PoisonLedger(3)
    destinations = Destinations(lambda: admin, ledger)  # right after start: nothing cached
    st = live()
    with pytest.raises(KafkaOperationError, match="metadata"):
        destinations.vet(commit(st, 0, "orders", 0), {0: st})
    assert len(ledger) == 0
    admin.error = None  # the replay decides again, and the read succeeds
    st = live()
    assert reasons(destinations.vet(commit(st, 0, "orders", 0), {0: st})) == [None]


def test_a_topic_created_just_after_an_unrelated_refresh_is_promoted(monkeypatch):
    clock = Clock(monkeypatch)
    admin = Admin({"orders": 1})
    destinations = Destinations(lambda: admin, PoisonLedger(3))
    st = live()
    assert reasons(
        past_grace(clock, lambda: destinations.vet(commit(live(), 0, "gone"), {0: st}))
    ) == [DiscardReason.UNKNOWN_TOPIC]  # reads lacking it for the grace: a discard
    admin.topics["new"] = 1
    clock.advance(0.05)
    assert reasons(destinations.vet(commit(st, 1, "new"), {0: st})) == [None]


def test_a_producer_clock_behind_hides_no_new_topic(monkeypatch):
    clock = Clock(monkeypatch)
    admin = Admin({})
    destinations = Destinations(lambda: admin, PoisonLedger(3))
    st = live()
    past_grace(clock, lambda: destinations.vet(commit(live(), 0, "gone"), {0: st}))
    admin.topics["new"] = 2
    clock.advance(0.5)
    # Written after that read, stamped 60 s before it by a clock behind the coordinator's.
    actions = commit(st, 1, "new", 1, timestamp_ms=int(clock.wall * 1000) - 60_000)
    assert reasons(destinations.vet(actions, {0: st})) == [None]


def test_a_transient_topic_error_in_the_metadata_is_retried_not_discarded(monkeypatch):
    Clock(monkeypatch)
    admin = Admin({"orders": 2})
    admin.topic_errors["orders"] = KafkaError(KafkaError.LEADER_NOT_AVAILABLE)
    ledger = PoisonLedger(3)
    destinations = Destinations(lambda: admin, ledger)
    st = live()
    with pytest.raises(KafkaOperationError, match="orders"):
        destinations.vet(commit(st, 0, "orders", 1), {0: st})
    assert len(ledger) == 0


def test_a_fresh_read_lacking_the_topic_or_partition_still_discards(monkeypatch):
    clock = Clock(monkeypatch)
    admin = Admin({"orders": 2})
    admin.topic_errors["gone"] = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
    destinations = Destinations(lambda: admin, PoisonLedger(3))
    st = live()

    def batch() -> list:
        st = live()
        return destinations.vet(
            [
                *commit(st, 0, "orders", 1),
                *commit(st, 1, "orders", 2),
                *commit(st, 2, "gone"),
                *commit(st, 3, "never"),
            ],
            {0: st},
        )

    # Every missing one starts its grace in the first try: the replay after it decides all.
    assert reasons(past_grace(clock, batch)) == [
        None,
        DiscardReason.UNKNOWN_PARTITION,
        DiscardReason.UNKNOWN_TOPIC,
        DiscardReason.UNKNOWN_TOPIC,
    ]
    assert admin.listed == 2  # one read serves a whole batch
    clock.advance(5)
    assert reasons(destinations.vet(commit(st, 4, "orders", 0), {0: st})) == [None]
    assert admin.listed == 2  # a cached topic and partition need no read


def test_a_topic_a_lagging_broker_does_not_list_yet_is_promoted_not_discarded(monkeypatch):
    """The fault campaign (seed 2): a producer created a topic and committed into it at once;
    the metadata read came from a broker still catching up after a pause, without the topic,
    and the committed transaction was discarded as unknown_topic. One read lacking a topic
    is not proof: the batch is replayed until reads lacking it span the grace."""
    clock = Clock(monkeypatch)
    admin = Admin({"orders": 1})
    destinations = Destinations(lambda: admin, PoisonLedger(3))
    st = live()
    with pytest.raises(KafkaOperationError, match="not in the cluster's metadata"):
        destinations.vet(commit(st, 0, "new"), {0: st})
    admin.topics["new"] = 1  # the lagging broker caught up
    clock.advance(1.0)
    st = live()  # the replay decides again
    assert reasons(destinations.vet(commit(st, 0, "new"), {0: st})) == [None]
