"""The transactional producer's Kafka writes, shared by ``TransactionProducer`` and
``AsyncTransactionProducer``: half records (one per transaction, or the members of one),
end requests (one, or a batch's per half partition), and what a listener's answer makes of
a transaction. None of these waits: the caller waits for the delivery reports its own way
(a thread on a :class:`SignalledWaiter`, a coroutine on an asyncio future)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException

from rmq_semantics.errors import MalformedRecordError, RmqError
from rmq_semantics.message import Headers, Message
from rmq_semantics.producer import DeliveryWaiter
from rmq_semantics.records.codec import decode_as, encode
from rmq_semantics.records.half import half_headers
from rmq_semantics.records.txn import EndEntry, EndRequest, EndRequests, EndState
from rmq_semantics.transaction_api import (
    LocalTransactionState,
    Transaction,
    TransactionSendResult,
    as_state,
)

__all__ = [
    "DELIVERY_GRACE_S",
    "END_BATCH_MAX",
    "END_FLUSH_S",
    "END_STATE",
    "EndBatcher",
    "end_request",
    "half_write_conf",
    "local_outcome",
    "log_failed_end",
    "new_txn_ids",
    "queue_end",
    "roll_back_unwritten",
    "say_rolled_back",
    "send_end_batches",
    "write_halves",
    "write_members",
]

log = logging.getLogger("rmq_semantics.transaction")

# send_messages_in_transaction sends the decisions of a batch as one END_REQUESTS record per
# half partition, at the latest this long after the first of them was taken (so a batch of
# slow local transactions does not hold back the early commits), with at most this many.
END_FLUSH_S = 0.005
END_BATCH_MAX = 1000

# How long queuing an end request after the local transaction ran waits for room in a full
# local queue before it gives up (logged; the back-check resolves the transaction).
END_ROOM_WAIT_S = 5.0
ROOM_POLL_S = 0.05

# A half write's delivery report is awaited this much past the send timeout: librdkafka's
# message.timeout.ms is set to the send timeout (half_write_conf), so by then it has given
# up on the record and reported it (a record still in flight is reported later).
DELIVERY_GRACE_S = 2.0

#: The end state each local transaction state asks the coordinator for.
END_STATE = {s: EndState(s.value) for s in LocalTransactionState}


def local_outcome(
    view: Message | Transaction,
    answer: Any,
    error: BaseException | None,
    waiter: DeliveryWaiter,
    producer_group: str,
    half_topic: str,
    message_count: int = 1,
) -> tuple[TransactionSendResult, LocalTransactionState]:
    """What ``execute_local_transaction`` answered (or raised: ``error``) makes of the
    transaction whose first half record ``waiter`` reported: a raise, None or anything but
    a LocalTransactionState counts as UNKNOW, and is logged."""
    txn_id = view.transaction_id or ""
    if error is not None:
        log.error(
            "%s[%d]@%d txn=%s: execute_local_transaction raised (counts as UNKNOW)",
            half_topic,
            waiter.partition,
            waiter.offset,
            txn_id,
            exc_info=error,
        )
        state = LocalTransactionState.UNKNOW
    else:
        state = as_state(
            answer, "execute_local_transaction", half_topic, waiter.partition, waiter.offset, txn_id
        )
    return TransactionSendResult(
        txn_id, state, waiter.partition, waiter.offset, producer_group, message_count
    ), state


def end_request(
    result: TransactionSendResult,
    state: LocalTransactionState,
    *,
    producer_group: str,
    from_check: bool,
    check_seq: int,
) -> EndRequest:
    """The end request of ``result``'s transaction, asking for ``state``, from
    ``producer_group``: the CALLING producer's group, never ``result.producer_group``, so the
    coordinator's group check compares the half record with who asks (RocketMQ's
    ``endTransaction`` sends the producer's own group)."""
    return EndRequest(
        result.transaction_id,
        producer_group,
        result.half_partition,
        result.half_offset,
        END_STATE[state],
        from_check,
        check_seq,
        int(time.time() * 1000),
    )


def _log_failed_ends(err: KafkaError | None, msg: confluent_kafka.Message) -> None:
    """Delivery callback of a batch's end requests: log a failure."""
    if err is None:
        return
    # Not lost: the transactions stay pending and the back-check resolves them.
    try:
        txn_ids = [e.txn_id for e in decode_as(EndRequests, msg.value()).entries]
    except MalformedRecordError:
        txn_ids = []
    log.warning(
        "%s[%s]: %d end requests failed (%s); the back-check will resolve txns %s",
        msg.topic(),
        msg.partition(),
        len(txn_ids),
        err.str(),
        ", ".join(txn_ids[:20]) + (" ..." if len(txn_ids) > 20 else ""),
    )


