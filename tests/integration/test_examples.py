"""The README's and the docs' Python examples, run as written against the session's broker
with a coordinator beside it, each checked by what it observably did.

Each file under examples/ is the text of a Python block of README.md or docs/ (marked
``<!-- example: examples/NAME.py -->``; tests/unit/test_doc_blocks.py keeps block and file
equal and fails on a block that is neither run nor marked ``not run``). A test runs the file
as its own Python process in a fresh directory (its SQLite database lands there), as a user
would. The one substitution: the bootstrap address the examples name, ``127.0.0.1:9092``,
becomes the test broker's. The coordinator runs with its defaults (prefix ``__rmq``, 8 half
and check partitions) but the tests' short horizons (txn_helpers.FAST).
"""

from __future__ import annotations

import ast
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from rmq_semantics.records.headers import H
from rmq_semantics.topics import ensure_topics
from tests.integration.txn_helpers import REPO, ThreadCoordinator, TopicReader

pytestmark = pytest.mark.integration

ADDRESS = "127.0.0.1:9092"
ORDERS_PARTITIONS = 3  # as the examples create "orders"
RUN_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def coordinator(broker) -> Iterator[ThreadCoordinator]:
    with ThreadCoordinator(broker.conf(), half_partitions=8, check_partitions=8) as running:
        yield running


