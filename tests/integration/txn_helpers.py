"""Shared helpers for transactional integration tests: a coordinator in a thread or a
subprocess, listeners with scripted answers, and a read_committed reader of a topic."""

from __future__ import annotations

import threading
import time
import uuid
import zlib
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Consumer as RawConsumer
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka import Producer as RawProducer

from coordinator.server import Server
from coordinator.settings import CoordinatorSettings
from rmq_semantics import LocalTransactionState, Message, TransactionListener
from rmq_semantics.producer import DeliveryWaiter
from rmq_semantics.records.codec import encode
from rmq_semantics.records.half import half_headers
from rmq_semantics.records.headers import H
from rmq_semantics.records.txn import EndRequest, EndState
from rmq_semantics.tools import coordinator_process

REPO = Path(__file__).resolve().parents[2]
# SIGTERM lets the Kafka transaction in progress finish, then leaves the group.
STOP_TIMEOUT_S = 60.0
# Short horizons so back-checks happen within a test.
FAST = {
    "transaction_timeout_ms": 1500,
    "check_interval_ms": 2500,
    "check_max": 3,
    "half_partitions": 4,
    "check_partitions": 2,
}


def wait_for(
    condition: Callable[[], object],
    timeout_s: float,
    what: str,
    interval_s: float = 0.1,
    details: Callable[[], str] | None = None,
) -> object:
    """Poll ``condition`` until truthy; fail with ``what`` (and ``details()``) on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval_s)
    extra = f"; {details()}" if details else ""
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}{extra}")


class ThreadCoordinator:
    """A coordinator Server running in a background thread of the test process."""

    def __init__(self, conf: dict, **settings: object) -> None:
        self.server = Server(conf, CoordinatorSettings(**{**FAST, **settings}))
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.exit_code: int | None = None

    def _run(self) -> None:
        self.exit_code = self.server.run()

    def __enter__(self) -> ThreadCoordinator:
        self.thread.start()
        wait_for(self.server.transactions.ready.is_set, 60, "the coordinator to start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()
        self.thread.join(60)
        assert not self.thread.is_alive(), "coordinator did not stop"


class CoordinatorProcess(coordinator_process.CoordinatorProcess):
    """``python -m coordinator`` of this checkout with the tests' short horizons (FAST),
    started at once; ``stop()`` fails the test if SIGTERM was not enough."""

    def __init__(
        self,
        bootstrap: str,
        log_path: Path | None = None,
        *args: str,
        env: dict[str, str] | None = None,
        **settings: object,
    ) -> None:
        super().__init__(
            bootstrap,
            log_path,
            *args,
            settings={**FAST, **settings},
            env={"PYTHONPATH": str(REPO), **(env or {})},
        )
        self.start()

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        code = super().stop(timeout_s)
        if self.killed:
            raise AssertionError(f"coordinator ignored SIGTERM for {timeout_s:.0f} s:\n{self.log}")
        return code


class ScriptedListener(TransactionListener):
    """Answers from dicts keyed by the message value; records every call."""

    def __init__(
        self,
        execute: Callable[[bytes], LocalTransactionState | None],
        check: Callable[[bytes], LocalTransactionState | None],
    ) -> None:
        self.execute = execute
        self.check = check
        self.executed: list[bytes] = []
        self.checked: list[bytes] = []
        self.lock = threading.Lock()

    def execute_local_transaction(self, msg, arg):
        with self.lock:
            self.executed.append(msg.value)
        return self.execute(msg.value)

    def check_local_transaction(self, msg):
        with self.lock:
            self.checked.append(msg.value)
        return self.check(msg.value)


class TopicReader:
    """A read_committed assign()-based reader of every partition of a topic."""

    def __init__(self, conf: dict, topic: str, partitions: int) -> None:
        self.consumer = RawConsumer(
            {
                **conf,
                "group.id": "unused-reader",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            }
        )
        self.consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        self.records: list = []

    def read_until(self, condition: Callable[[list], bool], timeout_s: float, what: str) -> list:
        deadline = time.monotonic() + timeout_s
        while not condition(self.records):
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out waiting for {what}; have {len(self.records)} records"
                )
            for msg in self.consumer.consume(1000, 0.2):
                if msg.error() is None:
                    self.records.append(msg)
        return self.records

    def settle(self, quiet_s: float = 2.0) -> list:
        """Read whatever else arrives until nothing new came for ``quiet_s``."""
        last = time.monotonic()
        while time.monotonic() - last < quiet_s:
            msgs = [m for m in self.consumer.consume(1000, 0.2) if m.error() is None]
            if msgs:
                self.records.extend(msgs)
                last = time.monotonic()
        return self.records

    def close(self) -> None:
        self.consumer.close()


_NEW_TOPIC_ERRORS = (
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
)


def _high_watermark(consumer: RawConsumer, tp: TopicPartition) -> int:
    """``tp``'s high watermark; a topic created a moment ago can answer NOT_LEADER until its
    broker has taken the leadership the controller gave it, so that is waited out."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return consumer.get_watermark_offsets(tp, timeout=10)[1]
        except KafkaException as exc:
            if exc.args[0].code() not in _NEW_TOPIC_ERRORS or time.monotonic() > deadline:
                raise
            time.sleep(0.2)  # the broker's own state: no event to await from here


def read_to_end(conf: dict, topic: str, partitions: int, timeout_s: float = 60.0) -> list:
    """Every read_committed record of ``topic`` up to its last stable offset, as of now."""
    reader = TopicReader(conf, topic, partitions)
    try:
        ends = {
            p: _high_watermark(reader.consumer, TopicPartition(topic, p)) for p in range(partitions)
        }

        def done(_records: list) -> bool:
            positions = reader.consumer.position(
                [TopicPartition(topic, p) for p in range(partitions)]
            )
            return all(
                ends[tp.partition] == 0 or tp.offset >= ends[tp.partition] for tp in positions
            )

        return list(reader.read_until(done, timeout_s, f"the end of {topic}"))
    finally:
        reader.close()


