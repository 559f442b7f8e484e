"""The key scheduler without a broker: per-key order, one in flight per key, suspend,
fairness and revocation, under random finish orders (seeded)."""

from __future__ import annotations

import itertools
import random
from collections import defaultdict

import pytest

from rmq_semantics.errors import ConfigError, IllegalStateError
from rmq_semantics.orderly import OrderlyMessage
from rmq_semantics.orderly.keys import KeyScheduler, KeysStatus, ordering_key
from rmq_semantics.records.headers import H

TP = ("orders", 0)


def rec(
    offset: int, key: bytes | None = None, group: str | None = None, tp: tuple[str, int] = TP
) -> OrderlyMessage:
    headers = ((H.MESSAGE_GROUP, group.encode()),) if group is not None else ()
    return OrderlyMessage(tp[0], tp[1], offset, key, b"v", headers, 0)


def drain(sched: KeyScheduler, now: float = 0.0) -> list[OrderlyMessage]:
    out = []
    while (record := sched.next_ready(now)) is not None:
        out.append(record)
    return out


# -- the ordering key ----------------------------------------------------------------------
def test_the_ordering_key_is_the_group_else_the_key_else_the_partition():
    assert ordering_key(rec(1, key=b"k", group="g")) == ("orders", 0, "g", b"g")
    assert ordering_key(rec(1, key=b"k")) == ("orders", 0, "k", b"k")
    assert ordering_key(rec(1, key=b"k", group="")) == ("orders", 0, "k", b"k")
    assert ordering_key(rec(1)) == ("orders", 0, "p", None)
    assert ordering_key(rec(1, key=b"k", tp=("orders", 1))) != ordering_key(rec(1, key=b"k"))


def test_the_last_message_group_header_wins():
    record = OrderlyMessage(
        "t", 0, 1, None, b"v", ((H.MESSAGE_GROUP, b"a"), (H.MESSAGE_GROUP, b"b")), 0
    )
    assert ordering_key(record)[3] == b"b"


def test_records_without_key_or_group_go_one_at_a_time_per_partition():
    sched = KeyScheduler(8)
    for offset in range(3):
        sched.offer(rec(offset))
        sched.offer(rec(offset, tp=("orders", 1)))
    assert [(r.partition, r.offset) for r in drain(sched)] == [(0, 0), (1, 0)]


@pytest.mark.parametrize("bad", [0, -1, True, 2.0])
def test_max_in_flight_must_be_a_positive_int(bad):
    with pytest.raises(ConfigError, match="max_in_flight"):
        KeyScheduler(bad)


# -- order and exclusivity under random finish orders --------------------------------------
@pytest.mark.parametrize("seed", range(30))
def test_per_key_order_is_offer_order_and_never_two_in_flight_per_key(seed):
    rng = random.Random(seed)
    sched = KeyScheduler(rng.randint(1, 12))
    partitions = [("orders", p) for p in range(rng.randint(1, 3))]
    offered: dict[tuple, list[int]] = defaultdict(list)
    handled: dict[tuple, list[int]] = defaultdict(list)
    next_offset = dict.fromkeys(partitions, 0)
    in_flight: list[OrderlyMessage] = []
    for _step in range(600):
        if rng.random() < 0.4:
            tp = rng.choice(partitions)
            key = rng.choice([None, b"a", b"b", b"c", *[bytes([k]) for k in range(20)]])
            group = rng.choice([None, None, None, "g1", "g2"])
            record = rec(next_offset[tp], key, group, tp)
            next_offset[tp] += 1
            sched.offer(record)
            offered[ordering_key(record)].append(record.offset)
        elif in_flight and rng.random() < 0.5:
            record = in_flight.pop(rng.randrange(len(in_flight)))
            assert sched.finished(record) is True
        else:
            record = sched.next_ready(0.0)
            if record is not None:
                key = ordering_key(record)
                assert all(ordering_key(r) != key for r in in_flight), "two in flight"
                in_flight.append(record)
                handled[key].append(record.offset)
        assert len(in_flight) == sched.in_flight <= sched.max_in_flight
    while in_flight or sched.queued:
        fresh = drain(sched)
        for record in fresh:
            handled[ordering_key(record)].append(record.offset)
        in_flight += fresh
        for record in rng.sample(in_flight, len(in_flight)):
            sched.finished(record)
        in_flight = []
    for key, offsets in offered.items():
        assert handled[key] == offsets


def test_max_in_flight_bounds_what_is_handed_out():
    sched = KeyScheduler(3)
    for offset in range(10):
        sched.offer(rec(offset, key=bytes([offset])))
    out = drain(sched)
    assert [r.offset for r in out] == [0, 1, 2]
    sched.finished(out[1])
    assert sched.next_ready(0.0).offset == 3
    assert sched.next_ready(0.0) is None


# -- suspend ----------------------------------------------------------------------------------
def test_suspend_delays_only_that_key_and_redelivers_the_same_record_first():
    sched = KeyScheduler(4)
    for offset, key in enumerate([b"a", b"b", b"a", b"b", b"a"]):
        sched.offer(rec(offset, key))
    a0, b1 = drain(sched)
    assert sched.suspend(a0, until=10.0) is True
    assert sched.reconsume_times(a0) == 1
    sched.finished(b1)
    assert [r.offset for r in drain(sched, now=5.0)] == [3]  # b goes on, a waits
    assert sched.next_wakeup() == 10.0
    assert sched.status()[TP] == KeysStatus(in_flight_keys=1, queued=3, suspended_keys=1)
    assert [r.offset for r in drain(sched, now=10.0)] == [0]  # a0 again, before a2
    assert sched.next_wakeup() is None
    assert sched.suspend(a0, until=20.0) is True
    assert sched.reconsume_times(a0) == 2
    assert drain(sched, now=19.9) == []
    redelivered = drain(sched, now=20.0)
    assert [r.offset for r in redelivered] == [0]
    sched.finished(redelivered[0])
    assert sched.reconsume_times(a0) == 0
    assert [r.offset for r in drain(sched, now=20.0)] == [2]