def run_example(name: str, broker, workdir: Path) -> list[str]:
    """Run examples/NAME as written but for the bootstrap address; its stdout lines."""
    source = (REPO / name).read_text(encoding="utf-8")
    assert ADDRESS in source, f"{name} names no {ADDRESS} to point at the test broker"
    script = workdir / Path(name).name
    script.write_text(source.replace(ADDRESS, broker.bootstrap), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=workdir,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert done.returncode == 0, f"{name} exited {done.returncode}:\n{done.stderr[-4000:]}"
    return done.stdout.splitlines()


def promoted(broker, topic: str, txn_id: str, count: int = 1, partitions: int = 3) -> list:
    """The records of ``topic`` the coordinator promoted for ``txn_id`` (waits for ``count``)."""
    reader = TopicReader(broker.conf(), topic, partitions)

    def of_txn(records: list) -> list:
        return [r for r in records if dict(r.headers() or []).get(H.TXN_ID) == txn_id.encode()]

    try:
        reader.read_until(lambda records: len(of_txn(records)) >= count, 60, f"{txn_id} in {topic}")
        return of_txn(reader.records)
    finally:
        reader.close()


def consumed(lines: list[str]) -> list[tuple[int, int, bytes]]:
    """``partition offset b'value'`` lines (a leading topic name dropped) as tuples."""
    out = []
    for line in lines:
        fields, _, value = line.partition(" b")
        *_, partition, offset = fields.split()
        out.append((int(partition), int(offset), ast.literal_eval("b" + value)))
    return out


def test_readme_transactional_example_is_promoted_once(broker, coordinator, tmp_path):
    [line] = run_example("examples/quickstart_transactional.py", broker, tmp_path)
    txn_id, state = line.split()
    assert state == "COMMIT_MESSAGE"
    [record] = promoted(broker, "orders", txn_id)
    assert (record.value(), record.key()) == (b"order-42", b"customer-7")
    assert H.PROMOTED_FROM in dict(record.headers())


def test_readme_ordered_example_processes_the_steps_in_order(broker, coordinator, tmp_path):
    # The README creates "orders" in its transactional example, before this one.
    ensure_topics(broker.conf(), {"orders": (ORDERS_PARTITIONS, {})})
    seen = consumed(run_example("examples/quickstart_ordered.py", broker, tmp_path))
    steps = [(p, o, v) for p, o, v in seen if v in (b"created", b"paid", b"shipped")]
    last_three = steps[-3:]
    assert [v for _, _, v in last_three] == [b"created", b"paid", b"shipped"], seen
    assert len({p for p, _, _ in last_three}) == 1, "one customer's steps share a partition"
    assert [o for _, o, _ in last_three] == sorted(o for _, o, _ in last_three)


def _row(workdir: Path, sql: str, *args: object) -> tuple | None:
    with closing(sqlite3.connect(workdir / "orders.db")) as db:
        return db.execute(sql, args).fetchone()


def test_transactions_guide_example_commits_its_row_and_its_message(broker, coordinator, tmp_path):
    [line] = run_example("examples/transactions.py", broker, tmp_path)
    txn_id, state = line.split()
    assert state == "COMMIT_MESSAGE"
    assert _row(tmp_path, "SELECT order_id FROM orders WHERE txn_id = ?", txn_id) == ("order-43",)
    [record] = promoted(broker, "orders", txn_id)
    assert record.value() == b"order-43"


def test_multi_message_guide_example_promotes_all_four_messages(broker, coordinator, tmp_path):
    [line] = run_example("examples/multi_message.py", broker, tmp_path)
    txn_id, count, _half_partition, _half_offset = line.split()
    assert count == "4"
    assert _row(tmp_path, "SELECT order_id FROM orders WHERE txn_id = ?", txn_id) == ("order-42",)
    assert [r.value() for r in promoted(broker, "orders", txn_id)] == [b"order-created"]
    assert [r.value() for r in promoted(broker, "inventory", txn_id)] == [b"stock-reserved"]
    lines = promoted(broker, "order-lines", txn_id, count=2)
    assert sorted(r.value() for r in lines) == [b"line-1", b"line-2"]


def test_barrier_guide_example_commits_under_the_barrier(broker, coordinator, tmp_path):
    [line] = run_example("examples/barrier.py", broker, tmp_path)
    txn_id, state = line.split()
    assert state == "COMMIT_MESSAGE"
    assert _row(tmp_path, "SELECT order_id FROM orders WHERE txn_id = ?", txn_id) == ("order-44",)
    assert _row(tmp_path, "SELECT reason FROM rmq_barrier WHERE gid = ?", txn_id) == ("msg",)
    [record] = promoted(broker, "orders", txn_id)
    assert record.value() == b"order-44"


def test_ordered_guide_example_places_by_selector_and_consumes(broker, coordinator, tmp_path):
    seen = consumed(run_example("examples/ordered.py", broker, tmp_path))
    values = {v: p for p, _, v in seen}
    assert {b"packed", b"labelled"} <= values.keys(), seen
    assert values[b"labelled"] == 42 % ORDERS_PARTITIONS, "the selector's partition"


def test_push_consumer_guide_example_gets_its_tags_only(broker, coordinator, tmp_path):
    lines = run_example("examples/push_consumer.py", broker, tmp_path)
    values = [ast.literal_eval(line) for line in lines]
    assert {b"invoice-1", b"invoice-2"} <= set(values), values
    assert b"audit-1" not in values, "TagC is not in 'TagA || TagB'"


def test_simple_consumer_guide_example_acks_each_group_in_order(broker, tmp_path):
    lines = run_example("examples/simple_consumer.py", broker, tmp_path)
    seen: dict[str, list[str]] = {}
    for line in lines:
        group, step, attempt = line.split()
        assert attempt == "1", line
        seen.setdefault(group, []).append(step)
    steps = ["created", "paid", "shipped"]
    assert seen == {"order-1": steps, "order-2": steps}, "'audit' is not 'step'"


def test_getting_started_dropin_example_sends_and_reads(broker, coordinator, tmp_path):
    seen = consumed(run_example("examples/dropin.py", broker, tmp_path))
    assert {b"order-opened", b"order-closed"} <= {v for _, _, v in seen}, seen


def test_asyncio_guide_example_commits_three_concurrent_transactions(broker, coordinator, tmp_path):
    lines = run_example("examples/asyncio_producer.py", broker, tmp_path)
    answers = dict(line.split() for line in lines)
    assert list(answers.values()) == ["COMMIT_MESSAGE"] * 3
    for txn_id in answers:
        row = _row(tmp_path, "SELECT order_id FROM orders WHERE txn_id = ?", txn_id)
        [record] = promoted(broker, "orders", txn_id)
        assert row == (record.value().decode(),)