def log_failed_end(half_where: str, txn_id: str, state: LocalTransactionState):
    """Delivery callback for an end request nobody waits for: log a failure."""

    def on_delivery(err: KafkaError | None, msg: confluent_kafka.Message) -> None:
        if err is not None:
            # Not lost: the transaction stays pending and the back-check resolves it.
            log.warning(
                "%s txn=%s: %s end request to %s[%s] failed (%s); the back-check will resolve it",
                half_where,
                txn_id,
                state.value,
                msg.topic(),
                msg.partition(),
                err.str(),
            )

    return on_delivery


def write_members(
    producer: confluent_kafka.Producer,
    half_topic: str,
    partition: int,
    msgs: list[Message],
    headers: list[list],
    waiters: list[DeliveryWaiter],
    new_waiter: Callable[[], DeliveryWaiter],
) -> None:
    """Queue every member of one transaction, in index order, to one half partition (one
    idempotent producer keeps that order there), a waiter per member queued in ``waiters``;
    a full local queue raises BufferError as the one-message path does."""
    for msg, member in zip(msgs, headers, strict=True):
        waiter = new_waiter()
        producer.produce(
            half_topic,
            msg.value,
            key=msg.key,
            headers=member,
            partition=partition,
            on_delivery=waiter,
        )
        waiters.append(waiter)


def new_txn_ids(count: int) -> list[str]:
    return [uuid.uuid4().hex for _ in range(count)]


def write_halves(
    producer: confluent_kafka.Producer,
    half_topic: str,
    producer_group: str,
    msgs: list[Message],
    txn_ids: list[str],
    new_waiter: Callable[[], DeliveryWaiter] = DeliveryWaiter,
    affinity: Headers = (),
    out: list[tuple[str, DeliveryWaiter]] | None = None,
) -> list[tuple[str, DeliveryWaiter]]:
    """Queue one half record per message, each its own transaction (of the id at its index
    in ``txn_ids``): (txn id, waiter)s, appended to ``out`` as they are queued (so a full
    local queue's BufferError leaves there what was queued before it)."""
    born = str(int(time.time() * 1000)).encode()
    group = producer_group.encode()
    out = [] if out is None else out
    for msg, txn_id in zip(msgs, txn_ids, strict=True):
        waiter = new_waiter()
        producer.produce(
            half_topic,
            msg.value,
            key=msg.key,
            headers=half_headers(msg, txn_id, group, born, affinity),
            on_delivery=waiter,
        )
        out.append((txn_id, waiter))
    return out


def send_end_batches(
    producer: confluent_kafka.Producer,
    op_topic: str,
    producer_group: str,
    decided: list[tuple[TransactionSendResult, LocalTransactionState]],
) -> None:
    """Inline decisions of a batch: one END_REQUESTS record per half partition (one
    record per decision cost as much again as the half write itself)."""
    if not decided:
        return
    by_partition: dict[int, list[EndEntry]] = {}
    for result, state in decided:
        by_partition.setdefault(result.half_partition, []).append(
            EndEntry(result.transaction_id, result.half_offset, END_STATE[state])
        )
    now = int(time.time() * 1000)
    for partition, entries in by_partition.items():
        queue_end(
            producer,
            op_topic,
            encode(EndRequests(producer_group, partition, tuple(entries), now)),
            partition,
            _log_failed_ends,
            f"{len(entries)} end requests ({entries[0].txn_id} ...)",
        )
    producer.poll(0)


def queue_end(
    producer: confluent_kafka.Producer,
    op_topic: str,
    value: bytes,
    partition: int,
    on_delivery: Callable[[KafkaError | None, Any], None],
    what: str,
) -> bool:
    """Queue an end request once local transactions ran: never raise past that committed
    work. A full local queue is waited on (serving delivery reports) up to
    ``END_ROOM_WAIT_S``; then, or on any other refusal, it is logged and False returned
    (the transactions stay pending and the back-check resolves them)."""
    deadline = time.monotonic() + END_ROOM_WAIT_S
    while True:
        try:
            producer.produce(op_topic, value, partition=partition, on_delivery=on_delivery)
            return True
        except BufferError:
            if time.monotonic() >= deadline:
                reason: object = f"the local queue stayed full for {END_ROOM_WAIT_S:.0f} s"
                break
            producer.poll(ROOM_POLL_S)
        except (KafkaException, RuntimeError) as exc:  # closed or fatal: nothing to wait for
            reason = exc
            break
    log.warning(
        "%s[%d]: %s not queued (%s); the back-check will resolve them",
        op_topic,
        partition,
        what,
        reason,
    )
    return False


