"""``rmq-semantics timer list`` against a real broker and coordinator: messages scheduled far
ahead with ``Producer.send`` are counted once per real topic and due window while the timer
service moves them from the intake to the level topics, a recalled one never among them;
``--id`` shows one message where it waits now."""

from __future__ import annotations

import re

import pytest

from rmq_semantics import Message, Producer
from rmq_semantics.cli import main
from rmq_semantics.tools.timers import find_timer, list_timers
from tests.integration.txn_helpers import ThreadCoordinator, wait_for

pytestmark = pytest.mark.integration

MIN, HOUR, DAY = 60_000, 3_600_000, 86_400_000
WAIT_S = 90


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["timer", "list", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _row(table: str, topic: str) -> list[str]:
    """The cells after ``topic`` in its row of the printed table."""
    line = next(line for line in table.splitlines() if f" {topic} " in line)
    cells = [c.strip() for c in re.split(r"[│┃|]", line) if c.strip()]
    return cells[cells.index(topic) + 1 :]


def test_scheduled_messages_are_listed_per_topic_and_window_and_one_by_id(
    broker, make_topic, unique, capsys
):
    prefix = unique("tl").replace("-", "")
    orders, audit = make_topic("orders"), make_topic("audit")
    conf = broker.conf()
    args = ("--bootstrap-servers", broker.bootstrap, "--topic-prefix", prefix)
    with (
        # The tests' coordinators take a one-minute maximum delay; these wait for days.
        ThreadCoordinator(conf, topic_prefix=prefix, max_delay_ms=3 * DAY),
        Producer(conf, topic_prefix=prefix, producer_group=unique("pg")) as producer,
    ):
        soon = [producer.send(Message(orders, b"o", deliver_after_ms=30 * MIN)) for _ in range(3)]
        producer.send(Message(orders, b"o", deliver_after_ms=10 * HOUR))
        far = [producer.send(Message(audit, b"a", deliver_after_ms=2 * DAY)) for _ in range(2)]
        producer.recall_message(soon[0].message_id)  # type: ignore[arg-type]  # a timer send's

        expected = [(audit, [0, 0, 0, 0, 2]), (orders, [0, 0, 2, 1, 0])]
        counts = wait_for(
            lambda: (c := list_timers(conf, prefix)).rows() == expected and c,
            WAIT_S,
            "the listing to count each scheduled message once",
            details=lambda: str(list_timers(conf, prefix)),
        )
        # The recalled one: counted apart until the timer service drops it (at once if it
        # read the recall before the message).
        assert counts.cancelled in (0, 1) and counts.malformed == 0  # type: ignore[union-attr]
        # The timer service re-appends the 2-day messages to a level topic: counted there
        # from the group's committed offsets, not again on the intake.
        wanted = far[0].message_id or ""
        moved = wait_for(
            lambda: (found := find_timer(conf, wanted, prefix).found) and found[0].level > 0,
            WAIT_S,
            "the timer service to move a message to a level topic",
        )
        assert moved
        assert list_timers(conf, prefix).rows() == expected

        code, out, err = _cli(capsys, *args)
        assert code == 0, err
        assert _row(out, orders) == ["0", "0", "2", "1", "0", "3"], out
        assert _row(out, audit) == ["0", "0", "0", "0", "2", "2"], out
        assert re.search(r"^5 scheduled; [01] recalled, not dropped yet .* 0 malformed", out, re.M)

        code, out, err = _cli(capsys, *args, "--id", wanted)
        assert code == 0, err
        lines = out.splitlines()
        assert lines[0] == f"message {wanted}"
        assert re.match(rf"  where:      {prefix}_timer_1?\d\[\d\]@\d+ \(level \d+ ", lines[1])
        assert f"real topic: {audit} (by key)" in out and "cancelled:  no" in out
        assert lines[2].endswith("(in 1 d 23 h)"), lines[2]  # sent 2 days ahead, moments ago

        code, out, err = _cli(capsys, *args, "--id", soon[0].message_id or "")
        assert code == 0, err
        # Still waiting (recalled, to be dropped) or dropped already: either way, recalled.
        assert "cancelled:  yes, recalled at" in out or "not scheduled any more; recalled" in out

        code, out, err = _cli(capsys, *args, "--id", "0" * 32)
        assert code == 2 and out == ""
        assert err.strip() == (
            f"rmq-semantics: error: no scheduled message '{'0' * 32}' under prefix "
            f"'{prefix}' (delivered, set aside, or never sent)"
        )
