"""Transactional messages: ``TransactionProducer`` and its ``TransactionListener``.

The flow (DESIGN.md, "Transactional flow"): write the half message, run the local
transaction, send an end-transaction request to the Op topic; answer the coordinator's
back-checks for this producer group from a background check consumer and a bounded pool.
``send_transaction`` does the same for many messages as one transaction (its records:
:mod:`rmq_semantics.multi`; the listener's view: :mod:`rmq_semantics.transaction_api`).


Over 500 physical lines only since ``ruff format`` (one argument a line; under 500 as the
layering test counts them), and kept whole: its one class is the producer's lifecycle and
send paths over shared clients and in-flight state; what separates cleanly already lives
beside it (``transaction_api``, ``txn_writes``, ``multi`` and the
``CheckCounters``/``BatchTransactions`` mixins)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import confluent_kafka
from opentelemetry.trace import SpanKind

from rmq_semantics import tracing
from rmq_semantics.checks import (
    CHECK_QUEUE_SIZE,
    CheckCounters,
    CheckResponder,
    ask_listener,
    valid_instance_id,
)
from rmq_semantics.errors import (
    ConfigError,
    IllegalStateError,
    RmqError,
)
from rmq_semantics.group_signing import group_key_of, producer_factory
from rmq_semantics.message import Message
from rmq_semantics.multi import (
    check_members,
    half_partition_for,
    listener_message,
    member_headers,
)
from rmq_semantics.producer import (
    SEND_TIMEOUT_S,
    CallProducer,
    DeliveryWaiter,
    PartitionCache,
    SignalledWaiter,
    given_linger_ms,
    producer_defaults,
)
from rmq_semantics.records.codec import encode
from rmq_semantics.records.txn import CheckRequest
from rmq_semantics.selector import placement, placement_reads_partitions
from rmq_semantics.send_checks import SendChecks
from rmq_semantics.settings import ProducerSettings, load
from rmq_semantics.topics import (
    DEFAULT_TOPIC_PREFIX,
    SystemTopics,
    ensure_topics,
    require_copartitioned,
    txn_topic_specs,
    validate_prefix,
)
from rmq_semantics.transaction_api import (
    LocalTransactionState,
    Transaction,
    TransactionListener,
    TransactionSendResult,
    as_listener,
)
from rmq_semantics.txn_batch import BatchTransactions
from rmq_semantics.txn_writes import (
    DELIVERY_GRACE_S,
    end_request,
    half_write_conf,
    local_outcome,
    log_failed_end,
    new_txn_ids,
    queue_end,
    roll_back_unwritten,
    say_rolled_back,
    write_halves,
    write_members,
)
from rmq_semantics.unsent import UnsentHalves, answer_check

__all__ = [
    "LocalTransactionState",
    "Transaction",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
]


class TransactionProducer(CheckCounters, BatchTransactions):
    """RocketMQ's ``TransactionMQProducer`` on Kafka.

    ``conf`` is a confluent-kafka producer conf (bootstrap, security, tuning); it is copied,
    never mutated. Call :meth:`start` before sending; :meth:`shutdown` (or leaving the
    ``with`` block) flushes and stops the check consumer. Idempotent. The bounds of
    :meth:`send_transaction` are :class:`ProducerSettings` (kwargs, else ``RMQ_*`` env).
    A message with a ``message_group`` and no ``partition`` is promoted to its group's
    partition, as ``Producer.send`` places it (the half record names it).
    """

    def __init__(
        self,
        conf: dict,
        *,
        producer_group: str,
        listener: TransactionListener,
        topic_prefix: str = DEFAULT_TOPIC_PREFIX,
        half_partitions: int = 8,
        check_partitions: int = 8,
        check_queue_size: int = CHECK_QUEUE_SIZE,
        send_timeout_s: float = SEND_TIMEOUT_S,
        max_transaction_messages: int | None = None,
        max_transaction_bytes: int | None = None,
        check_threads: int | None = None,
        check_timeout_ms: int | None = None,
        check_affinity: bool | None = None,
        instance_id: str | None = None,
        group_key: str | None = None,
        group_key_file: str | None = None,
    ) -> None:
        self.settings = load(
            ProducerSettings,
            {
                "max_transaction_messages": max_transaction_messages,
                "max_transaction_bytes": max_transaction_bytes,
                "check_threads": check_threads,
                "check_timeout_ms": check_timeout_ms,
                "check_affinity": check_affinity,
                "group_key": group_key,
                "group_key_file": group_key_file,
            },
        )
        if not producer_group or not isinstance(producer_group, str):
            raise ConfigError(f"producer_group must be a non-empty str, got {producer_group!r}")
        listener = as_listener(listener)
        if listener is None or not callable(getattr(listener, "execute_local_transaction", None)):
            raise ConfigError(
                "listener must implement execute_local_transaction and "
                "check_local_transaction (or RocketMQ's executeLocalTransaction "
                "and checkLocalTransaction)"
            )
        self.producer_group = producer_group
        self.listener = listener
        #: This instance's id: its check consumer's, and its half records' check affinity.
        self.instance_id = valid_instance_id(instance_id)
        self.topics = SystemTopics(validate_prefix(topic_prefix))
        # Tenant isolation (docs/security.md): signed writes, checks on the group's own topic.
        self._group_key = group_key_of(self.settings)
        self._check_topic = (
            self.topics.check
            if self._group_key is None
            else self.topics.group_check(producer_group)
        )
        self._new_producer = producer_factory(self._group_key, self.topics)
        # Its metadata reads of destination topics (send-time checks) must not create a
        # mistyped topic on a broker with auto.create.topics.enable (the caller's value wins).
        self._conf = {"allow.auto.create.topics": False, **producer_defaults(conf)}
        # librdkafka gives up on a half write when the caller is told it failed.
        self._producer_conf = half_write_conf(self._conf, send_timeout_s)
        self._half_partitions = half_partitions
        self._check_partitions = check_partitions
        self._send_timeout_s = send_timeout_s
        # Checks of a half this producer has not seen land are answered here (issue 29).
        self._unsent = UnsentHalves()
        self._checks = CheckResponder(
            self._conf,
            self.topics,
            producer_group,
            instance_id=self.instance_id,
            check_topic=None if self._group_key is None else self._check_topic,
            ask=lambda check: answer_check(self._unsent, self.topics.half, self._ask, check),
            reply=self._reply_check,
            threads=self.settings.check_threads,
            affinity=self.settings.check_affinity,
            timeout_s=self.settings.check_timeout_ms / 1000,
            queue_size=check_queue_size,
        )
        self._producer: confluent_kafka.Producer | None = None
        # The one-message path's own producer (the batch path keeps the conf's batching).
        self._call = CallProducer(
            self._producer_conf,
            f"rmq-delivery-{producer_group}",
            self._new_producer,
            linger_ms=given_linger_ms(conf),
        )
        self._partitions: PartitionCache | None = None
        self._send_checks: SendChecks | None = None
        self._started = False
        self._closed = False

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> TransactionProducer:
        if self._started:
            return self
        # The coordinator's specs, so the configs never depend on who starts first; the
        # discard topic is the coordinator's alone.
        specs = txn_topic_specs(self.topics, self._half_partitions, self._check_partitions)
        specs[self._check_topic] = specs[self.topics.check]
        ensure_topics(
            self._conf,
            {t: specs[t] for t in (self.topics.half, self.topics.op, self._check_topic)},
            replicated=True,
        )
        # End requests go to the Op partition of their half partition.
        require_copartitioned(self._conf, self.topics.half, self.topics.op)
        self._producer = self._new_producer(self._producer_conf)
        self._partitions = PartitionCache(self._producer)
        self._checks.start()
        self._started = True
        return self

    def shutdown(self, timeout: float = SEND_TIMEOUT_S) -> None:
        """Flush end requests, stop the check threads, leave the check group. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._checks.stop(timeout)
        if self._producer is not None:
            self._producer.flush(timeout)
        self._call.stop(timeout)

    def __enter__(self) -> TransactionProducer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- sending -------------------------------------------------------------------------
    def _require_started(self) -> confluent_kafka.Producer:
        if not self._started or self._closed or self._producer is None:
            raise IllegalStateError(
                "TransactionProducer is not started (call start() or use 'with')"
            )
        return self._producer

    def send_message_in_transaction(self, msg: Message, arg: Any = None) -> TransactionSendResult:
        """Write ``msg`` as a half message, run the local transaction, send its outcome.

        If the half write fails the local transaction is not run and the error is raised;
        so is, before anything is written, a message for a system topic
        (:class:`SystemTopicError`), a topic that does not exist (:class:`UnknownTopicError`),
        a partition its topic lacks (:class:`UnknownPartitionError`), or with an empty body
        or over the topic's ``max.message.bytes`` (:class:`MessageSizeError`).
        """
        self._require_started()
        placed = self._placed([msg])
        producer, txn_ids = self._call_producer(), new_txn_ids(1)
        with tracing.span("send transaction", msg.topic):
            with (
                tracing.span("send half", self.topics.half, kind=SpanKind.PRODUCER),
                self._unsent.sending(txn_ids),
            ):
                [(txn_id, waiter)] = write_halves(
                    producer,
                    self.topics.half,
                    self.producer_group,
                    tracing.traced_messages(placed),
                    txn_ids,
                    SignalledWaiter,
                    self._checks.affinity(),
                )
                tracing.name_transaction(txn_id)
                try:
                    waiter.wait(
                        producer,
                        f"writing the half message of txn {txn_id}",
                        self._send_timeout_s + DELIVERY_GRACE_S,
                    )
                except RmqError as exc:  # never promoted, should it land anyway
                    self._unsent.failed(txn_id)
                    roll_back_unwritten(
                        producer,
                        self.topics.op,
                        self.producer_group,
                        txn_id,
                        waiter.partition,
                        self._half_partitions_now,
                        exc,
                    )
                    raise
                self._unsent.landed(txn_id)
            result, state = self._execute_local(listener_message(msg, txn_id), arg, waiter)
            self._end_inline(result, state, producer)
        return result

    def send_transaction(
        self,
        messages: Sequence[Message],
        arg: Any = None,
    ) -> TransactionSendResult:
        """Send ``messages`` (any topics) as ONE transaction: all promoted or none.

        Each is written as a half record to one half partition; once all are, the listener's
        ``execute_local_transaction`` runs once with a :class:`Transaction` view and one end
        request names the first (``half_offset``). An empty list, one over the bounds, a
        system topic or a partition its topic lacks raise before anything is written; a
        message not written raises once a ROLLBACK went (by member 0's offset, or by the
        transaction id when member 0 was not written; the error says so), and the local
        transaction is not run.
        """
        self._require_started()
        msgs, [txn_id] = list(messages), new_txn_ids(1)
        with tracing.span("send transaction", self.topics.half, "send", txn_id, messages=len(msgs)):
            with tracing.span("send half", self.topics.half, kind=SpanKind.PRODUCER):
                waiters = self._write_members(msgs, txn_id)
            view = Transaction(txn_id, tuple(listener_message(m, txn_id) for m in msgs), len(msgs))
            result, state = self._execute_local(view, arg, waiters[0], len(msgs))
            self._end_inline(result, state, self._call_producer())
        return result

    def _write_members(self, msgs: list[Message], txn_id: str) -> list[SignalledWaiter]:
        """Write every member of one transaction and wait for them; if one was not written,
        ROLLBACK the transaction (by member 0, or by its id if member 0 was not written, so
        what lands is dropped, not checked) and raise."""
        tracing.name_transaction(txn_id)
        check_members(msgs, max_messages=self.settings.max_transaction_messages)
        msgs = self._placed(msgs)
        headers = member_headers(
            tracing.traced_messages(msgs),
            txn_id,
            self.producer_group.encode(),
            str(int(time.time() * 1000)).encode(),
            max_messages=self.settings.max_transaction_messages,
            max_bytes=self.settings.max_transaction_bytes,
            affinity=self._checks.affinity(),
        )
        partition = half_partition_for(txn_id, len(self._half_partitions_now()))
        producer = self._call_producer()
        waiters: list[SignalledWaiter] = []
        deadline = time.monotonic() + self._send_timeout_s  # for all the members together
        with self._unsent.sending([txn_id]):
            try:
                write_members(
                    producer, self.topics.half, partition, msgs, headers, waiters, SignalledWaiter
                )
                _wait_members(producer, waiters, txn_id, deadline)
            except (RmqError, BufferError) as exc:
                self._unsent.failed(txn_id)
                if waiters:  # else nothing was queued: nothing can land
                    self._roll_back_written(
                        txn_id,
                        _first_written(producer, waiters, txn_id, deadline),
                        len(msgs),
                        producer,
                        partition,
                        exc,
                    )
                raise
            self._unsent.landed(txn_id)
        return waiters

    def _roll_back_written(
        self,
        txn_id: str,
        first: DeliveryWaiter | None,
        count: int,
        producer: confluent_kafka.Producer,
        partition: int,
        error: BaseException,
    ) -> None:
        """ROLLBACK a transaction whose members were not all written: by member 0's offset
        (``first``), or by its id on the half ``partition`` every member went to when member
        0 was not written (a member that lands anyway is rolled back, never checked). The
        caller's ``error`` says so."""
        if first is None:
            roll_back_unwritten(
                producer,
                self.topics.op,
                self.producer_group,
                txn_id,
                partition,
                self._half_partitions_now,
                error,
            )
            return
        rollback = LocalTransactionState.ROLLBACK_MESSAGE
        with tracing.span(
            "end transaction",
            self.topics.op,
            "send",
            txn_id,
            kind=SpanKind.PRODUCER,
            state=rollback.name,
        ):
            sent = self._send_end(
                TransactionSendResult(
                    txn_id, rollback, first.partition, first.offset, self.producer_group, count
                ),
                rollback,
                from_check=False,
                check_seq=0,
                producer=producer,
            )
        say_rolled_back(error, txn_id, sent)

    def _half_partitions_now(self) -> list[int]:
        return self._validate([]).partitions(self.topics.half, self._send_timeout_s)

    def _call_producer(self) -> confluent_kafka.Producer:
        self._require_started()
        return self._call.get()

    def _validate(self, msgs: list[Message]) -> PartitionCache:
        """Refuse, before any half write, a message the coordinator could never promote:
        one for a system topic, a topic that does not exist, a partition its topic lacks, an
        empty body or one over the topic's ``max.message.bytes`` (RocketMQ's
        ``Validators.checkMessage``, topic route and queue checks). Returns the partition
        cache."""
        checks = self.send_checks()
        checks.check(msgs, self._send_timeout_s)
        return checks.partitions

    def _placed(self, msgs: list[Message]) -> list[Message]:
        """``msgs`` validated (:meth:`_validate`) and placed as ``Producer.send`` places them
        (:func:`~rmq_semantics.selector.placement`): one with a message group and no
        partition gets its group's, written as ``rmq.real_partition``, since the coordinator
        promotes a half record without one by key. May block (metadata)."""
        partitions = self._validate(msgs)
        return [_with_placement(m, partitions, self._send_timeout_s) for m in msgs]

    def send_checks(self) -> SendChecks:
        """The send-time checks, over the partition cache ``start`` made."""
        if self._partitions is None:
            raise IllegalStateError("TransactionProducer is not started")
        if self._send_checks is None or self._send_checks.partitions is not self._partitions:
            self._send_checks = SendChecks(self._partitions, self._conf, self.topics.prefix)
        return self._send_checks

    def _execute_local(
        self, view: Message | Transaction, arg: Any, waiter: DeliveryWaiter, message_count: int = 1
    ) -> tuple[TransactionSendResult, LocalTransactionState]:
        try:
            with tracing.span("local transaction", view.topic, "process", view.transaction_id):
                answer, error = self.listener.execute_local_transaction(view, arg), None
        except Exception as exc:
            answer, error = None, exc
        return local_outcome(
            view, answer, error, waiter, self.producer_group, self.topics.half, message_count
        )

    def end_transaction(
        self,
        result: TransactionSendResult,
        state: LocalTransactionState,
        *,
        timeout: float | None = None,
    ) -> None:
        """Send ``state`` for a transaction (e.g. one left UNKNOW) and wait for the ack."""
        producer, waiter = self._require_started(), DeliveryWaiter()
        producer.produce(
            self.topics.op,
            encode(
                end_request(
                    result, state, producer_group=self.producer_group, from_check=False, check_seq=0
                )
            ),
            partition=result.half_partition,
            on_delivery=waiter,
        )
        waiter.wait(
            producer, f"ending txn {result.transaction_id}", timeout or self._send_timeout_s
        )

    def _send_end(
        self,
        result: TransactionSendResult,
        state: LocalTransactionState,
        *,
        from_check: bool,
        check_seq: int,
        producer: confluent_kafka.Producer | None = None,
    ) -> bool:
        """Queue an end request nobody waits for (after the local transaction ran, or a
        check's answer): it never raises; a failure is logged (False), the back-check
        resolves it."""
        producer = producer or self._require_started()
        request = end_request(
            result,
            state,
            producer_group=self.producer_group,
            from_check=from_check,
            check_seq=check_seq,
        )
        queued = queue_end(
            producer,
            self.topics.op,
            encode(request),
            result.half_partition,
            log_failed_end(
                f"{self.topics.half}[{result.half_partition}]@{result.half_offset}",
                result.transaction_id,
                state,
            ),
            f"the {state.value} end request of txn {result.transaction_id}",
        )
        if producer is not self._call.producer:  # its own thread serves its reports
            producer.poll(0)
        return queued

    def _end_inline(
        self,
        result: TransactionSendResult,
        state: LocalTransactionState,
        producer: confluent_kafka.Producer,
    ) -> None:
        """The local transaction's outcome, sent without waiting (a failure is logged: the
        back-check resolves the transaction)."""
        with tracing.span(
            "end transaction",
            self.topics.op,
            "send",
            result.transaction_id,
            kind=SpanKind.PRODUCER,
            state=state.name,
        ):
            self._send_end(result, state, from_check=False, check_seq=0, producer=producer)

    def flush(self, timeout: float = SEND_TIMEOUT_S) -> int:
        """Wait for queued end requests; returns how many are still queued."""
        deadline = time.monotonic() + timeout
        queued = self._require_started().flush(timeout)
        return queued + self._call.flush(max(0.0, deadline - time.monotonic()))

    # -- back-checks (their counters: CheckCounters) -------------------------------------
    def _ask(self, check: CheckRequest) -> LocalTransactionState:
        return ask_listener(self.listener, self.topics.half, check)

    def _reply_check(self, check: CheckRequest, state: LocalTransactionState) -> None:
        result = TransactionSendResult(
            check.txn_id, state, check.half_partition, check.half_offset, self.producer_group
        )
        self._send_end(result, state, from_check=True, check_seq=check.check_seq)


