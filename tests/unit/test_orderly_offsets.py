"""The offset tracker against a brute-force model: a plain set of done offsets.

Records enter in offset order (with gaps in the numbering) and complete in random orders;
at any moment a commit, restored, must leave exactly the unfinished records to process.
"""

from __future__ import annotations

import base64
import logging
import random
import zlib

import pytest

from rmq_semantics.errors import IllegalStateError
from rmq_semantics.orderly.commits import _epoch_of
from rmq_semantics.orderly.offsets import (
    DEFAULT_MAX_METADATA_BYTES,
    DONE_FIELD_PREFIX,
    OffsetTracker,
    compose_metadata,
    split_metadata,
)

OWNER = "orders@1a2b3c:7"
KAFKA_METADATA_LIMIT = 4096  # offset.metadata.max.bytes default (GroupCoordinatorConfig)


class Model:
    """The brute force: the offsets given, and the set of those done."""

    def __init__(self) -> None:
        self.given: list[int] = []
        self.done: set[int] = set()

    def committed(self) -> int:
        unfinished = [o for o in self.given if o not in self.done]
        return min(unfinished) if unfinished else self.given[-1] + 1

    def unfinished(self) -> set[int]:
        return set(self.given) - self.done


def offsets_with_gaps(rng: random.Random, count: int, start: int = 0) -> list[int]:
    """``count`` increasing offsets from ``start``; about one in five skips 1 to 20."""
    out, offset = [], start
    for _ in range(count):
        offset += 1 if rng.random() < 0.8 else rng.randint(2, 21)
        out.append(offset)
    return out


def replay(tracker: OffsetTracker, offsets: list[int]) -> set[int]:
    """The offsets a restored tracker hands over for processing."""
    return {o for o in offsets if tracker.add(o)}


def restored(tracker: OffsetTracker, **kwargs) -> OffsetTracker:
    committed, metadata = tracker.committable(OWNER)
    return OffsetTracker.restore(committed, metadata, **kwargs)


# -- against the model ---------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(40))
def test_random_completion_orders_match_the_model_and_every_restore(seed):
    rng = random.Random(seed)
    offsets = offsets_with_gaps(rng, rng.randint(1, 400), start=rng.randint(0, 10**9))
    tracker, model = OffsetTracker(), Model()
    pending: list[int] = []
    feed = iter(offsets)
    while True:
        if rng.random() < 0.55 or not pending:  # take the next record
            offset = next(feed, None)
            if offset is None:
                break
            assert tracker.add(offset) is True
            model.given.append(offset)
            pending.append(offset)
        else:  # finish any unfinished record
            offset = pending.pop(rng.randrange(len(pending)))
            assert tracker.done(offset) is True
            model.done.add(offset)
        committed, metadata = tracker.committable(OWNER)
        assert committed == model.committed()
        assert tracker.in_flight == len(pending)
        if rng.random() < 0.2:  # a takeover now: exactly the unfinished ones are redone
            again = OffsetTracker.restore(committed, metadata)
            assert replay(again, [o for o in offsets if o >= committed]) == model.unfinished() | {
                o for o in offsets if o > model.given[-1]
            }
    for offset in rng.sample(pending, len(pending)):
        tracker.done(offset)
    assert tracker.committable(OWNER) == (offsets[-1] + 1, OWNER)
    assert tracker.gap == 0


def test_a_long_stream_with_a_sliding_window_matches_the_model():
    """120,000 offsets, 64 in flight finishing at random, one left behind for long spells:
    the bitmap's head is dropped as the commit moves on, and restores still match."""
    rng = random.Random(21)
    tracker, model = OffsetTracker(), Model()
    window: list[int] = []
    laggard = None
    for offset in offsets_with_gaps(rng, 120_000):
        tracker.add(offset)
        model.given.append(offset)
        window.append(offset)
        if laggard is None and rng.random() < 0.0005:
            laggard = window.pop(0)  # held for a while: the gap grows past 4 KiB of bitmap
        if len(window) > 64:
            finished = window.pop(rng.randrange(len(window)))
            tracker.done(finished)
            model.done.add(finished)
        if laggard is not None and rng.random() < 0.00005:
            tracker.done(laggard)
            model.done.add(laggard)
            laggard = None
        if offset % 5000 < 2:
            committed, metadata = tracker.committable(OWNER)
            assert committed == model.committed()
            rest = [o for o in model.given if o >= committed]
            assert replay(OffsetTracker.restore(committed, metadata), rest) == model.unfinished()
    assert tracker.in_flight == len(model.unfinished())