def metric(coordinator: ThreadCoordinator, name: str, **labels: str) -> float:
    """A sample of the in-process coordinator's metrics (0 when it has none yet)."""
    return coordinator.server.metrics.registry.get_sample_value(name, labels) or 0.0


def no_pending(coordinator: ThreadCoordinator, partitions: int) -> bool:
    """Every owned partition is resolved and its last decisions are committed to Kafka."""
    service = coordinator.server.transactions
    states = dict(service.states)
    return len(states) == partitions and all(
        not s.recovering
        and not s.pending
        and not s.deferred
        and service.committed_offsets(p) == (s.half_commit, s.op_commit)
        for p, s in states.items()
    )


def send_through_coordinator_crash(
    broker,
    prefix: str,
    topic: str,
    partitions: int,
    producer,
    messages: list,
    kill_after: int,
    expect: int,
) -> int:
    """Send ``messages`` transactionally while a coordinator subprocess promotes them;
    SIGKILL it once ``kill_after`` records are visible on ``topic``, restart it with the same
    instance id, and wait until ``expect`` records are visible. Returns the restarted
    coordinator's exit code after SIGTERM."""
    instance = f"coord-{uuid.uuid4().hex[:8]}"
    coordinator = CoordinatorProcess(broker.bootstrap, topic_prefix=prefix, instance_id=instance)
    reader = TopicReader(broker.conf(), topic, partitions)
    try:
        sender = threading.Thread(
            target=lambda: [producer.send_message_in_transaction(m) for m in messages]
        )
        sender.start()
        reader.read_until(lambda r: len(r) >= kill_after, 120, "the first promotions")
        coordinator.kill()
        # The same log file: the restarted process appends to it.
        coordinator = CoordinatorProcess(
            broker.bootstrap, coordinator.log_path, topic_prefix=prefix, instance_id=instance
        )
        # The sends may all be done by now (the per-call path got fast): a SIGTERM while
        # the restarted process still imports would kill it before it handles signals.
        coordinator.wait_ready()
        sender.join(300)
        assert not sender.is_alive(), "the producer did not finish sending"
        producer.flush(30)
        reader.read_until(lambda r: len(r) >= expect, 180, "every promotion")
    finally:
        exit_code = coordinator.stop()
        reader.close()
    return exit_code


class MemberWriter:
    """Writes transactions of N messages as the wire contract has them (issue 18): N half
    records to one half partition, ``crc32(txn_id) % half_partitions``, in index order by one
    idempotent producer, each with ``rmq.txn_size`` / ``rmq.txn_index`` (none for N = 1);
    then, if asked, one end request naming member 0. What a killed producer leaves behind
    is written with ``members`` short of ``size``."""

    def __init__(self, conf: dict, prefix: str, group: str, half_partitions: int) -> None:
        self.producer = RawProducer({**conf, "enable.idempotence": True, "linger.ms": 5})
        self.prefix, self.group, self.partitions = prefix, group, half_partitions

    def write(
        self, msgs: list[Message], txn_id: str | None = None, size: int | None = None
    ) -> tuple[str, int, list[int]]:
        """Members 0..len(msgs)-1 of a transaction of ``size`` (default len(msgs)); returns
        (txn id, half partition, member offsets) once every one is acknowledged."""
        txn_id = txn_id or uuid.uuid4().hex
        size = size or len(msgs)
        partition = zlib.crc32(txn_id.encode()) % self.partitions
        born = str(int(time.time() * 1000)).encode()
        waiters = []
        for index, msg in enumerate(msgs):
            headers = half_headers(msg, txn_id, self.group.encode(), born)
            if size > 1:
                headers += [(H.TXN_SIZE, str(size).encode()), (H.TXN_INDEX, str(index).encode())]
            waiters.append(DeliveryWaiter())
            self.producer.produce(
                f"{self.prefix}_half",
                msg.value,
                key=msg.key,
                headers=headers,
                partition=partition,
                on_delivery=waiters[-1],
            )
        for waiter in waiters:
            waiter.wait(self.producer, f"writing txn {txn_id}", 30)
        return txn_id, partition, [w.offset for w in waiters]

    def end(self, txn_id: str, partition: int, offset: int, state: EndState) -> None:
        """The producer's end request for the transaction whose member 0 is at ``offset``."""
        request = EndRequest(
            txn_id, self.group, partition, offset, state, False, 0, int(time.time() * 1000)
        )
        waiter = DeliveryWaiter()
        self.producer.produce(
            f"{self.prefix}_op", encode(request), partition=partition, on_delivery=waiter
        )
        waiter.wait(self.producer, f"ending txn {txn_id}", 30)

    def send(self, msgs: list[Message], state: EndState | None) -> tuple[str, int, list[int]]:
        """A whole transaction, then its end request (None: none, left to the check)."""
        txn_id, partition, offsets = self.write(msgs)
        if state is not None:
            self.end(txn_id, partition, offsets[0], state)
        return txn_id, partition, offsets

    def close(self) -> None:
        self.producer.flush(30)


def by_txn(records: list) -> dict[str, list]:
    """Promoted records by their ``rmq.txn_id`` header."""
    out: dict[str, list] = {}
    for msg in records:
        txn = dict(msg.headers() or []).get(H.TXN_ID, b"?").decode()
        out.setdefault(txn, []).append(msg)
    return out
