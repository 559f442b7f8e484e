"""``TransactionProducer.send_messages_in_transaction``: many messages, each its own
transaction, with the half writes pipelined on the producer the conf batches (a mixin of
:class:`rmq_semantics.transaction.TransactionProducer`, whose parts it uses)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import confluent_kafka

from rmq_semantics import tracing
from rmq_semantics.errors import RmqError
from rmq_semantics.message import Message
from rmq_semantics.multi import listener_message
from rmq_semantics.producer import DeliveryWaiter
from rmq_semantics.transaction_api import LocalTransactionState, TransactionSendResult
from rmq_semantics.txn_writes import (
    DELIVERY_GRACE_S,
    EndBatcher,
    new_txn_ids,
    roll_back_unwritten,
    write_halves,
)

if TYPE_CHECKING:  # the producer this mixes into
    from rmq_semantics.checks import CheckResponder
    from rmq_semantics.topics import SystemTopics
    from rmq_semantics.transaction_api import Transaction
    from rmq_semantics.unsent import UnsentHalves

__all__ = ["BatchTransactions"]

log = logging.getLogger("rmq_semantics.transaction")


class BatchTransactions:
    """The batch path of :class:`~rmq_semantics.TransactionProducer`."""

    if TYPE_CHECKING:
        producer_group: str
        topics: SystemTopics
        _checks: CheckResponder
        _unsent: UnsentHalves
        _send_timeout_s: float

        def _require_started(self) -> confluent_kafka.Producer: ...
        def _placed(self, msgs: list[Message]) -> list[Message]: ...
        def _half_partitions_now(self) -> list[int]: ...
        def _execute_local(
            self,
            view: Message | Transaction,
            arg: Any,
            waiter: DeliveryWaiter,
            message_count: int = 1,
        ) -> tuple[TransactionSendResult, LocalTransactionState]: ...

    def send_messages_in_transaction(
        self, msgs: list[Message], arg: Any = None
    ) -> list[TransactionSendResult]:
        """Like :meth:`send_message_in_transaction` for many messages, with the half writes
        pipelined: each message is still its own transaction with its own local transaction
        and decision. A message whose half write failed is not executed; its result has
        ``half_offset == -1`` and ``ROLLBACK_MESSAGE``, and the error is logged. A message
        for a system topic or a partition its topic lacks raises for the whole batch before
        any half write (a caller's mistake, not a broker failure)."""
        producer = self._require_started()
        placed = self._placed(msgs)
        txn_ids = new_txn_ids(len(msgs))
        pending: list[tuple[str, DeliveryWaiter]] = []
        with self._unsent.sending(txn_ids):
            try:
                write_halves(
                    producer,
                    self.topics.half,
                    self.producer_group,
                    tracing.traced_messages(placed),
                    txn_ids,
                    DeliveryWaiter,
                    affinity=self._checks.affinity(),
                    out=pending,
                )
            except BufferError as exc:  # what was queued before it is never promoted
                self._roll_back_queued(producer, pending, exc)
                raise
            _poll_until_delivered(
                producer,
                [w for _, w in pending],
                time.monotonic() + self._send_timeout_s + DELIVERY_GRACE_S,
            )
            results = []
            ends = EndBatcher(producer, self.topics.op, self.producer_group)
            for msg, (txn_id, waiter) in zip(msgs, pending, strict=True):
                if waiter.delivered and waiter.error is None:
                    self._unsent.landed(txn_id)
                    result, state = self._execute_local(listener_message(msg, txn_id), arg, waiter)
                    results.append(result)
                    ends.add(result, state)
                    continue
                reason = waiter.error.str() if waiter.error is not None else "timed out"
                log.error(
                    "%s txn=%s: half message for %s not written (%s); local transaction not run",
                    self.topics.half,
                    txn_id,
                    msg.topic,
                    reason,
                )
                self._roll_back_failed(producer, txn_id, waiter, RmqError(reason))
                results.append(
                    TransactionSendResult(
                        txn_id, LocalTransactionState.ROLLBACK_MESSAGE, -1, -1, self.producer_group
                    )
                )
            ends.flush()
        return results

    def _roll_back_failed(
        self,
        producer: confluent_kafka.Producer,
        txn_id: str,
        waiter: DeliveryWaiter,
        error: BaseException,
    ) -> None:
        """A half write reported failed: its checks are answered ROLLBACK here, and the
        coordinator is sent a ROLLBACK by id."""
        self._unsent.failed(txn_id)
        roll_back_unwritten(
            producer,
            self.topics.op,
            self.producer_group,
            txn_id,
            waiter.partition,
            self._half_partitions_now,
            error,
        )

    def _roll_back_queued(
        self,
        producer: confluent_kafka.Producer,
        pending: list[tuple[str, DeliveryWaiter]],
        error: BaseException,
    ) -> None:
        """A batch that raises (``error``: the local queue filled up) after queuing
        ``pending``: none of their local transactions runs, so each is rolled back, by its
        offset once its report came within the send timeout, else by its id."""
        _poll_until_delivered(
            producer,
            [w for _, w in pending],
            time.monotonic() + self._send_timeout_s + DELIVERY_GRACE_S,
        )
        ends = EndBatcher(producer, self.topics.op, self.producer_group)
        rollback = LocalTransactionState.ROLLBACK_MESSAGE
        for txn_id, waiter in pending:
            if waiter.delivered and waiter.error is None:
                self._unsent.failed(txn_id)
                ends.add(
                    TransactionSendResult(
                        txn_id, rollback, waiter.partition, waiter.offset, self.producer_group
                    ),
                    rollback,
                )
            else:
                self._roll_back_failed(producer, txn_id, waiter, RmqError(str(error)))
        ends.flush()
        log.error(
            "%s: a batch raised after %d half messages were queued (%s); each was rolled back",
            self.topics.half,
            len(pending),
            error,
        )


def _poll_until_delivered(
    producer: confluent_kafka.Producer, waiters: list[DeliveryWaiter], deadline: float
) -> None:
    """Serve ``producer``'s delivery reports until every waiter has one, or ``deadline``."""
    waiting = 0  # index of the first half write not known to be delivered
    while waiting < len(waiters) and time.monotonic() < deadline:
        if waiters[waiting].delivered:
            waiting += 1
        else:
            producer.poll(0.01)
