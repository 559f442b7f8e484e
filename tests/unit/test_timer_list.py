"""``rmq-semantics timer list`` without a broker: due windows, the counts, the skipped done
offsets, what ``--id`` prints, and one error line for a bad argument or no broker."""

from __future__ import annotations

import socket

import pytest

from rmq_semantics.cli import main
from rmq_semantics.orderly.offsets import OffsetTracker
from rmq_semantics.records.timer import parse_timer
from rmq_semantics.tools import timers
from rmq_semantics.tools.timers import (
    WINDOWS,
    ScheduledTimer,
    TimerCounts,
    TimerLookup,
    describe,
    done_offsets,
    due_window,
)

NOW = 1_800_000_000_000
MIN, HOUR, DAY = 60_000, 3_600_000, 86_400_000


def record(topic: str, due: int, timer_id: str = "id1", group: str | None = "pg"):
    headers = [
        ("rmq.timer_id", timer_id.encode()),
        ("rmq.deliver_at", str(due).encode()),
        ("rmq.real_topic", topic.encode()),
        ("rmq.born_ts", str(NOW - 1000).encode()),
    ]
    if group:
        headers.append(("rmq.producer_group", group.encode()))
    return parse_timer(0, 3, 42, NOW, b"k", b"v", headers)


@pytest.mark.parametrize(
    "remaining, window",
    [
        (-5 * DAY, "overdue"),
        (0, "overdue"),
        (1, "<1 min"),
        (MIN - 1, "<1 min"),
        (MIN, "<1 h"),
        (HOUR, "<1 day"),
        (DAY - 1, "<1 day"),
        (DAY, "later"),
        (3 * DAY, "later"),
    ],
)
def test_a_message_falls_in_the_first_window_it_is_due_before(remaining, window):
    assert WINDOWS[due_window(NOW + remaining, NOW)][0] == window


def test_counts_are_per_real_topic_and_window_and_recalled_ones_apart():
    counts = TimerCounts(NOW)
    counts.add(record("orders", NOW + 30 * MIN))
    counts.add(record("orders", NOW + 30 * MIN))
    counts.add(record("orders", NOW - 1))
    counts.add(record("audit", NOW + 2 * DAY))
    counts.add(record("orders", NOW + 30 * MIN), cancelled=True)
    assert counts.rows() == [("audit", [0, 0, 0, 0, 1]), ("orders", [1, 0, 2, 0, 0])]
    assert (counts.scheduled, counts.cancelled) == (4, 1)


def test_the_done_offsets_of_a_commit_are_skipped_and_the_others_read():
    tracker = OffsetTracker(100)
    for offset in range(100, 110):
        tracker.add(offset)
    for offset in (101, 104, 105):
        tracker.done(offset)
    committed, metadata = tracker.committable("timer-x:0")  # type: ignore[misc]
    done = done_offsets(committed, metadata, "t[0]")
    assert committed == 100
    unfinished = [100, 102, 103, *range(106, 112)]
    assert [o for o in range(100, 112) if not done(o)] == unfinished
    never = done_offsets(-1001, None, "t[0]")  # nothing committed: nothing done
    assert not any(never(o) for o in range(5))


def test_one_message_is_shown_with_its_place_time_topic_and_recall():
    s = ScheduledTimer(
        "abc", "__rmq_timer_5", 3, 17, 5, NOW + 90 * MIN, "orders", None, "pg", NOW - 1000, True
    )
    lines = describe(TimerLookup("abc", (s,), NOW - 500), NOW)
    assert lines[0] == "message abc"
    assert "__rmq_timer_5[3]@17 (level 5 (16.0 s hold))" in lines[1]
    assert lines[2].endswith("(in 1 h 30 min)")
    assert "orders (by key)" in lines[3]
    assert lines[-1].startswith("  cancelled:  yes, recalled at")
    other_group = ScheduledTimer(**{**s.__dict__, "cancelled": False})
    assert "has no effect" in describe(TimerLookup("abc", (other_group,), NOW), NOW)[-1]
    assert describe(TimerLookup("abc", (other_group,), None), NOW)[-1] == "  cancelled:  no"
    gone = describe(TimerLookup("abc", (), NOW - 500), NOW)
    assert gone == [gone[0]] and "not scheduled any more; recalled at" in gone[0]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize(
    "argv, error",
    [
        (["--id", "bad id\x01"], "message id 'bad id\\x01': want the message_id a send returned"),
        (["--topic-prefix", "a/b"], "topic_prefix='a/b': use letters"),
    ],
)
def test_a_bad_argument_is_one_error_line(capsys, argv, error):
    code = main(["timer", "list", "--bootstrap-servers", f"127.0.0.1:{_closed_port()}", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("rmq-semantics: error: ") and error in err[0]


def test_an_unreachable_broker_is_one_error_line(capsys, monkeypatch):
    monkeypatch.setattr(timers, "METADATA_TIMEOUT_S", 1.0)
    bootstrap = f"127.0.0.1:{_closed_port()}"
    assert main(["timer", "list", "--bootstrap-servers", bootstrap]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"no broker answered at '{bootstrap}'" in err[0], err
