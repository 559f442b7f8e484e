"""The queue-lock table (pure): grant, renew, deny, takeover with epoch+1, release,
illegal transitions, restore after a coordinator takeover, and the record codec."""

from __future__ import annotations

import pytest

from coordinator.lock import LockEntry, LockKey, LockState, LockTable, transition
from rmq_semantics.errors import ConfigError, IllegalTransitionError, MalformedRecordError
from rmq_semantics.records.codec import decode_as, decode_lock_state, encode
from rmq_semantics.records.locks import LockReply, LockRequest, QueueRef, QueueResult, RequestKind

KEY = LockKey("group/with/slashes", "orders", 3)
LEASE = 3000


def test_first_lock_is_granted_with_epoch_one_and_a_lease():
    table = LockTable()
    d = table.lock(KEY, "a", LEASE, now_ms=1000)
    assert (d.granted, d.reason, d.epoch, d.expires_at_ms) == (True, "granted", 1, 4000)
    assert table.get(KEY).state is LockState.HELD
    assert d.entry == table.get(KEY)


def test_holder_renews_with_the_same_epoch_and_a_fresh_lease():
    table = LockTable()
    table.lock(KEY, "a", LEASE, now_ms=1000)
    d = table.lock(KEY, "a", LEASE, now_ms=3500)
    assert (d.granted, d.reason, d.epoch, d.expires_at_ms) == (True, "renewed", 1, 6500)
    assert table.get(KEY).acquired_at_ms == 1000


def test_other_client_is_denied_while_the_lease_is_live():
    table = LockTable()
    table.lock(KEY, "a", LEASE, now_ms=1000)
    d = table.lock(KEY, "b", LEASE, now_ms=3999)
    assert (d.granted, d.reason, d.client_id, d.epoch, d.entry) == (
        False,
        "held_by_other",
        "a",
        1,
        None,
    )
    assert table.get(KEY).client_id == "a"


def test_lapsed_lease_is_taken_over_with_the_next_epoch():
    table = LockTable()
    table.lock(KEY, "a", LEASE, now_ms=1000)
    d = table.lock(KEY, "b", LEASE, now_ms=4000)  # expires_at is exclusive
    assert (d.granted, d.reason, d.client_id, d.epoch) == (True, "taken_over", "b", 2)
    assert table.get(KEY).acquired_at_ms == 4000
    # The old holder is now denied; its renewal does not bring it back.
    assert not table.lock(KEY, "a", LEASE, now_ms=4001).granted


def test_holder_whose_own_lease_lapsed_gets_a_new_epoch():
    table = LockTable()
    table.lock(KEY, "a", LEASE, now_ms=0)
    d = table.lock(KEY, "a", LEASE, now_ms=LEASE)
    assert (d.granted, d.reason, d.epoch) == (True, "taken_over", 2)


def test_release_by_the_holder_frees_the_lock_and_epochs_keep_growing():
    table = LockTable()
    table.lock(KEY, "a", LEASE, now_ms=0)
    assert not table.unlock(KEY, "b", now_ms=10).granted  # not the holder
    assert not table.unlock(KEY, "a", now_ms=10, epoch=7).granted  # stale epoch
    d = table.unlock(KEY, "a", now_ms=10, epoch=1)
    assert (d.granted, d.reason) == (True, "released")
    assert table.get(KEY).state is LockState.RELEASED
    assert not table.unlock(KEY, "a", now_ms=11).granted  # already released
    d = table.lock(KEY, "b", LEASE, now_ms=20)  # no need to wait for the lease
    assert (d.granted, d.reason, d.epoch) == (True, "granted", 2)
    d = table.lock(KEY, "a", LEASE, now_ms=20 + LEASE)
    assert d.epoch == 3
    epochs = [e.epoch for e in table]
    assert epochs == [3]


def test_epochs_are_per_queue():
    table = LockTable()
    other = LockKey(KEY.group, KEY.topic, 4)
    table.lock(KEY, "a", LEASE, now_ms=0)
    table.unlock(KEY, "a", now_ms=1)
    assert table.lock(KEY, "a", LEASE, now_ms=2).epoch == 2
    assert table.lock(other, "a", LEASE, now_ms=2).epoch == 1


@pytest.mark.parametrize(
    "current, target",
    [
        (LockState.FREE, LockState.RELEASED),
        (LockState.FREE, LockState.EXPIRED),
        (LockState.RELEASED, LockState.EXPIRED),
        (LockState.EXPIRED, LockState.RELEASED),
        (LockState.RELEASED, LockState.RELEASED),
        (LockState.HELD, LockState.FREE),
    ],
)
def test_illegal_transitions_raise(current, target):
    with pytest.raises(IllegalTransitionError, match=f"{current.value} to {target.value}"):
        transition(current, target)
    with pytest.raises(IllegalTransitionError):
        LockEntry(KEY, current).moved(target)


def test_every_legal_transition_is_in_the_one_table():
    assert transition(LockState.FREE, LockState.HELD) is LockState.HELD
    for target in (LockState.HELD, LockState.RELEASED, LockState.EXPIRED):
        assert transition(LockState.HELD, target) is target
    for current in (LockState.RELEASED, LockState.EXPIRED):
        assert transition(current, LockState.HELD) is LockState.HELD


