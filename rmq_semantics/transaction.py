"""Transactional messages: ``TransactionProducer`` and its ``TransactionListener``.

The flow (DESIGN.md, "Transactional flow"): write the half message, run the local
transaction, send an end-transaction request to the Op topic; answer the coordinator's
back-checks for this producer group from a background check consumer and a bounded pool.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from enum import Enum
from typing import Any

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException
from tenacity import retry_if_exception

from rmq_semantics.clientconf import shared_conf
from rmq_semantics.errors import (
    ConfigError,
    IllegalStateError,
    KafkaOperationError,
    MalformedRecordError,
)
from rmq_semantics.message import Message
from rmq_semantics.producer import SEND_TIMEOUT_S, DeliveryWaiter, producer_defaults
from rmq_semantics.records.codec import decode, decode_as, encode
from rmq_semantics.records.half import half_headers
from rmq_semantics.records.headers import H
from rmq_semantics.records.txn import CheckRequest, EndEntry, EndRequest, EndRequests, EndState
from rmq_semantics.retry import retrying
from rmq_semantics.topics import (
    DEFAULT_TOPIC_PREFIX,
    SystemTopics,
    ensure_topics,
    validate_prefix,
)

__all__ = [
    "LocalTransactionState",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
]

log = logging.getLogger(__name__)

# RocketMQ's checkThreadPoolMinSize / checkRequestHoldMax defaults.
CHECK_QUEUE_SIZE = 2000
# Check consumer poll slice: bounds how long shutdown waits for the thread.
POLL_SLICE_S = 0.2
# A check consumer failing this long without a break logs it once more as an error and
# starts over (pauses from 0.1 s again); it only stops on a fatal error or a shutdown.
CHECK_RETRY_DEADLINE_S = 300.0
# Remember this many transactions' newest check, to skip superseded requests.
SEEN_CHECKS = 100_000
# send_messages_in_transaction sends the decisions of a batch as one END_REQUESTS record per
# half partition, at the latest this long after the first of them was taken (so a batch of
# slow local transactions does not hold back the early commits), with at most this many.
END_FLUSH_S = 0.005
END_BATCH_MAX = 1000


class LocalTransactionState(Enum):
    """Outcome of a local transaction (RocketMQ's spelling; ``UNKNOWN`` is an alias)."""

    COMMIT_MESSAGE = "COMMIT"
    ROLLBACK_MESSAGE = "ROLLBACK"
    UNKNOW = "UNKNOWN"
    UNKNOWN = "UNKNOWN"


class TransactionListener:
    """Implement both methods; an exception or ``None`` counts as ``UNKNOW``."""

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        raise NotImplementedError

    def check_local_transaction(self, msg: Message) -> LocalTransactionState:
        raise NotImplementedError


@dataclass(frozen=True)
class TransactionSendResult:
    """Where the half message went and what the local transaction said."""

    transaction_id: str
    local_transaction_state: LocalTransactionState
    half_partition: int
    half_offset: int
    producer_group: str = ""


# The end state each local transaction state asks the coordinator for.
_END_STATE = {s: EndState(s.value) for s in LocalTransactionState}


def _as_state(value: Any) -> LocalTransactionState:
    if isinstance(value, LocalTransactionState):
        return value
    return LocalTransactionState.UNKNOW


class TransactionProducer:
    """RocketMQ's ``TransactionMQProducer`` on Kafka.

    ``conf`` is a confluent-kafka producer conf (bootstrap, security, tuning); it is copied,
    never mutated. Call :meth:`start` before sending; :meth:`shutdown` (or leaving the
    ``with`` block) flushes and stops the check consumer. Idempotent.
    """

    def __init__(self, conf: dict, *, producer_group: str, listener: TransactionListener,
                 topic_prefix: str = DEFAULT_TOPIC_PREFIX, half_partitions: int = 8,
                 check_partitions: int = 8, check_queue_size: int = CHECK_QUEUE_SIZE,
                 send_timeout_s: float = SEND_TIMEOUT_S) -> None:
        if not producer_group or not isinstance(producer_group, str):
            raise ConfigError(f"producer_group must be a non-empty str, got {producer_group!r}")
        if listener is None or not callable(getattr(listener, "execute_local_transaction", None)):
            raise ConfigError("listener must implement execute_local_transaction and "
                              "check_local_transaction")
        self.producer_group = producer_group
        self.listener = listener
        self.topics = SystemTopics(validate_prefix(topic_prefix))
        self._conf = producer_defaults(conf)
        self._half_partitions = half_partitions
        self._check_partitions = check_partitions
        self._send_timeout_s = send_timeout_s
        self._checks: queue.Queue = queue.Queue(maxsize=check_queue_size)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._producer: confluent_kafka.Producer | None = None
        self._seen: OrderedDict[str, int] = OrderedDict()
        self._started = False
        self._closed = False
        #: Check requests dropped because the check queue was full.
        self.dropped_checks = 0
        self.checks_answered = 0

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> TransactionProducer:
        if self._started:
            return self
        ensure_topics(self._conf, {
            self.topics.half: (self._half_partitions, {}),
            self.topics.op: (self._half_partitions, {}),
            self.topics.check: (self._check_partitions, {}),
        })
        self._producer = confluent_kafka.Producer(self._conf)
        consumer_conf = shared_conf(self._conf)
        consumer_conf.update({
            "group.id": self.topics.check_group(self.producer_group),
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": True,
            "session.timeout.ms": 10000,
            "heartbeat.interval.ms": 1000,
        })
        self._check_consumer = confluent_kafka.Consumer(consumer_conf)
        self._check_consumer.subscribe([self.topics.check])
        for name, target in (("rmq-check-consumer", self._consume_checks),
                             ("rmq-check-worker", self._answer_checks)):
            thread = threading.Thread(target=target, name=f"{name}-{self.producer_group}",
                                      daemon=True)
            thread.start()
            self._threads.append(thread)
        self._started = True
        return self

    def shutdown(self, timeout: float = SEND_TIMEOUT_S) -> None:
        """Flush end requests, stop the check threads, leave the check group. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout)
        if self._started and self._producer is not None:
            self._check_consumer.close()
            self._producer.flush(timeout)

    def __enter__(self) -> TransactionProducer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- sending -------------------------------------------------------------------------
    def _require_started(self) -> confluent_kafka.Producer:
        if not self._started or self._closed or self._producer is None:
            raise IllegalStateError(
                "TransactionProducer is not started (call start() or use 'with')")
        return self._producer

    def send_message_in_transaction(self, msg: Message, arg: Any = None) -> TransactionSendResult:
        """Write ``msg`` as a half message, run the local transaction, send its outcome.

        If the half write fails the local transaction is not run and the error is raised.
        """
        [(txn_id, waiter)] = self._write_halves([msg])
        waiter.wait(self._require_started(), f"writing the half message of txn {txn_id}",
                    self._send_timeout_s)
        return self._run_local(msg, arg, txn_id, waiter)

    def send_messages_in_transaction(self, msgs: list[Message],
                                     arg: Any = None) -> list[TransactionSendResult]:
        """Like :meth:`send_message_in_transaction` for many messages, with the half writes
        pipelined: each message is still its own transaction with its own local transaction
        and decision. A message whose half write failed is not executed; its result has
        ``half_offset == -1`` and ``ROLLBACK_MESSAGE``, and the error is logged."""
        producer = self._require_started()
        pending = self._write_halves(msgs)
        deadline = time.monotonic() + self._send_timeout_s
        waiting = 0  # index of the first half write not known to be delivered
        while waiting < len(pending) and time.monotonic() < deadline:
            if pending[waiting][1].delivered:
                waiting += 1
            else:
                producer.poll(0.01)
        results = []
        decided: list[tuple[TransactionSendResult, LocalTransactionState]] = []
        first_decided_at = 0.0
        for msg, (txn_id, waiter) in zip(msgs, pending, strict=True):
            if waiter.delivered and waiter.error is None:
                result, state = self._execute_local(msg, arg, txn_id, waiter)
                results.append(result)
                if not decided:
                    first_decided_at = time.monotonic()
                decided.append((result, state))
                if (len(decided) >= END_BATCH_MAX
                        or time.monotonic() - first_decided_at >= END_FLUSH_S):
                    self._send_ends(decided)
                    decided = []
                continue
            reason = waiter.error.str() if waiter.error is not None else "timed out"
            log.error("%s txn=%s: half message for %s not written (%s); local transaction "
                      "not run", self.topics.half, txn_id, msg.topic, reason)
            results.append(TransactionSendResult(txn_id, LocalTransactionState.ROLLBACK_MESSAGE,
                                                 -1, -1, self.producer_group))
        self._send_ends(decided)
        return results

    def _write_halves(self, msgs: list[Message]) -> list[tuple[str, DeliveryWaiter]]:
        producer = self._require_started()
        born = str(int(time.time() * 1000)).encode()
        group = self.producer_group.encode()
        out = []
        for msg in msgs:
            txn_id = uuid.uuid4().hex
            waiter = DeliveryWaiter()
            producer.produce(self.topics.half, msg.value, key=msg.key,
                             headers=half_headers(msg, txn_id, group, born), on_delivery=waiter)
            out.append((txn_id, waiter))
        return out

    def _run_local(self, msg: Message, arg: Any, txn_id: str,
                   waiter: DeliveryWaiter) -> TransactionSendResult:
        result, state = self._execute_local(msg, arg, txn_id, waiter)
        self._send_end(result, state, from_check=False, check_seq=0, wait=False)
        return result

    def _execute_local(self, msg: Message, arg: Any, txn_id: str,
                       waiter: DeliveryWaiter) -> tuple[TransactionSendResult,
                                                        LocalTransactionState]:
        local_msg = Message(msg.topic, msg.value, key=msg.key, headers=msg.user_headers(),
                            partition=msg.partition, tags=msg.tags, keys=msg.keys,
                            check_immunity_ms=msg.check_immunity_ms, transaction_id=txn_id)
        try:
            state = _as_state(self.listener.execute_local_transaction(local_msg, arg))
        except Exception:
            log.exception("%s[%d]@%d txn=%s: execute_local_transaction raised (counts as "
                          "UNKNOW)", self.topics.half, waiter.partition, waiter.offset, txn_id)
            state = LocalTransactionState.UNKNOW
        result = TransactionSendResult(txn_id, state, waiter.partition, waiter.offset,
                                       self.producer_group)
        return result, state

    def _send_ends(self, decided: list[tuple[TransactionSendResult,
                                             LocalTransactionState]]) -> None:
        """Inline decisions of a batch: one END_REQUESTS record per half partition (one
        record per decision cost as much again as the half write itself)."""
        if not decided:
            return
        producer = self._require_started()
        by_partition: dict[int, list[EndEntry]] = {}
        for result, state in decided:
            by_partition.setdefault(result.half_partition, []).append(
                EndEntry(result.transaction_id, result.half_offset, _END_STATE[state]))
        now = int(time.time() * 1000)
        for partition, entries in by_partition.items():
            producer.produce(self.topics.op, encode(EndRequests(
                self.producer_group, partition, tuple(entries), now)), partition=partition,
                on_delivery=self._on_ends_delivery)
        producer.poll(0)

    def _on_ends_delivery(self, err: KafkaError | None, msg: confluent_kafka.Message) -> None:
        if err is None:
            return
        # Not lost: the transactions stay pending and the back-check resolves them.
        try:
            txn_ids = [e.txn_id for e in decode_as(EndRequests, msg.value()).entries]
        except MalformedRecordError:
            txn_ids = []
        log.warning("%s[%s]: %d end requests failed (%s); the back-check will resolve txns "
                    "%s", msg.topic(), msg.partition(), len(txn_ids), err.str(),
                    ", ".join(txn_ids[:20]) + (" ..." if len(txn_ids) > 20 else ""))

    def end_transaction(self, result: TransactionSendResult, state: LocalTransactionState,
                        *, timeout: float | None = None) -> None:
        """Send ``state`` for a transaction (e.g. one left UNKNOW) and wait for the ack."""
        self._require_started()
        self._send_end(result, state, from_check=False, check_seq=0, wait=True,
                       timeout=timeout)

    def _send_end(self, result: TransactionSendResult, state: LocalTransactionState, *,
                  from_check: bool, check_seq: int, wait: bool,
                  timeout: float | None = None) -> None:
        producer = self._require_started()
        request = EndRequest(result.transaction_id, self.producer_group, result.half_partition,
                             result.half_offset, _END_STATE[state], from_check, check_seq,
                             int(time.time() * 1000))
        waiter = DeliveryWaiter() if wait else _log_failed_end(
            f"{self.topics.half}[{result.half_partition}]@{result.half_offset}",
            result.transaction_id, state)
        producer.produce(self.topics.op, encode(request),
                         partition=result.half_partition, on_delivery=waiter)
        if isinstance(waiter, DeliveryWaiter):
            waiter.wait(producer, f"ending txn {result.transaction_id}",
                        timeout or self._send_timeout_s)
        else:
            producer.poll(0)

    def flush(self, timeout: float = SEND_TIMEOUT_S) -> int:
        """Wait for queued end requests; returns how many are still queued."""
        return self._require_started().flush(timeout)

    # -- back-checks ---------------------------------------------------------------------
    def _superseded(self, half_id: str, seq: int) -> bool:
        newest = self._seen.get(half_id, 0)
        if seq <= newest:
            return True
        self._seen[half_id] = seq
        self._seen.move_to_end(half_id)
        while len(self._seen) > SEEN_CHECKS:
            self._seen.popitem(last=False)
        return False

    def _consume_checks(self) -> None:
        """Feed check requests to the check workers until stopped. A failing consume is
        retried with the shared policy's pauses for as long as the producer runs (checks must
        resume after a broker outage); a fatal error stops this thread with one log line,
        and sending goes on (the coordinator checks again later)."""
        def fatal(err: KafkaError) -> bool:
            return err.fatal() or err.code() == KafkaError._FATAL

        def stopped(err: KafkaError) -> None:
            log.error("check consumer of producer group %s stopped: %s (fatal); back-checks go "
                      "unanswered until the producer restarts", self.producer_group, err.str())

        policy = retrying(CHECK_RETRY_DEADLINE_S, self._stop).copy(
            sleep=self._stop.wait,  # a shutdown cuts a pause short
            retry=retry_if_exception(lambda exc: isinstance(exc, KafkaException)
                                     and not fatal(exc.args[0])))
        while not self._stop.is_set():
            try:
                msgs = policy(self._check_consumer.consume, 500, POLL_SLICE_S)
            except KafkaException as exc:
                if self._stop.is_set():
                    return
                if not fatal(exc.args[0]):
                    log.error("check consumer of producer group %s failing for %.0f s: %s; "
                              "retrying", self.producer_group, CHECK_RETRY_DEADLINE_S,
                              exc.args[0].str())
                    continue
                stopped(exc.args[0])
                return
            except RuntimeError:  # closed under us: shutdown gave up waiting for this thread
                return
            newest: dict[str, CheckRequest] = {}
            for msg in msgs:
                if msg.error() is not None:
                    if fatal(msg.error()):
                        stopped(msg.error())
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
            for check in newest.values():
                # A re-driven transaction is a new half record whose checks count from 1 again.
                half_id = f"{check.txn_id}@{check.half_partition}:{check.half_offset}"
                if self._superseded(half_id, check.check_seq):
                    continue
                try:
                    self._checks.put_nowait(check)
                except queue.Full:
                    self.dropped_checks += 1
                    log.warning("%s txn=%s: check queue full (%d), dropping check #%d; the "
                                "coordinator will check it again", self._half_where(check),
                                check.txn_id, self._checks.maxsize, check.check_seq)

    def _answer_checks(self) -> None:
        while not self._stop.is_set():
            try:
                check = self._checks.get(timeout=POLL_SLICE_S)
            except queue.Empty:
                continue
            msg = Message(check.topic, check.value, key=check.key, headers=check.user_headers(),
                          partition=check.partition, transaction_id=check.txn_id,
                          tags=check.header_text(H.TAGS), keys=check.header_text(H.KEYS))
            try:
                state = _as_state(self.listener.check_local_transaction(msg))
            except Exception:
                log.exception("%s txn=%s: check_local_transaction raised (answering UNKNOW)",
                              self._half_where(check), check.txn_id)
                state = LocalTransactionState.UNKNOW
            result = TransactionSendResult(check.txn_id, state, check.half_partition,
                                           check.half_offset, self.producer_group)
            try:
                self._send_end(result, state, from_check=True, check_seq=check.check_seq,
                               wait=False)
                self.checks_answered += 1
            except (KafkaOperationError, BufferError) as exc:
                log.warning("%s txn=%s: could not answer check #%d: %s", self._half_where(check),
                            check.txn_id, check.check_seq, exc)

    def _half_where(self, check: CheckRequest) -> str:
        """``<half topic>[p]@o`` of the half record a check request is about."""
        return f"{self.topics.half}[{check.half_partition}]@{check.half_offset}"


def _log_failed_end(half_where: str, txn_id: str, state: LocalTransactionState):
    """Delivery callback for an end request nobody waits for: log a failure."""

    def on_delivery(err: KafkaError | None, msg: confluent_kafka.Message) -> None:
        if err is not None:
            # Not lost: the transaction stays pending and the back-check resolves it.
            log.warning("%s txn=%s: %s end request to %s[%s] failed (%s); the back-check "
                        "will resolve it", half_where, txn_id, state.value, msg.topic(),
                        msg.partition(), err.str())

    return on_delivery

