"""Back-checks on the producer side: RocketMQ's ``checkTransactionState`` for one group.

The coordinator writes check requests for a producer group to the check topic; every live
producer of the group is a member of one consumer group over it, so each request reaches
one of them. A :class:`CheckResponder` consumes them, drops those superseded by a newer
check of the same half record, and hands each to a bounded pool that asks the listener.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import OrderedDict
from collections.abc import Callable

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException
from tenacity import retry_if_exception

from rmq_semantics.clientconf import client_conf
from rmq_semantics.errors import MalformedRecordError
from rmq_semantics.records.codec import decode
from rmq_semantics.records.txn import CheckRequest
from rmq_semantics.retry import retrying
from rmq_semantics.topics import SystemTopics

__all__ = ["CHECK_QUEUE_SIZE", "CheckResponder"]

log = logging.getLogger(__name__)

# RocketMQ's checkThreadPoolMinSize / checkRequestHoldMax defaults.
CHECK_QUEUE_SIZE = 2000
# Check consumer poll slice: bounds how long shutdown waits for the threads.
POLL_SLICE_S = 0.2
# A check consumer failing this long without a break logs it once more as an error and
# starts over (pauses from 0.1 s again); it only stops on a fatal error or a shutdown.
CHECK_RETRY_DEADLINE_S = 300.0
# Remember this many transactions' newest check, to skip superseded requests.
SEEN_CHECKS = 100_000


def _fatal(err: KafkaError) -> bool:
    return err.fatal() or err.code() == KafkaError._FATAL


class CheckResponder:
    """Consumes one producer group's check requests and answers each through ``answer``.

    ``answer(check)`` asks the listener and sends the end request; a KafkaOperationError or
    BufferError from it is logged (the coordinator checks again later).
    """

    def __init__(self, conf: dict, topics: SystemTopics, producer_group: str,
                 answer: Callable[[CheckRequest], None],
                 queue_size: int = CHECK_QUEUE_SIZE) -> None:
        self.producer_group = producer_group
        self.topics = topics
        self._conf = client_conf(conf, who="check consumer", internal=True, forced={
            "group.id": topics.check_group(producer_group),
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": True,
            "session.timeout.ms": 10000,
            "heartbeat.interval.ms": 1000,
        })
        self._answer = answer
        self._checks: queue.Queue[CheckRequest] = queue.Queue(maxsize=queue_size)
        self._seen: OrderedDict[str, int] = OrderedDict()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._consumer: confluent_kafka.Consumer | None = None
        #: Check requests dropped because the check queue was full.
        self.dropped = 0
        self.answered = 0

    def start(self) -> None:
        self._consumer = confluent_kafka.Consumer(self._conf)
        self._consumer.subscribe([self.topics.check])
        for name, target in (("rmq-check-consumer", self._consume),
                             ("rmq-check-worker", self._answer_loop)):
            thread = threading.Thread(target=target, name=f"{name}-{self.producer_group}",
                                      daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float) -> None:
        """Stop both threads and leave the check group. Idempotent."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout)
        self._threads = []
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()

    def _where(self, check: CheckRequest) -> str:
        """``<half topic>[p]@o`` of the half record a check request is about."""
        return f"{self.topics.half}[{check.half_partition}]@{check.half_offset}"

    def _superseded(self, half_id: str, seq: int) -> bool:
        newest = self._seen.get(half_id, 0)
        if seq <= newest:
            return True
        self._seen[half_id] = seq
        self._seen.move_to_end(half_id)
        while len(self._seen) > SEEN_CHECKS:
            self._seen.popitem(last=False)
        return False

    def _consume(self) -> None:
        """Feed check requests to the worker until stopped. A failing consume is retried with
        the shared policy's pauses for as long as the producer runs (checks must resume after
        a broker outage); a fatal error stops this thread with one log line, and sending goes
        on (the coordinator checks again later)."""
        policy = retrying(CHECK_RETRY_DEADLINE_S, self._stop).copy(
            sleep=self._stop.wait,  # a shutdown cuts a pause short
            retry=retry_if_exception(lambda exc: isinstance(exc, KafkaException)
                                     and not _fatal(exc.args[0])))
        while not self._stop.is_set():
            try:
                msgs = policy(self._consumer.consume, 500, POLL_SLICE_S)
            except KafkaException as exc:
                if self._stop.is_set():
                    return
                if not _fatal(exc.args[0]):
                    log.error("check consumer of producer group %s failing for %.0f s: %s; "
                              "retrying", self.producer_group, CHECK_RETRY_DEADLINE_S,
                              exc.args[0].str())
                    continue
                self._stopped(exc.args[0])
                return
            except RuntimeError:  # closed under us: shutdown gave up waiting for this thread
                return
            newest: dict[str, CheckRequest] = {}
            for msg in msgs:
                if msg.error() is not None:
                    if _fatal(msg.error()):
                        self._stopped(msg.error())
                        return
                    if msg.error().code() != KafkaError._PARTITION_EOF:
                        log.warning("check consumer: %s", msg.error().str())
                    continue
                try:
                    record = decode(msg.value())
                except MalformedRecordError as exc:
                    log.warning("%s[%d]@%d skipped: %s", msg.topic(), msg.partition(),
                                msg.offset(), exc)
                    continue
                if not isinstance(record, CheckRequest) or (
                        record.producer_group != self.producer_group):
                    continue
                current = newest.get(record.txn_id)
                if current is None or record.check_seq > current.check_seq:
                    newest[record.txn_id] = record
            self._enqueue(newest.values())

    def _stopped(self, err: KafkaError) -> None:
        log.error("check consumer of producer group %s stopped: %s (fatal); back-checks go "
                  "unanswered until the producer restarts", self.producer_group, err.str())

    def _enqueue(self, checks) -> None:
        for check in checks:
            # A re-driven transaction is a new half record whose checks count from 1 again.
            half_id = f"{check.txn_id}@{check.half_partition}:{check.half_offset}"
            if self._superseded(half_id, check.check_seq):
                continue
            try:
                self._checks.put_nowait(check)
            except queue.Full:
                self.dropped += 1
                log.warning("%s txn=%s: check queue full (%d), dropping check #%d; the "
                            "coordinator will check it again", self._where(check),
                            check.txn_id, self._checks.maxsize, check.check_seq)

    def _answer_loop(self) -> None:
        while not self._stop.is_set():
            try:
                check = self._checks.get(timeout=POLL_SLICE_S)
            except queue.Empty:
                continue
            try:
                self._answer(check)
                self.answered += 1
            except Exception as exc:  # one unanswerable request must not stop the others
                log.warning("%s txn=%s: could not answer check #%d: %r", self._where(check),
                            check.txn_id, check.check_seq, exc)
