"""The fault campaign's pure parts (tests/campaign): the seeded plan replays and resumes,
and the final reads' parsers understand what the Java console consumer and the txn CLI
print."""

from __future__ import annotations

import io
import itertools

from rich.console import Console
from rich.table import Table

from tests.campaign._stubs import RunData, run_checkers
from tests.campaign.final_read import HEADER_SEPARATOR, parse_console_line, table_rows
from tests.campaign.workload import BAD_PARTITION, MISSING_PARTITION, plan_ops


def _plan(seed: int, n: int = 300) -> list:
    return list(itertools.islice(
        plan_ops(seed, "producer-0", ["t0", "t1"], 12, [(40, "new0")]), n))


def test_the_plan_replays_for_a_seed_and_differs_for_another():
    assert _plan(7) == _plan(7)
    assert _plan(7) != _plan(8)


def test_the_plan_has_every_kind_unique_ids_and_uses_a_new_topic_from_its_creation_on():
    ops = _plan(7)
    mids = [m.mid for op in ops for m in op.messages]
    assert len(mids) == len(set(mids))
    assert {op.kind for op in ops} >= {"commit", "rollback", "raise", "unknown", "no_row",
                                       "slow", BAD_PARTITION}
    assert any(op.multi for op in ops)
    assert ops[40].new_topic == "new0" and ops[40].messages[0].topic == "new0"
    assert not any(m.topic == "new0" for op in ops[:40] for m in op.messages)
    assert any(m.topic == "new0" for op in ops[41:] for m in op.messages)
    bad = next(op for op in ops if op.kind == BAD_PARTITION)
    assert [m.partition for m in bad.to_kafka()] == [MISSING_PARTITION]


def test_console_consumer_lines_parse_with_headers_and_without():
    line = ("Partition:2\tOffset:17\trmq.txn_id:abc" + HEADER_SEPARATOR + "rmq.born_ts:1\t"
            '{"mid":"producer-0-000001-0","key":"k1","pad":"x"}')
    record = parse_console_line("t0", line)
    assert record == {"topic": "t0", "partition": 2, "offset": 17,
                      "headers": {"rmq.txn_id": "abc", "rmq.born_ts": "1"},
                      "mid": "producer-0-000001-0", "key": "k1", "txn_id": "abc"}
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


def test_the_stub_checker_reports_a_lost_a_duplicated_and_an_uncommitted_record():
    committed = {m: {"topic": "t0"} for m in ("a", "b", "c")}
    visible = [{"mid": "a", "topic": "t0"}, {"mid": "a", "topic": "t0"},
               {"mid": "x", "topic": "t0"}, {"mid": "c", "topic": "t0"}]
    [once, *_] = run_checkers(RunData([], committed, visible))
    assert not once.passed
    assert "lost 1 ['b']" in once.detail and "duplicated 1 ['a']" in once.detail
    assert "not committed 1 ['x']" in once.detail