@pytest.mark.parametrize("seed", range(10))
def test_a_restored_tracker_goes_on_and_commits_like_the_model(seed):
    """Takeover after takeover: the work done by each holder is never done again."""
    rng = random.Random(1000 + seed)
    offsets = offsets_with_gaps(rng, 300)
    processed: list[int] = []
    committed, metadata = 0, ""
    for _holder in range(5):
        tracker = OffsetTracker.restore(committed, metadata)
        todo = [o for o in offsets if o >= committed and tracker.add(o)]
        rng.shuffle(todo)
        for offset in todo[: rng.randint(0, len(todo))]:  # dies after some of them
            tracker.done(offset)
            processed.append(offset)
        committed, metadata = tracker.committable(OWNER)
    tracker = OffsetTracker.restore(committed, metadata)
    for offset in offsets:
        if offset >= committed and tracker.add(offset):
            tracker.done(offset)
            processed.append(offset)
    assert sorted(processed) == offsets  # each exactly once


def test_restored_done_offsets_are_skipped_and_carried_to_the_next_commit():
    tracker = OffsetTracker()
    for offset in range(100, 110):
        tracker.add(offset)
    for offset in (102, 105, 106):
        tracker.done(offset)
    again = restored(tracker)
    assert [o for o in range(100, 104) if again.add(o)] == [100, 101, 103]
    again.done(100)
    committed, metadata = again.committable(OWNER)  # 105, 106 not seen yet, still done
    assert committed == 101
    assert replay(OffsetTracker.restore(committed, metadata), list(range(101, 110))) == {
        101,
        103,
        104,
        107,
        108,
        109,
    }


def test_offsets_never_given_are_no_work_and_do_not_hold_the_commit():
    tracker = OffsetTracker(start=50)  # 50..59 compacted away
    tracker.add(60)
    tracker.add(70)  # a gap: 61..69
    assert tracker.committable() == (60, "")
    tracker.done(60)
    assert tracker.committable() == (70, "")
    tracker.done(70)
    assert tracker.committable() == (71, "")


def test_a_restored_offset_that_never_comes_back_does_not_hold_the_commit():
    tracker = OffsetTracker()
    for offset in range(10):
        tracker.add(offset)
    tracker.done(5)
    again = restored(tracker)  # 0..4 were compacted away since
    assert again.add(5) is False
    assert again.add(6) is True
    again.done(6)
    assert again.committable() == (7, "")


def test_repeated_done_is_ignored_and_unknown_offsets_are_refused():
    tracker = OffsetTracker()
    tracker.add(3)
    tracker.add(5)
    assert tracker.done(5) is True
    assert tracker.done(5) is False
    assert tracker.done(4) is False  # a gap: never work
    with pytest.raises(IllegalStateError, match="never given"):
        tracker.done(6)
    with pytest.raises(IllegalStateError, match="offset order"):
        tracker.add(5)
    assert OffsetTracker().committable() is None


# -- the metadata string -------------------------------------------------------------------
def test_the_owner_stays_readable_and_its_epoch_parses():
    tracker = OffsetTracker()
    for offset in range(20):
        tracker.add(offset)
    tracker.done(7)
    _, metadata = tracker.committable(OWNER)
    field, owner = split_metadata(metadata)
    assert field.startswith(DONE_FIELD_PREFIX)
    assert owner == OWNER
    assert _epoch_of(metadata) == 7
    assert split_metadata(OWNER) == ("", OWNER)
    assert compose_metadata("", OWNER) == OWNER
    assert metadata.isascii()


@pytest.mark.parametrize("owner", ["client-1:3", ""])
def test_partition_mode_metadata_means_nothing_done_without_a_warning(owner, caplog):
    with caplog.at_level(logging.WARNING):
        tracker = OffsetTracker.restore(40, owner)
    assert replay(tracker, [40, 41, 42]) == {40, 41, 42}
    assert caplog.records == []


