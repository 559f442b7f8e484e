"""The fault campaign's pure parts (tests/campaign): the seeded plan replays and resumes,
the final reads' parsers understand what the Java console consumer and the txn CLI print,
and what the runner observes becomes the history events the checkers read."""

from __future__ import annotations

import io
import itertools

from rich.console import Console
from rich.table import Table

from rmq_semantics.records.locks import LockEntry, LockKey, LockState
from tests.campaign.consumer_worker import Batches
from tests.campaign.final_read import HEADER_SEPARATOR, TopicRead, parse_console_line, table_rows
from tests.campaign.gather import dead_letter_drafts
from tests.campaign.history import Kind, Recorder, load
from tests.campaign.observe import LeaderTracker, lock_drafts, log_drafts, log_time_ms
from tests.campaign.workload import BAD_PARTITION, MISSING_PARTITION, plan_ops


def _plan(seed: int, n: int = 300) -> list:
    return list(itertools.islice(plan_ops(seed, "producer-0", ["t0", "t1"], 12, [(40, "new0")]), n))


def test_the_plan_replays_for_a_seed_and_differs_for_another():
    assert _plan(7) == _plan(7)
    assert _plan(7) != _plan(8)


def test_the_plan_has_every_kind_unique_ids_and_uses_a_new_topic_from_its_creation_on():
    ops = _plan(7)
    mids = [m.mid for op in ops for m in op.messages]
    assert len(mids) == len(set(mids))
    assert {op.kind for op in ops} >= {
        "commit",
        "rollback",
        "raise",
        "unknown",
        "no_row",
        "slow",
        BAD_PARTITION,
    }
    assert any(op.multi for op in ops)
    assert ops[40].new_topic == "new0" and ops[40].messages[0].topic == "new0"
    assert not any(m.topic == "new0" for op in ops[:40] for m in op.messages)
    assert any(m.topic == "new0" for op in ops[41:] for m in op.messages)
    bad = next(op for op in ops if op.kind == BAD_PARTITION)
    assert [m.partition for m in bad.to_kafka()] == [MISSING_PARTITION]


def test_console_consumer_lines_parse_with_headers_and_without():
    line = (
        "Partition:2\tOffset:17\trmq.txn_id:abc" + HEADER_SEPARATOR + "rmq.born_ts:1\t"
        '{"mid":"producer-0-000001-0","key":"k1","pad":"x"}'
    )
    record = parse_console_line("t0", line)
    assert record == {
        "topic": "t0",
        "partition": 2,
        "offset": 17,
        "headers": {"rmq.txn_id": "abc", "rmq.born_ts": "1"},
        "mid": "producer-0-000001-0",
        "key": "k1",
        "txn_id": "abc",
    }
    bare = parse_console_line("t0", "Partition:0\tOffset:0\tNO_HEADERS\tnot json")
    assert bare is not None and bare["mid"] is None and bare["headers"] == {}
    assert parse_console_line("t0", "Processed a total of 3 messages") is None


def test_txn_cli_tables_parse_every_data_row():
    table = Table("txn id", "real topic")
    table.add_row("abc", "t1")
    table.add_row("def", "t2")
    out = io.StringIO()
    Console(file=out, width=250).print(table)
    assert table_rows(out.getvalue()) == [["abc", "t1"], ["def", "t2"]]
    empty = io.StringIO()
    Console(file=empty, width=250).print(Table("txn id", "real topic"))
    assert table_rows(empty.getvalue()) == []


def test_a_leader_moving_to_another_broker_is_a_change_and_a_leaderless_spell_is_not():
    tracker = LeaderTracker()
    assert tracker.update({("t", 0): 1, ("t", 1): 2}) == []
    assert tracker.update({("t", 0): -1, ("t", 1): 2}) == []
    assert tracker.update({("t", 0): 1, ("t", 1): 3}) == ["t[1] 2->3"]


