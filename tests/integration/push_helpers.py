"""What the PushConsumer tests share: the failure policy of the listener (20 % reconsume
once, 1 % always), the records a listener saw, and readers of the retry and DLQ topics."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import confluent_kafka
from confluent_kafka import KafkaError, TopicPartition

from rmq_semantics.push import ConsumeConcurrentlyStatus
from rmq_semantics.records.headers import H

SUCCESS = ConsumeConcurrentlyStatus.CONSUME_SUCCESS
LATER = ConsumeConcurrentlyStatus.RECONSUME_LATER
ROOT = Path(__file__).resolve().parents[2]
LEVELS = (0.2, 0.4, 0.6)  # short delay levels, seconds
MAX_RECONSUME = 2


def fails_once(n: int) -> bool:
    return n % 5 == 0  # 20 %


def fails_always(n: int) -> bool:
    return n % 100 == 1  # 1 %, disjoint from fails_once


def raises(n: int) -> bool:
    """Half of the always-failing ones raise (the DLQ then names the exception)."""
    return fails_always(n) and n % 200 == 1


def outcome(n: int, reconsume_times: int) -> ConsumeConcurrentlyStatus:
    """The policy: RECONSUME_LATER once / always, or a raise; else CONSUME_SUCCESS."""
    if fails_always(n):
        if raises(n):
            raise ValueError(f"message {n} always fails")
        return LATER
    if fails_once(n) and reconsume_times == 0:
        return LATER
    return SUCCESS


@dataclass(frozen=True)
class Delivery:
    n: int
    reconsume_times: int
    at_ms: int
    due_ms: int | None  # rmq.retry_due_ts of a retry copy
    outcome: str
    topic: str
    offset: int
    born: int


class Recorder:
    """A listener (sync or async) that records each delivery and applies :func:`outcome`."""

    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []
        self._lock = threading.Lock()

    def _one(self, m) -> str:
        n = int(m.value)
        due = m.header(H.RETRY_DUE_TS)
        at_ms = int(time.time() * 1000)
        try:
            result = outcome(n, m.reconsume_times).name
        except ValueError:
            result = "RAISED"
        with self._lock:
            self.deliveries.append(
                Delivery(
                    n,
                    m.reconsume_times,
                    at_ms,
                    int(due) if due else None,
                    result,
                    m.topic,
                    m.offset,
                    m.born_timestamp,
                )
            )
        if result == "RAISED":
            raise ValueError(f"message {n} always fails")
        return result

    def __call__(self, msgs, context):
        results = [self._one(m) for m in msgs]
        return SUCCESS if all(r == "CONSUME_SUCCESS" for r in results) else LATER

    async def async_listener(self, msgs, context):
        import asyncio

        await asyncio.sleep(0)
        return self(msgs, context)

    def snapshot(self) -> list[Delivery]:
        with self._lock:
            return list(self.deliveries)

    def successes(self) -> list[int]:
        return [d.n for d in self.snapshot() if d.outcome == "CONSUME_SUCCESS"]


def produce_numbers(
    conf: dict, topic: str, numbers: range, tags: Callable[[int], str | None] = lambda n: None
) -> None:
    producer = confluent_kafka.Producer(conf)
    for n in numbers:
        tag = tags(n)
        producer.produce(
            topic,
            str(n).encode(),
            key=str(n).encode(),
            headers=[(H.TAGS, tag.encode())] if tag else None,
        )
        producer.poll(0)
    assert producer.flush(30) == 0


def read_all(conf: dict, topic: str) -> list[confluent_kafka.Message]:
    """Every committed record of ``topic`` (read_committed, to the end)."""
    consumer = confluent_kafka.Consumer(
        {
            **conf,
            "group.id": "reader",
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    out: list[confluent_kafka.Message] = []
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING) for p in parts])
        eof: set[int] = set()
        deadline = time.monotonic() + 30
        while len(eof) < len(parts) and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error() is not None:
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                eof.add(msg.partition())
                continue
            out.append(msg)
        assert len(eof) == len(parts), f"did not reach the end of {topic}"
    finally:
        consumer.close()
    return out


def headers_of(msg: confluent_kafka.Message) -> dict[str, bytes]:
    return {k: v for k, v in msg.headers() or ()}


def committed_ends(conf: dict, group: str, topic: str) -> tuple[dict[int, int], dict[int, int]]:
    """(committed offset, end offset) per partition of ``topic`` for ``group``."""
    consumer = confluent_kafka.Consumer({**conf, "group.id": group})
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        tps = consumer.committed([TopicPartition(topic, p) for p in parts], timeout=10)
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in parts
        }
        return {tp.partition: tp.offset for tp in tps}, ends
    finally:
        consumer.close()


def jsonl(path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:  # a line being written right now
            break
    return out


class PushWorker:
    """tests/integration/push_worker.py in a subprocess (``args`` added to its command
    line), and what it wrote."""

    def __init__(
        self,
        broker,
        tmp_path: Path,
        name: str,
        *,
        prefix: str,
        group: str,
        topic: str,
        args: tuple[str, ...] = (),
    ) -> None:
        self.path = tmp_path / f"{name}.jsonl"
        self.path.touch()
        self._stderr = open(tmp_path / f"{name}.stderr", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integration.push_worker",
                "--bootstrap-servers",
                broker.bootstrap,
                "--topic-prefix",
                prefix,
                "--group",
                group,
                "--topic",
                topic,
                "--result",
                str(self.path),
                *args,
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
        )

    def lines(self) -> list[dict]:
        return jsonl(self.path)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._stderr.close()