def test_expire_marks_only_lapsed_leases():
    table = LockTable()
    table.lock(KEY, "a", LEASE, now_ms=0)
    assert not table.expire(KEY, now_ms=LEASE - 1).granted
    d = table.expire(KEY, now_ms=LEASE)
    assert (d.granted, table.get(KEY).state) == (True, LockState.EXPIRED)
    assert table.lock(KEY, "b", LEASE, now_ms=LEASE + 1).epoch == 2


def test_bad_requests_are_config_errors():
    table = LockTable()
    with pytest.raises(ConfigError):
        table.lock(KEY, "", LEASE, now_ms=0)
    with pytest.raises(ConfigError):
        table.lock(KEY, "a", 0, now_ms=0)


def test_overlay_stages_changes_until_absorbed():
    table = LockTable()
    table.lock(KEY, "a", LEASE, now_ms=0)
    staged = table.overlay()
    assert staged.lock(KEY, "a", LEASE, now_ms=100).reason == "renewed"  # reads through
    other = LockKey(KEY.group, KEY.topic, 9)
    staged.lock(other, "b", LEASE, now_ms=100)
    assert table.get(other).state is LockState.FREE  # not yet
    assert table.get(KEY).expires_at_ms == LEASE
    table.absorb(staged)
    assert table.get(other).client_id == "b"
    assert table.get(KEY).expires_at_ms == 100 + LEASE


def test_restore_extends_held_leases_and_never_goes_back_in_epoch():
    table = LockTable()
    held = LockEntry(KEY, LockState.HELD, "a", 5, LEASE, 0, 1000, 0)
    restored = table.restore(held, now_ms=900, grace_ms=LEASE)
    assert restored.expires_at_ms == 900 + LEASE  # a full lease from the takeover
    assert not table.lock(KEY, "b", LEASE, now_ms=3000).granted
    assert table.lock(KEY, "a", LEASE, now_ms=3000).reason == "renewed"
    older = LockEntry(KEY, LockState.RELEASED, "a", 4, LEASE, 0, 0, 0)
    assert table.restore(older, now_ms=3001, grace_ms=LEASE).epoch == 5
    assert table.lock(KEY, "b", LEASE, now_ms=10_000).epoch == 6


def test_lock_keys_round_trip_even_with_slashes_in_the_group():
    assert str(KEY) == "group/with/slashes/orders/3"
    assert LockKey.parse(str(KEY)) == KEY
    for bad in ("orders/3", "g/t/x", "/t/1", "g//1"):
        with pytest.raises(ConfigError):
            LockKey.parse(bad)


def test_records_round_trip_and_garbage_is_malformed():
    request = LockRequest(
        RequestKind.UNLOCK, "r1", "c1", "g", 2, (QueueRef("t", 0, 3), QueueRef("t", 1)), 0, 123
    )
    assert decode_as(LockRequest, encode(request)) == request
    reply = LockReply(
        "r1", "c1", RequestKind.LOCK, (QueueResult("t", 0, True, "granted", 1, 3000, 99, "c1"),)
    )
    assert decode_as(LockReply, encode(reply)) == reply
    entry = LockEntry(KEY, LockState.HELD, "a", 2, LEASE, 10, 20, 30)
    key, value = entry.key.record_key(), encode(entry)
    assert key == str(KEY).encode()
    assert decode_lock_state(key, value) == entry
    with pytest.raises(MalformedRecordError, match="does not match"):
        decode_lock_state(b"other/t/1", value)
    for garbage in (
        None,
        b"",
        b"not json",
        b"[]",
        b'{"v": 99}',
        b'{"v": 1, "kind": "x"}',
        b'{"v": 1, "kind": "lock", "queues": [{"topic": 1}]}',
        encode(reply),
    ):
        with pytest.raises(MalformedRecordError):
            decode_as(LockRequest, garbage)


def _request(client_id: str = "c1", topic: str = "orders", queues: int = 1) -> LockRequest:
    return LockRequest(
        RequestKind.LOCK,
        "r1",
        client_id,
        "g",
        0,
        tuple(QueueRef(topic, q) for q in range(queues)),
        60000,
    )


def test_a_lock_request_whose_reply_could_not_be_written_is_refused_with_a_reason():
    from coordinator.lock import lock_request_problem

    assert lock_request_problem(_request()) is None
    assert lock_request_problem(_request(queues=2000)) is None  # a big consumer, answered
    assert "client_id of 600000" in lock_request_problem(_request("x" * 600_000))
    assert "client_id of 256" in lock_request_problem(_request("x" * 256))
    assert "not a Kafka partition" in lock_request_problem(_request(topic=".."))
    assert "send fewer" in lock_request_problem(_request(queues=3000))


def test_a_request_that_fails_alone_replay_max_times_is_set_aside():
    from coordinator.lock import RequestPoison

    poison = RequestPoison(replay_max=2)
    batch = [(0, 5), (0, 6), (0, 7)]
    assert not poison.suspect(batch) and poison.failed(batch) is None
    assert poison.suspect(batch)  # each goes alone now
    poison.passed([(0, 5)])
    assert poison.failed([(0, 6)]) is None and (0, 6) not in poison
    assert poison.failed([(0, 6)]) == (0, 6) and (0, 6) in poison
    poison.passed([(0, 7)])
    assert not poison.suspect(batch)