def _with_placement(msg: Message, partitions: PartitionCache, timeout: float) -> Message:
    if not placement_reads_partitions(msg, None, None):
        return msg
    partition = placement(msg, None, None, None, lambda: partitions.partitions(msg.topic, timeout))
    return dataclasses.replace(msg, partition=partition)


def _wait_members(
    producer: confluent_kafka.Producer, waiters: list[SignalledWaiter], txn_id: str, deadline: float
) -> None:
    """Wait for every member's delivery report until ``deadline`` (monotonic); raise as the
    one-message path does for the first member not written."""
    for index, waiter in enumerate(waiters):
        waiter.wait(
            producer,
            f"writing the half message {index} of {len(waiters)} of txn {txn_id}",
            max(0.0, deadline - time.monotonic()),
        )


def _first_written(
    producer: confluent_kafka.Producer, waiters: list[SignalledWaiter], txn_id: str, deadline: float
) -> SignalledWaiter | None:
    """Member 0's waiter once it is known to be written; None if it was not (then the
    transaction is rolled back by its id)."""
    try:
        first = waiters[0]
        first.wait(
            producer,
            f"writing the first half message of txn {txn_id}",
            max(0.0, deadline - time.monotonic()),
        )
    except (IndexError, RmqError):
        return None
    return first