def test_a_stuck_key_never_stalls_the_others_of_its_partition():
    """The same partition: one key suspended again and again, the rest all get done."""
    sched = KeyScheduler(4)
    for offset in range(300):
        sched.offer(rec(offset, b"stuck" if offset % 3 == 0 else bytes([offset % 50])))
    done, now = [], 0.0
    while len(done) < 200:
        for record in drain(sched, now):
            if record.key == b"stuck":
                sched.suspend(record, until=now + 1000.0)
            else:
                sched.finished(record)
                done.append(record.offset)
        now += 1.0
    assert now < 1000.0  # all 200 others finished while the stuck key slept
    assert sorted(done) == [o for o in range(300) if o % 3]


# -- fairness -------------------------------------------------------------------------------------
@pytest.mark.parametrize("max_in_flight", [1, 2, 16])
def test_a_hot_key_with_1000_queued_does_not_starve_a_cold_key(max_in_flight):
    sched = KeyScheduler(max_in_flight)
    for offset in range(1000):
        sched.offer(rec(offset, b"hot"))
    sched.offer(rec(1000, b"cold"))
    picks = []
    for _ in range(max_in_flight + 1):
        record = sched.next_ready(0.0)
        if record is None:  # all slots taken: finish the oldest
            sched.finished(picks[0])
            record = sched.next_ready(0.0)
        picks.append(record)
        if record.key == b"cold":
            break
        sched.finished(record)
    assert picks[-1].key == b"cold"
    assert len(picks) <= max_in_flight + 1


def test_ready_keys_take_turns():
    sched = KeyScheduler(1)
    for offset in range(9):
        sched.offer(rec(offset, [b"a", b"b", b"c"][offset // 3]))  # a a a b b b c c c
    order = []
    while (record := sched.next_ready(0.0)) is not None:
        order.append(record.key)
        sched.finished(record)
    assert order == [b"a", b"b", b"c"] * 3


# -- revocation -----------------------------------------------------------------------------------
def test_drop_partition_returns_its_waiting_records_and_keeps_other_partitions():
    other = ("orders", 1)
    sched = KeyScheduler(4)
    for offset in range(6):
        sched.offer(rec(offset, b"k" if offset % 2 else b"j"))
        sched.offer(rec(offset, b"k", tp=other))
    out = sorted(drain(sched), key=lambda r: (r.offset, r.partition))
    assert [(r.partition, r.offset) for r in out] == [(0, 0), (1, 0), (0, 1)]
    j0, other0, k1 = out
    sched.suspend(j0, until=50.0)
    dropped = sched.drop_partition(TP)
    assert [r.offset for r in dropped] == [0, 2, 3, 4, 5]
    assert sched.status() == {TP: KeysStatus(1, 0, 0), other: KeysStatus(1, 5, 0)}
    assert sched.finished(k1) is False  # dropped while it ran: do not commit
    assert TP not in sched.status()
    assert sched.next_wakeup() is None
    sched.finished(other0)
    assert [r.offset for r in drain(sched, now=100.0)] == [1]


def test_the_longest_backlog_goes_within_two_picks_and_no_key_starves():
    sched = KeyScheduler(1)
    offset = itertools.count()
    for key in [b"hot"] * 50 + [bytes([c]) for c in range(100)]:
        sched.offer(rec(next(offset), key))
    picked = []
    for _ in range(60):
        r = sched.next_ready(0.0)
        picked.append(r.key)
        sched.finished(r)
        if r.key != b"hot":  # cold keys keep arriving: the hot key still runs every other pick
            sched.offer(rec(next(offset), r.key))
    assert picked[::2] == [b"hot"] * 30  # its serial chain never waits behind the cold keys
    assert len(set(picked[1::2])) == 30  # and the ring serves the others in turn


def test_a_key_reassigned_while_its_old_record_runs_waits_for_it():
    sched = KeyScheduler(4)
    sched.offer(rec(0, b"k"))
    old = sched.next_ready(0.0)
    sched.drop_partition(TP)
    sched.offer(rec(0, b"k"))  # the partition is back, read again from the commit
    assert sched.next_ready(0.0) is None  # never two in flight for one key
    assert sched.suspend(old, until=5.0) is False  # not queued again: it was dropped
    assert sched.next_ready(0.0).offset == 0
    assert sched.in_flight == 1


def test_finishing_a_record_that_is_not_in_flight_is_refused():
    sched = KeyScheduler(2)
    sched.offer(rec(0, b"k"))
    sched.offer(rec(1, b"k"))
    with pytest.raises(IllegalStateError, match=r"orders\[0\]@0 is not in flight"):
        sched.finished(rec(0, b"k"))
    sched.next_ready(0.0)
    with pytest.raises(IllegalStateError, match="offset 0 of its key is"):
        sched.finished(rec(1, b"k"))
