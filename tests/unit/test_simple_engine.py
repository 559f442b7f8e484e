"""The SimpleConsumer's lease engine and its commit-metadata field, by example: FIFO groups,
invisibility, receipts, attempts, dead letters, commits and takeovers (no broker)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rmq_semantics.errors import ConfigError, IllegalTransitionError, ReceiptError
from rmq_semantics.orderly.offsets import DONE_FIELD_PREFIX
from rmq_semantics.records.headers import H
from rmq_semantics.simple.engine import (
    DEFAULT_MAX_LEASED,
    DONE_METADATA_BYTES,
    MAX_LEASED,
    MAX_OWNER_CHARS,
    PartitionEngine,
    message_group_of,
)
from rmq_semantics.simple.leases import (
    LEASE_FIELD_PREFIX,
    MAX_ENTRY_BYTES,
    Lease,
    compose_metadata,
    decode_leases,
    encode_leases,
    split_metadata,
)
from rmq_semantics.simple.record_state import TRANSITIONS, RecordState

T0 = 1_700_000_000_000
SECOND = 1000


def rec(group: str | None = None) -> SimpleNamespace:
    headers = [(H.MESSAGE_GROUP, group.encode())] if group else []
    return SimpleNamespace(headers=headers)


def engine(**kwargs) -> PartitionEngine:
    return PartitionEngine("t", 0, key_of=lambda r: message_group_of(r.headers), **kwargs)


def fill(e: PartitionEngine, groups: list[str | None], start: int = 0) -> None:
    for i, group in enumerate(groups):
        assert e.offer(start + i, rec(group), T0)


def offsets(deliveries) -> list[int]:
    return [d.receipt.offset for d in deliveries]


def test_a_group_hands_out_its_next_record_only_after_the_previous_ack():
    e = engine()
    fill(e, ["a", "a", "b", None, "a"])
    first = e.receive(10, T0, 30 * SECOND)
    assert offsets(first) == [0, 2, 3]  # heads of a and b, and the unordered record
    assert e.receive(10, T0, 30 * SECOND) == []
    e.ack(first[0].receipt, T0 + 1)
    assert offsets(e.receive(10, T0 + 1, 30 * SECOND)) == [1]


def test_an_unacked_record_comes_back_after_its_invisible_duration_with_its_attempt_counted():
    e = engine()
    fill(e, ["a", "a"])
    (first,) = e.receive(10, T0, 10 * SECOND)
    assert first.delivery_attempt == 1
    assert e.receive(10, T0 + 10 * SECOND - 1, SECOND) == []
    (again,) = e.receive(10, T0 + 10 * SECOND, SECOND)
    assert (again.receipt.offset, again.delivery_attempt) == (0, 2)  # retried in place
    with pytest.raises(ReceiptError, match="delivered again"):
        e.ack(first.receipt, T0 + 10 * SECOND)


def test_change_invisible_duration_extends_and_is_refused_once_the_deadline_passed():
    e = engine()
    fill(e, [None])
    (d,) = e.receive(1, T0, 10 * SECOND)
    assert e.change_invisible_duration(d.receipt, 60 * SECOND, T0 + 5 * SECOND) == T0 + 65 * SECOND
    assert e.receive(1, T0 + 20 * SECOND, SECOND) == []  # the old deadline no longer counts
    (again,) = e.receive(1, T0 + 65 * SECOND, SECOND)
    assert again.delivery_attempt == 2
    with pytest.raises(ReceiptError, match="delivered again"):
        e.change_invisible_duration(d.receipt, SECOND, T0 + 65 * SECOND)
    with pytest.raises(ReceiptError, match="invisible duration passed"):
        e.ack(again.receipt, T0 + 66 * SECOND)


def test_an_acked_record_is_never_handed_out_again_and_a_second_ack_is_refused():
    e = engine()
    fill(e, [None])
    (d,) = e.receive(1, T0, SECOND)
    e.ack(d.receipt, T0)
    assert e.receive(5, T0 + 100 * SECOND, SECOND) == []
    with pytest.raises(ReceiptError, match="acked or dead-lettered"):
        e.ack(d.receipt, T0)


def test_after_max_delivery_attempts_a_record_becomes_a_dead_letter_and_its_group_goes_on():
    e = engine(max_delivery_attempts=2)
    fill(e, ["a", "a"])
    now = T0
    for attempt in (1, 2):
        (d,) = e.receive(5, now, SECOND)
        assert (d.receipt.offset, d.delivery_attempt) == (0, attempt)
        now += SECOND
    assert e.receive(5, now, SECOND) == []  # dying: the group waits for the dead letter
    (dead,) = e.take_dead_letters(now)
    assert (dead.offset, dead.attempts) == (0, 2)
    assert e.committable(now)[0] == 0
    e.dead_lettered(0)
    assert offsets(e.receive(5, now, SECOND)) == [1]
    assert e.committable(now)[0] == 1
    with pytest.raises(IllegalTransitionError):
        e.dead_lettered(1)  # invisible, no dead letter owed


def test_the_committable_offset_stops_at_the_lowest_unacked_record():
    e = engine()
    fill(e, [None, None, None])
    ds = e.receive(3, T0, SECOND)
    e.ack(ds[2].receipt, T0)
    e.ack(ds[1].receipt, T0)
    offset, metadata = e.committable(T0, "c:1")
    done, leases, owner = split_metadata(metadata)
    assert (offset, owner) == (0, "c:1")
    assert done.startswith(DONE_FIELD_PREFIX)
    assert decode_leases(leases, 0) == {0: Lease(1, T0 + SECOND)}
    e.ack(ds[0].receipt, T0)
    assert e.committable(T0, "c:1") == (3, "c:1")


def test_a_new_owner_keeps_the_attempts_and_the_deadline_and_skips_what_was_acked():
    old = engine()
    fill(old, ["a", "a", None, None])
    ds = old.receive(10, T0, 30 * SECOND)  # 0 (a's head), 2, 3
    old.ack(ds[2].receipt, T0)
    commit = old.committable(T0)
    new = PartitionEngine.restore("t", 0, *commit, key_of=lambda r: message_group_of(r.headers))
    for offset in range(commit[0], 4):
        new.offer(offset, rec(["a", "a", None, None][offset]), T0 + SECOND)
    assert new.in_flight == 2 and new.leased == 2
    assert new.receive(10, T0 + SECOND, SECOND) == []  # still invisible: the old deadline
    with pytest.raises(ReceiptError, match="earlier owner"):
        new.ack(ds[0].receipt, T0 + SECOND)
    back = new.receive(10, T0 + 30 * SECOND, SECOND)
    assert [(d.receipt.offset, d.delivery_attempt) for d in back] == [(0, 2), (2, 2)]


def test_first_deliveries_wait_while_max_leased_records_hold_leases():
    e = engine(max_leased=2)
    fill(e, [None, None, None])
    ds = e.receive(5, T0, SECOND)
    assert offsets(ds) == [0, 1]
    assert offsets(e.receive(5, T0 + SECOND, SECOND)) == [0, 1]  # redeliveries still go
    assert e.receive(5, T0 + SECOND, SECOND) == []
    (d0, _) = e.receive(5, T0 + 2 * SECOND, SECOND)
    e.ack(d0.receipt, T0 + 2 * SECOND)
    assert offsets(e.receive(5, T0 + 2 * SECOND, SECOND)) == [2]


def test_a_skipped_record_is_done_at_once():
    e = engine()
    e.skip(0)
    fill(e, [None], start=1)
    assert e.committable(T0) == (1, "")
    (d,) = e.receive(1, T0, SECOND)
    e.ack(d.receipt, T0)
    assert e.committable(T0) == (2, "")


def test_settings_and_durations_are_checked():
    with pytest.raises(ConfigError, match="max_delivery_attempts"):
        engine(max_delivery_attempts=0)
    with pytest.raises(ConfigError, match="max_leased"):
        engine(max_leased=True)
    with pytest.raises(ConfigError, match="invisible duration"):
        engine().receive(1, T0, 0)


def test_the_transition_table_has_one_way_out_of_done_none():
    assert TRANSITIONS[RecordState.DONE] == frozenset()
    assert RecordState.DONE in TRANSITIONS[RecordState.DYING]


def test_message_group_of_takes_the_last_header_and_an_empty_one_is_none():
    assert message_group_of([(H.MESSAGE_GROUP, b"a"), (H.MESSAGE_GROUP, b"b")]) == b"b"
    assert message_group_of([(H.MESSAGE_GROUP, b"")]) is None
    assert message_group_of(None) is None


# -- the lease field ---------------------------------------------------------------------------
def test_the_lease_field_round_trips_and_sits_between_done_field_and_owner():
    leases = {5: Lease(1, T0 + 10), 9: Lease(3, T0 - 50), 700_000: Lease(16, T0 + 3_600_000)}
    field = encode_leases(5, T0, leases)
    assert field.startswith(LEASE_FIELD_PREFIX)
    decoded = decode_leases(field, 5)
    assert decoded[5] == leases[5] and decoded[700_000] == leases[700_000]
    assert decoded[9] == Lease(3, T0)  # a past deadline reads as visible at the commit
    metadata = compose_metadata("rmqdone1.x", field, "client:3")
    assert split_metadata(metadata) == ("rmqdone1.x", field, "client:3")
    assert split_metadata(compose_metadata("", field, "o")) == ("", field, "o")
    assert split_metadata("client:3") == ("", "", "client:3")
    assert encode_leases(0, T0, {}) == ""


def test_the_worst_case_lease_field_fits_beside_the_done_field_in_kafkas_4096():
    worst = {i * (1 << 20): Lease((1 << 14) - 1, T0 + (1 << 28) - 1) for i in range(MAX_LEASED)}
    field = encode_leases((1 << 62) - 1, T0, {(1 << 62) - 1 + o: v for o, v in worst.items()})
    assert len(field) <= 4 * MAX_LEASED * MAX_ENTRY_BYTES // 3 + 64
    owner = "c" * MAX_OWNER_CHARS + ":0"
    assert len(compose_metadata("d" * DONE_METADATA_BYTES, field, owner)) <= 4096
    with pytest.raises(ConfigError, match="at most 128"):
        engine(max_leased=MAX_LEASED + 1)


def test_a_withdrawn_delivery_spends_no_attempt_and_is_deliverable_again_at_once():
    e = engine(max_delivery_attempts=2)
    fill(e, ["a", "a", None])
    batch = e.receive(5, T0, 30 * SECOND)
    assert offsets(batch) == [0, 2]
    for delivery in batch:  # the commit carrying the batch failed
        e.withdraw(delivery)
    assert e.in_flight == 0 and e.leased == 0
    assert split_metadata(e.committable(T0)[1])[1] == ""  # no lease written
    for now in (T0, T0 + SECOND, T0 + 2 * SECOND):  # more rounds than max attempts
        again = e.receive(5, now, 30 * SECOND)
        assert [(d.receipt.offset, d.delivery_attempt) for d in again] == [(0, 1), (2, 1)]
        for delivery in again:
            e.withdraw(delivery)
    assert e.take_dead_letters(T0 + 60 * SECOND) == []
    # A redelivery withdrawn keeps the attempts of the deliveries that were handed out.
    e = engine()
    fill(e, [None])
    (first,) = e.receive(5, T0, SECOND)
    (second,) = e.receive(5, T0 + SECOND, SECOND)
    assert second.delivery_attempt == 2
    e.withdraw(second)
    e.withdraw(first)  # not current: left alone
    (third,) = e.receive(5, T0 + SECOND, SECOND)
    assert (third.receipt.offset, third.delivery_attempt) == (0, 2)


@pytest.mark.parametrize(
    "damage",
    [
        lambda f: f[:-3],  # truncated checksum
        lambda f: f.replace(LEASE_FIELD_PREFIX + "5.", LEASE_FIELD_PREFIX + "6."),  # other base
        lambda f: f[: len(LEASE_FIELD_PREFIX) + 8] + "Z" + f[len(LEASE_FIELD_PREFIX) + 9 :],
        lambda f: "rmqlease1.5.1.bAAAA.00000000",  # offset 5 with 0 attempts
        lambda f: "garbage",
    ],
)
def test_a_damaged_lease_field_is_refused(damage):
    field = encode_leases(5, T0, {5: Lease(1, T0), 6: Lease(2, T0)})
    with pytest.raises(ValueError):
        decode_leases(damage(field), 5)


def test_a_damaged_lease_field_is_ignored_on_restore_with_one_warning(caplog):
    e = PartitionEngine.restore("t", 0, 4, compose_metadata("", "rmqlease1.4.0.b.x", "o"))
    assert "ignoring the leases" in caplog.text and "t[0]" in caplog.text
    assert e.offer(4, rec(), T0)
    (d,) = e.receive(1, T0, SECOND)
    assert d.delivery_attempt == 1


def test_without_a_limit_a_record_is_delivered_again_and_again_and_never_dead_lettered():
    e = engine(max_delivery_attempts=None)
    fill(e, ["a", "a"])
    now = T0
    for attempt in range(1, 40):
        (d,) = e.receive(5, now, SECOND)
        assert (d.receipt.offset, d.delivery_attempt) == (0, attempt)
        now += SECOND
        assert e.take_dead_letters(now) == []


def test_a_redelivery_behind_waiting_first_deliveries_goes_out_at_the_lease_bound():
    e = engine(max_leased=1)
    fill(e, [None] * 5)
    (d0,) = e.receive(5, T0, SECOND)
    e.ack(d0.receipt, T0)
    (d1,) = e.receive(5, T0, SECOND)
    assert d1.receipt.offset == 1
    (again,) = e.receive(5, T0 + SECOND, SECOND)  # offsets 2..4 wait: 1 holds the lease
    assert (again.receipt.offset, again.delivery_attempt) == (1, 2)


def test_the_simple_consumer_settings_default_to_the_engine_s():
    from rmq_semantics.settings import SIMPLE_MAX_LEASED, SimpleConsumerSettings
    from rmq_semantics.simple.engine import DEFAULT_MAX_DELIVERY_ATTEMPTS

    defaults = SimpleConsumerSettings()
    assert defaults.max_delivery_attempts == DEFAULT_MAX_DELIVERY_ATTEMPTS
    assert defaults.max_leased == DEFAULT_MAX_LEASED
    assert SIMPLE_MAX_LEASED == MAX_LEASED
    assert SimpleConsumerSettings(max_leased=MAX_LEASED).max_leased == MAX_LEASED
    with pytest.raises(ConfigError, match=r"max_leased must be at most 128 .* got 500"):
        SimpleConsumerSettings(max_leased=500)