def _good_metadata() -> tuple[int, str]:
    tracker = OffsetTracker()
    for offset in range(1000, 1100):
        tracker.add(offset)
    for offset in range(1001, 1100, 3):
        tracker.done(offset)
    return tracker.committable(OWNER)


def _mutations() -> list[tuple[str, int, str]]:
    committed, good = _good_metadata()
    field, _ = split_metadata(good)
    head, _, crc = field.rpartition(".")
    flipped = head[:-1] + ("A" if head[-1] != "A" else "B")
    return [
        ("foreign", committed, "some other client's note"),
        ("truncated", committed, good[: len(field) // 2]),
        ("truncated crc", committed, field[:-2]),
        ("altered payload", committed, f"{flipped}.{crc}|{OWNER}"),
        ("stale offset", committed + 1, good),
        ("older offset", committed - 5, good),
        (
            "unknown codec",
            committed,
            field.replace(f"{committed}.b", f"{committed}.q").replace(
                f"{committed}.z", f"{committed}.q"
            ),
        ),
        ("bad base64", committed, f"{DONE_FIELD_PREFIX}{committed}.b!!!.{crc}"),
        ("bad deflate", committed, f"{DONE_FIELD_PREFIX}{committed}.zAAAA.{crc}"),
        ("garbage", committed, DONE_FIELD_PREFIX + "\x00\xff..|x"),
        ("no commit", -1, good),
    ]


@pytest.mark.parametrize(
    ("committed", "metadata"), [pytest.param(c, m, id=name) for name, c, m in _mutations()]
)
def test_malformed_metadata_redoes_everything_with_one_warning(committed, metadata, caplog):
    with caplog.at_level(logging.WARNING, logger="rmq_semantics.orderly.offsets"):
        tracker = OffsetTracker.restore(committed, metadata, where="orders[3]")
    start = max(committed, 0)
    assert replay(tracker, list(range(start, start + 150))) == set(range(start, start + 150))
    assert len(caplog.records) == 1
    assert "orders[3]" in caplog.text
    assert "processed again" in caplog.text


def test_a_field_marking_the_committed_offset_done_is_refused(caplog):
    bitmap = bytes([0b11])  # offsets 0 and 1 done, but the commit says 0 is next
    payload = base64.urlsafe_b64encode(bitmap).rstrip(b"=").decode()
    field = f"{DONE_FIELD_PREFIX}0.b{payload}.{zlib.crc32(bitmap):08x}"
    tracker = OffsetTracker.restore(0, field)
    assert replay(tracker, [0, 1, 2]) == {0, 1, 2}
    assert "at or below" in caplog.text


# -- the bound and back-pressure -----------------------------------------------------------
def _stuck_at_low(span: int, pattern) -> OffsetTracker:
    """Offset 0 unfinished; of 1..span-1, those ``pattern(offset)`` says are done."""
    tracker = OffsetTracker()
    for offset in range(span):
        tracker.add(offset)
    for offset in range(1, span):
        if pattern(offset):
            tracker.done(offset)
    return tracker


def test_worst_case_random_pattern_holds_17_700_offsets_within_the_bound():
    rng = random.Random(7)
    holds = _stuck_at_low(17_700, lambda _o: rng.random() < 0.5)
    assert holds.accepting()
    _, metadata = holds.committable()
    assert len(metadata) <= DEFAULT_MAX_METADATA_BYTES
    rng = random.Random(7)
    over = _stuck_at_low(18_000, lambda _o: rng.random() < 0.5)
    assert over.full
    assert over.status().back_pressure


def test_alternating_and_stuck_record_patterns_hold_far_more():
    alternating = _stuck_at_low(100_000, lambda o: o % 2 == 1)
    stuck = _stuck_at_low(500_000, lambda _o: True)
    for tracker in (alternating, stuck):
        assert tracker.accepting()
        assert len(tracker.committable(OWNER)[1]) < 1000


def test_the_span_bound_applies_even_when_the_encoding_is_small():
    tracker = _stuck_at_low(1001, lambda _o: True)
    tracker.max_span = 1000
    assert tracker.full
    tracker.done(0)
    assert tracker.accepting()


def test_finishing_the_lowest_unfinished_always_relieves_back_pressure():
    rng = random.Random(11)
    tracker = _stuck_at_low(30_000, lambda _o: rng.random() < 0.5)
    assert tracker.full
    steps = 0
    while tracker.full:
        gap = tracker.gap
        tracker.done(tracker.lowest_unfinished)
        assert tracker.gap < gap
        steps += 1
    assert steps < 30_000
    assert len(tracker.committable(OWNER)[1]) <= KAFKA_METADATA_LIMIT


def test_over_the_bound_the_commit_carries_a_prefix_and_never_skips_unfinished_work():
    rng = random.Random(5)
    done = {o for o in range(1, 40_000) if rng.random() < 0.5}
    tracker = _stuck_at_low(40_000, lambda o: o in done)
    committed, metadata = tracker.committable(OWNER)
    assert len(split_metadata(metadata)[0]) <= DEFAULT_MAX_METADATA_BYTES
    again = replay(OffsetTracker.restore(committed, metadata), list(range(40_000)))
    unfinished = set(range(40_000)) - done
    assert unfinished <= again  # never skips unfinished work
    assert len(again - unfinished) < 40_000 - 17_000  # the prefix's done offsets are skipped


def test_a_restored_state_over_the_bound_never_stalls_the_partition():
    """Restored by a holder with a smaller bound: nothing in flight, so records are taken;
    once some are, back-pressure waits for them; finishing them lets more in."""
    rng = random.Random(9)
    done = {o for o in range(1, 15_000) if rng.random() < 0.5}
    committed, metadata = _stuck_at_low(15_000, lambda o: o in done).committable(OWNER)
    small = OffsetTracker.restore(committed, metadata, max_metadata_bytes=500)
    assert small.full is False  # nothing in flight: waiting would never help
    taken, waits = [], 0
    for offset in range(committed, 15_000):
        while not small.accepting():
            waits += 1
            small.done(small.lowest_unfinished)
        if small.add(offset):
            taken.append(offset)
    while small.in_flight:
        small.done(small.lowest_unfinished)
    assert taken == [o for o in range(15_000) if o not in done]
    assert waits > 0
    assert small.committable() == (15_000, "")


def test_a_restored_span_beyond_max_span_is_ignored(caplog):
    stuck = _stuck_at_low(200_000, lambda _o: True)
    committed, metadata = stuck.committable(OWNER)
    tracker = OffsetTracker.restore(committed, metadata, max_span=100_000)
    assert tracker.gap == 0
    assert "spans more than" in caplog.text


def test_status_reports_in_flight_gap_and_back_pressure():
    tracker = OffsetTracker(max_metadata_bytes=30)
    for offset in range(10, 20):
        tracker.add(offset)
    tracker.done(15)
    status = tracker.status()
    assert (status.in_flight, status.gap, status.back_pressure) == (9, 6, False)
    assert status.metadata_bytes == len(split_metadata(tracker.committable()[1])[0])
    for offset in range(100, 300):
        tracker.add(offset)
    tracker.done(299)
    assert tracker.status().back_pressure


# -- encoding size for 10,000 offsets ------------------------------------------------------
def _zipf_keys(rng: random.Random, count: int, keys: int = 1000, s: float = 1.1) -> list[int]:
    weights = [1 / (k + 1) ** s for k in range(keys)]
    return rng.choices(range(keys), weights=weights, k=count)


def _size(pattern) -> int:
    tracker = _stuck_at_low(10_000, pattern)
    return len(split_metadata(tracker.committable(OWNER)[1])[0])


def test_encoding_size_for_10000_offsets_in_typical_patterns():
    rng = random.Random(3)
    keys = _zipf_keys(rng, 10_000)
    hot = max(set(keys), key=keys.count)
    sizes = {
        "one stuck record": _size(lambda _o: True),
        "16 in flight": _size(lambda o: o % 625 != 0),
        "hot zipf key stuck": _size(lambda o: keys[o] != hot),
        "alternating": _size(lambda o: o % 2 == 1),
        "random half": _size(lambda _o: rng.random() < 0.5),
    }
    assert sizes["one stuck record"] < 60
    assert sizes["16 in flight"] < 150
    assert sizes["alternating"] < 100
    assert sizes["hot zipf key stuck"] < 1500
    assert sizes["random half"] < 1700  # the raw bitmap: 10,000 bits
    assert max(sizes.values()) + len(OWNER) + 1 < KAFKA_METADATA_LIMIT