class EndBatcher:
    """The decisions of a batch of transactions, sent by :func:`send_end_batches` once
    ``END_BATCH_MAX`` are taken or ``END_FLUSH_S`` after the first, and on :meth:`flush`."""

    def __init__(
        self, producer: confluent_kafka.Producer, op_topic: str, producer_group: str
    ) -> None:
        self._producer, self._op_topic, self._group = producer, op_topic, producer_group
        self._decided: list[tuple[TransactionSendResult, LocalTransactionState]] = []
        self._first_at = 0.0

    def add(self, result: TransactionSendResult, state: LocalTransactionState) -> None:
        if not self._decided:
            self._first_at = time.monotonic()
        self._decided.append((result, state))
        if len(self._decided) >= END_BATCH_MAX or time.monotonic() - self._first_at >= END_FLUSH_S:
            self.flush()

    def flush(self) -> None:
        send_end_batches(self._producer, self._op_topic, self._group, self._decided)
        self._decided = []


def half_write_conf(conf: dict, send_timeout_s: float) -> dict:
    """``conf`` with librdkafka's ``message.timeout.ms`` no longer than the send timeout
    (librdkafka's default of 300 s kept retrying a half write for minutes after the caller
    was told it failed; a caller's shorter value stays). Above ``linger.ms``, as librdkafka
    requires; 0 (librdkafka's "forever") counts as unset."""
    out = dict(conf)
    given = [
        int(v)
        for k in ("message.timeout.ms", "delivery.timeout.ms")
        if (v := out.pop(k, None)) is not None and int(v) > 0
    ]
    linger = int(out.get("linger.ms", out.get("queue.buffering.max.ms", 5)))
    out["message.timeout.ms"] = max(min([*given, max(1, int(send_timeout_s * 1000))]), linger + 1)
    return out


def roll_back_unwritten(
    producer: confluent_kafka.Producer,
    op_topic: str,
    group: str,
    txn_id: str,
    partition: int,
    half_partitions: Callable[[], list[int]],
    error: BaseException,
) -> None:
    """A half write reported failed: ROLLBACK its transaction by id (no half offset is known)
    on the Op partition of the half ``partition`` it went to (of every one when that is -1,
    not known, as for a record still in flight), so should the record land anyway it is
    rolled back, never checked or promoted; the caller's ``error`` says so. Never raises (a
    failure is logged with the transaction id)."""
    partitions = [partition]
    if partition < 0:
        try:
            partitions = half_partitions()
        except RmqError as exc:
            log.warning("txn=%s: half partitions not known (%s)", txn_id, exc)
            partitions = []
    now = int(time.time() * 1000)
    rollback = END_STATE[LocalTransactionState.ROLLBACK_MESSAGE]
    sent = [
        p
        for p in partitions
        if queue_end(
            producer,
            op_topic,
            encode(EndRequest(txn_id, group, p, -1, rollback, False, 0, now)),
            p,
            log_failed_end(
                f"txn={txn_id} (half write failed)", txn_id, LocalTransactionState.ROLLBACK_MESSAGE
            ),
            f"the ROLLBACK by id of txn {txn_id}",
        )
    ]
    say_rolled_back(error, txn_id, bool(sent))


def say_rolled_back(error: BaseException, txn_id: str, sent: bool) -> None:
    """Log, and tell the caller in ``error``'s text, that a ROLLBACK of ``txn_id`` went (or
    could not be queued) for its half write reported failed."""
    note = (
        f"; a ROLLBACK of txn {txn_id} was sent, so the half message is never promoted "
        f"should it land"
        if sent
        else f"; the ROLLBACK of txn {txn_id} could not be "
        f"queued: should the half message land, this producer answers its checks "
        f"ROLLBACK while it runs"
    )
    log.warning("txn=%s: half write failed (%s)%s", txn_id, error, note)
    if error.args and isinstance(error.args[0], str):
        error.args = (error.args[0] + note, *error.args[1:])
