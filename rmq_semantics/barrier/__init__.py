"""dtm's two-phase message barrier for ``TransactionProducer`` listeners (SQLite, PostgreSQL),
and for ``AsyncTransactionProducer`` ones (aiosqlite, psycopg's AsyncConnection).

A back-check that reads the business tables can answer ROLLBACK while the local transaction
is still open, or before it began, and the local transaction then commits what was never
promoted. The barrier makes the local transaction and the check race for one row: see
:class:`TransactionBarrier`.
"""

from rmq_semantics.barrier.aio import AsyncBarrierTransactionListener, AsyncTransactionBarrier
from rmq_semantics.barrier.barrier import BarrierTransaction, TransactionBarrier
from rmq_semantics.barrier.listener import BarrierTransactionListener
from rmq_semantics.errors import BarrierRollback

__all__ = [
    "AsyncBarrierTransactionListener",
    "AsyncTransactionBarrier",
    "BarrierRollback",
    "BarrierTransaction",
    "BarrierTransactionListener",
    "TransactionBarrier",
]
