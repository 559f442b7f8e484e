"""The end of a run as history events and tool outputs, for the checkers: the ground truth
(committed rows of every producer's SQLite file), the final read by Kafka's Java client
(``final_read`` events; the push group's dead letters as ``dlq`` events), and Kafka's
TransactionsCommand (``find-hanging`` on every broker, ``list``), each output kept in the
out dir."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tests.campaign import events as ev
from tests.campaign.final_read import TopicRead
from tests.campaign.history import Draft
from tests.campaign.txn_tools import ToolOutputError, find_hanging_on_brokers, transactions_command
from tests.campaign.workload import committed_rows

__all__ = [
    "committed",
    "committed_drafts",
    "dead_letter_drafts",
    "final_read_drafts",
    "kafka_transactions",
]

DLQ_ORIGINAL = ("rmq.dlq.original_topic", "rmq.dlq.original_partition", "rmq.dlq.original_offset")


def committed(db_dir: Path) -> dict[str, dict]:
    """Message id -> row, for every business row whose barrier row says its local
    transaction committed, from every producer's database (read once they stopped)."""
    rows: dict[str, dict] = {}
    for db in sorted(db_dir.glob("*.sqlite")):
        rows.update(committed_rows(db))
    return {m: r for m, r in rows.items() if r["barrier"] == "msg"}


def committed_drafts(rows: dict[str, dict]) -> list[Draft]:
    return [
        ev.committed_row(r["txn_id"], m, r["topic"], key=r["key"], db=r["producer"])
        for m, r in sorted(rows.items())
    ]


def final_read_drafts(reads: Iterable[TopicRead]) -> list[Draft]:
    """One final_read event per record the Java client read; a record without the
    workload's body keeps msg_id None (the checker names it by topic[partition]@offset)."""
    return [
        ev.final_read(
            r["topic"],
            r["partition"],
            r["offset"],
            msg_id=r.get("mid"),
            txn_id=r.get("txn_id"),
            key=r.get("key"),
            headers=r["headers"],
        )
        for read in reads
        for r in read.records
    ]


def _int(value: str | None) -> int | None:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def dead_letter_drafts(
    group: str, reads: Iterable[TopicRead], consumer: str = "push"
) -> list[Draft]:
    """A push (or SimpleConsumer) group's DLQ records as dlq events at their original
    coordinates (the dead letter's rmq.dlq.original_* headers)."""
    out = []
    for read in reads:
        for r in read.records:
            topic, partition, offset = (r["headers"].get(h) for h in DLQ_ORIGINAL)
            out.append(
                ev.dlq(
                    consumer,
                    group,
                    r.get("mid") or f"{read.topic}[{r['partition']}]@{r['offset']}",
                    topic=topic,
                    partition=_int(partition),
                    offset=_int(offset),
                    reason=r["headers"].get("rmq.dlq.reason"),
                )
            )
    return out


def kafka_transactions(
    bootstrap: str, broker_ids: list[int], out_dir: Path
) -> tuple[dict[int, str], str]:
    """``find-hanging --broker-id N`` on every broker and ``list``; a tool that failed
    gives its error text, which the checker reports as unreadable."""
    try:
        hanging = find_hanging_on_brokers(bootstrap, broker_ids)
    except ToolOutputError as exc:
        hanging = {-1: f"find-hanging failed: {exc}"}
    try:
        listing = transactions_command(bootstrap, ["list"])
    except ToolOutputError as exc:
        listing = f"list failed: {exc}"
    out_dir.mkdir(parents=True, exist_ok=True)
    for broker, text in hanging.items():
        (out_dir / f"find-hanging-{broker}.txt").write_text(text)
    (out_dir / "txn-list.txt").write_text(listing)
    return hanging, listing