def test_lock_topic_entries_become_grants_releases_and_takeovers():
    key = LockKey("g", "t", 0)
    held = LockEntry(key, LockState.HELD, "c1", 1, 6000, 1000, 7000, 1000)
    renewed = LockEntry(key, LockState.HELD, "c1", 1, 6000, 1000, 9000, 3000)
    taken = LockEntry(key, LockState.HELD, "c2", 2, 6000, 9500, 15500, 9500)
    released = LockEntry(key, LockState.RELEASED, "c2", 2, 6000, 9500, 12000, 12000)
    handed = LockEntry(key, LockState.HELD, "c1", 3, 6000, 12500, 18500, 12500)
    drafts = lock_drafts([held, renewed, taken, released, handed])
    assert [d.kind for d in drafts] == [
        Kind.LOCK_GRANT,
        Kind.LOCK_GRANT,
        Kind.LOCK_GRANT,
        Kind.LOCK_TAKEOVER,
        Kind.LOCK_RELEASE,
        Kind.LOCK_GRANT,
    ]
    assert drafts[1].fields["granted_ms"] == 3000 and drafts[1].fields["valid_until_ms"] == 9000
    assert drafts[2].fields["queue"] == "g/t/0" and drafts[2].fields["epoch"] == 2
    assert "c1 -> c2" in drafts[3].fields["detail"]
    # A takeover outside the load (the start, the harness stopping things) is not counted.
    assert Kind.LOCK_TAKEOVER not in [d.kind for d in lock_drafts([held, taken], 10_000)]


def test_log_lines_since_the_load_count_as_rebalances_and_fenced_producers(tmp_path):
    path = tmp_path / "coordinator-0.log"
    path.write_text(
        "2030-01-01 00:00:00,000 INFO coordinator.txn_service: assigned half/op partitions "
        "[0, 1]; recovering their pending state\n"
        "2030-01-01 00:01:00,000 INFO coordinator.txn_service: assigned half/op partitions "
        "[0]; recovering their pending state\n"
        "2030-01-01 00:01:01,000 WARNING coordinator.kafka_txn: lock service: transaction: "
        "Broker: Producer fenced (fatal: fenced by another instance)\n"
        "a line without a time: fenced\n"
    )
    since = log_time_ms("2030-01-01 00:00:30,000 x")
    kinds = [d.kind for d in log_drafts({"coordinator-0": path}, since)]
    assert kinds == [Kind.REBALANCE, Kind.FENCED_PRODUCER]
    until = log_time_ms("2030-01-01 00:01:00,500 x")
    assert [d.kind for d in log_drafts({"coordinator-0": path}, since, until)] == [Kind.REBALANCE]


def test_orderly_batches_are_written_once_their_commit_or_skip_is_known(tmp_path):
    with Recorder(tmp_path / "c.jsonl", "c") as rec:
        batches = Batches(rec)
        for offsets in ([0, 1], [2], [3]):
            batches.add(
                ("t", 0),
                {
                    "queue": "g/t/0",
                    "instance": "c",
                    "epoch": 1,
                    "lease_granted_ms": None,
                    "lease_valid_until_ms": 9000,
                    "start_ms": 1000,
                    "end_ms": 1100,
                    "offsets": offsets,
                },
            )
        batches.resolve(("t", 0), 3, committed=True)
        batches.resolve(("t", 0), 4, committed=False)
    written = load(tmp_path).of(Kind.BATCH)
    assert [(b["offsets"], b["committed"]) for b in written] == [
        ([0, 1], True),
        ([2], True),
        ([3], False),
    ]
    assert written[0]["commit_ms"] >= 1000 and written[2].get("commit_ms") is None


def test_dead_letters_are_named_by_their_original_record():
    read = TopicRead(
        "dlq",
        [
            {
                "topic": "dlq",
                "partition": 0,
                "offset": 5,
                "mid": "m1",
                "headers": {
                    "rmq.dlq.original_topic": "t",
                    "rmq.dlq.original_partition": "2",
                    "rmq.dlq.original_offset": "17",
                },
            }
        ],
        1,
        0,
    )
    [draft] = dead_letter_drafts("pg", [read])
    assert draft.kind is Kind.DLQ
    assert (
        draft.fields["msg_id"],
        draft.fields["topic"],
        draft.fields["partition"],
        draft.fields["offset"],
    ) == ("m1", "t", 2, 17)
