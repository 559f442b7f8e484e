"""A campaign producer process: ``python -m tests.campaign.producer_worker --config F
--index I --api sync|async``.

Runs the seeded plan (workload.plan_ops) through the public API only: ``TransactionProducer``
(``send_message_in_transaction``, ``send_transaction``) or ``AsyncTransactionProducer``, its
local transactions real rows behind ``TransactionBarrier`` in its own SQLite file, its checks
answered from the barrier row. An operation with a timer message sends it after its
transaction with ``Producer.send`` (``AsyncProducer``), and recalls it at once with
``recall_message`` when the plan says so. Every step goes to its history file.

SIGUSR1 ends the load: no new operation starts, those in flight finish (``drained``), and the
producer stays up answering back-checks (the drain phase). SIGTERM shuts it down (exit 0).
A restarted process (same index) resumes after the last operation its history shows, with
the same producer group and database.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException

from rmq_semantics import (
    AsyncProducer,
    AsyncTransactionProducer,
    LocalTransactionState,
    Producer,
    RmqError,
    SendResult,
    TransactionProducer,
)
from rmq_semantics.barrier import (
    AsyncBarrierTransactionListener,
    AsyncTransactionBarrier,
    BarrierTransactionListener,
    TransactionBarrier,
)
from tests.campaign import events as ev
from tests.campaign.config import CampaignConfig
from tests.campaign.history import Recorder
from tests.campaign.workload import (
    BAD_PARTITION,
    BARRIER_TABLE,
    DELAY_LEVELS,
    INSERT_SQL,
    NO_ROW,
    RAISE,
    SLOW,
    Op,
    PlannedFailure,
    PlannedTimer,
    answer_for,
    barrier_reason,
    business_rows,
    connect,
    create_schema,
    create_topics,
    intent_of,
    plan_ops,
)

log = logging.getLogger("campaign.producer")

# A check waits this long for an open local transaction, then answers UNKNOW: shorter than
# a SLOW local transaction, so those are checked UNKNOW at least once.
BARRIER_LOCK_S = 1.0
# The async producer's operations in flight at once.
ASYNC_CONCURRENCY = 4
SHUTDOWN_TIMEOUT_S = 30.0
# A timer send whose wall clock moved this much more (or less) than the monotonic one
# meanwhile saw a clock skew step: its deliver_at bounds are not comparable (timer_sent).
CLOCK_JUMP_MS = 500
# What a timer send or recall may raise under the faults (its own record then says so).
TIMER_ERRORS = (RmqError, KafkaException, RuntimeError, BufferError)


def names(cfg: CampaignConfig, index: int) -> tuple[str, str]:
    """(process name, producer group): one group per process, as each has its own
    database; a check must reach the database the local transaction wrote."""
    return f"producer-{index}", f"{cfg.run_id}-pg{index}"


def history_path(cfg: CampaignConfig, index: int) -> Path:
    return Path(cfg.out_dir) / "history" / f"producer-{index}.jsonl"


def db_path(cfg: CampaignConfig, index: int) -> Path:
    return Path(cfg.out_dir) / "db" / f"producer-{index}.sqlite"


def last_op(path: Path) -> int:
    """The last operation an earlier run of this process sent or saw fail (-1: none). An
    operation killed before its local transaction began is redone: no row of it exists, and
    its half record, if any, is checked ROLLBACK (no barrier row)."""
    last = -1
    if path.exists():
        for line in path.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("kind") in ("send", "send_failed") and event.get("op") is not None:
                last = max(last, int(event["op"]))
    return last


def operations(cfg: CampaignConfig, index: int) -> Iterator[Op]:
    name, _ = names(cfg, index)
    new = [(40 + 60 * k, cfg.new_topic(index, k)) for k in range(cfg.new_topics_per_producer)]
    resume = last_op(history_path(cfg, index))
    # The plan is deterministic: ops already started are skipped (a topic an earlier run
    # created stays in the plan's topics).
    plan = plan_ops(cfg.seed, name, list(cfg.topics), cfg.keys, new, timer_max_s=cfg.timer_max_s)
    for op in plan:
        if op.n > resume:
            yield op


class Worker:
    """What both APIs share: the plan, the history, the pace and the drain signal."""

    def __init__(self, cfg: CampaignConfig, index: int, api: str) -> None:
        self.cfg, self.index, self.api = cfg, index, api
        self.name, self.group = names(cfg, index)
        self.db = db_path(cfg, index)
        self.db.parent.mkdir(parents=True, exist_ok=True)
        create_schema(self.db)
        self.rec = Recorder(history_path(cfg, index), self.name)
        self.ops = operations(cfg, index)
        self.txn_of: dict[int, str] = {}  # op -> its transaction id, once the listener ran
        self.ops_lock = threading.Lock()
        self.drain = threading.Event()
        self.stop = threading.Event()
        self.slow_s = cfg.coordinator["transaction_timeout_ms"] * 1.5 / 1000

    def next_op(self) -> Op:
        with self.ops_lock:
            return next(self.ops)

    def conf(self) -> dict:
        return {"bootstrap.servers": self.cfg.bootstrap}

    def producer_kwargs(self) -> dict:
        return {
            "producer_group": self.group,
            "topic_prefix": self.cfg.topic_prefix,
            "half_partitions": self.cfg.coordinator["half_partitions"],
            "check_partitions": self.cfg.coordinator["check_partitions"],
            "instance_id": f"{self.name}-{int(time.monotonic() * 1000)}",
        }

    def timer_kwargs(self) -> dict:
        """The timer producer's options: the coordinators' timer settings (config.py)."""
        return {
            "topic_prefix": self.cfg.topic_prefix,
            "producer_group": self.group,
            "timer_partitions": self.cfg.coordinator["timer_partitions"],
            "max_delay_ms": self.cfg.coordinator["max_delay_ms"],
            "delay_levels": DELAY_LEVELS,
        }

    def timer_start(self, op: Op) -> tuple[PlannedTimer, Any, int, float]:
        """The timer message of ``op`` and its timer_send event (written before the send:
        one killed midway is still known); returns (timer, message, wall ms, monotonic)."""
        t = op.timer
        assert t is not None
        wall, mono = time.time_ns() // 1_000_000, time.monotonic()
        msg = t.message(wall, op.pad)
        self.rec.emit(
            ev.timer_send(
                t.mid,
                self.group,
                t.topic,
                t.how,
                t.delay_ms,
                recall=t.recall,
                wall_before_ms=wall,
                key=t.key,
                level=t.level,
                deliver_at_ms=msg.deliver_at_ms,
            )
        )
        return t, msg, wall, mono

    def timer_sent(
        self, t: PlannedTimer, wall: int, mono: float, result: SendResult | BaseException
    ) -> bool:
        """Records what the send returned; True when it was acknowledged."""
        if isinstance(result, BaseException):
            error = f"{type(result).__name__}: {result}"[:300]
            self.rec.emit(ev.timer_sent(t.mid, False, error=error))
            return False
        after_wall, after_mono = time.time_ns() // 1_000_000, time.monotonic()
        lo, hi = t.window(wall, after_wall)
        jump = abs((after_wall - wall) - (after_mono - mono) * 1000) > CLOCK_JUMP_MS
        self.rec.emit(
            ev.timer_sent(
                t.mid,
                True,
                message_id=result.message_id,
                deliver_lo_ms=lo,
                deliver_hi_ms=hi,
                clock_jump=jump,
            )
        )
        return True

    def timer_recalled(self, t: PlannedTimer, message_id: str, error: BaseException | None) -> None:
        detail = None if error is None else f"{type(error).__name__}: {error}"[:300]
        self.rec.emit(ev.timer_recalled(t.mid, error is None, message_id, error=detail))

    def send_timer(self, producer: Producer, op: Op) -> None:
        if op.timer is None:
            return
        t, msg, wall, mono = self.timer_start(op)
        try:
            result: SendResult | BaseException = producer.send(msg)
        except TIMER_ERRORS as exc:
            result = exc
        if not self.timer_sent(t, wall, mono, result) or not t.recall:
            return
        assert isinstance(result, SendResult) and result.message_id is not None
        try:
            producer.recall_message(result.message_id)
        except TIMER_ERRORS as exc:
            self.timer_recalled(t, result.message_id, exc)
        else:
            self.timer_recalled(t, result.message_id, None)

    async def send_timer_async(self, producer: AsyncProducer, op: Op) -> None:
        if op.timer is None:
            return
        t, msg, wall, mono = self.timer_start(op)
        try:
            result: SendResult | BaseException = await producer.send(msg)
        except TIMER_ERRORS as exc:
            result = exc
        if not self.timer_sent(t, wall, mono, result) or not t.recall:
            return
        assert isinstance(result, SendResult) and result.message_id is not None
        try:
            await producer.recall_message(result.message_id)
        except TIMER_ERRORS as exc:
            self.timer_recalled(t, result.message_id, exc)
        else:
            self.timer_recalled(t, result.message_id, None)

    def before_send(self, op: Op) -> None:
        if op.new_topic:
            create_topics(self.cfg.bootstrap, [op.new_topic], self.cfg.partitions)
            self.rec.emit(ev.topic_created(op.new_topic, partitions=self.cfg.partitions))

    def began(self, op: Op, txn_id: str) -> None:
        """The half record is written and the local transaction starts: the send event
        (the transaction id is known from here on)."""
        self.txn_of[op.n] = txn_id
        d = op.describe()
        draft = ev.send(
            txn_id,
            self.group,
            d["topics"],
            d["mids"],
            intent_of(op.kind),
            keys=d["keys"],
            api=self.api,
        )
        self.rec.record(draft.kind, **draft.fields, op=op.n, op_kind=op.kind, multi=op.multi)

    def sent(self, op: Op, result: Any) -> None:
        self.rec.emit(
            ev.sent(
                result.transaction_id,
                self.group,
                result.local_transaction_state.name,
                half=f"{result.half_partition}:{result.half_offset}",
            )
        )

    def failed(self, op: Op, exc: BaseException) -> None:
        draft = ev.send_failed(
            self.group,
            type(exc).__name__,
            txn_id=self.txn_of.get(op.n),
            msg_ids=[m.mid for m in op.messages],
        )
        self.rec.record(
            draft.kind,
            **draft.fields,
            op=op.n,
            detail=str(exc)[:300],
            planned=op.kind == BAD_PARTITION,
        )

    def business_sql(self, cursor: Any, msg: Any, op: Op) -> None:
        cursor.executemany(INSERT_SQL, business_rows(msg.transaction_id, op, self.name))

    def local_done(self, op: Op, txn_id: str, state: LocalTransactionState) -> None:
        """The local transaction ended: its outcome is the barrier row's (``msg``: its
        rows committed; ``rollback``; none: it never ran)."""
        reason = barrier_reason(self.db, txn_id)
        if reason == "msg":
            self.rec.emit(ev.local_committed(txn_id, self.group, db=self.db.name, row=reason))
        elif reason is not None or state is LocalTransactionState.ROLLBACK_MESSAGE:
            # A rolled-back local transaction may leave no barrier row (its insert rolled
            # back with it); the check then writes one.
            self.rec.emit(
                ev.local_rolled_back(txn_id, self.group, db=self.db.name, row=reason or "none")
            )

    def checked(self, msg: Any, state: LocalTransactionState) -> None:
        answer = {"COMMIT_MESSAGE": "COMMIT", "ROLLBACK_MESSAGE": "ROLLBACK"}.get(
            state.name, "UNKNOW"
        )
        self.rec.emit(
            ev.check_answered(
                msg.transaction_id, self.group, answer, checks=getattr(msg, "check_times", None)
            )
        )


# -- the synchronous producer ---------------------------------------------------------------
class SyncListener(BarrierTransactionListener):
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        super().__init__(
            TransactionBarrier(table=BARRIER_TABLE, lock_timeout_s=BARRIER_LOCK_S),
            connect=lambda: connect(worker.db),
            business=self._business,
        )

    def _business(self, cursor: Any, msg: Any, op: Op) -> LocalTransactionState | None:
        self.worker.business_sql(cursor, msg, op)
        if op.kind == SLOW:
            time.sleep(self.worker.slow_s)  # outlives transaction_timeout_ms: checked meanwhile
        if op.kind == RAISE:
            raise PlannedFailure(f"op {op.n}: planned failure")
        return answer_for(op.kind)

    def execute_local_transaction(self, msg: Any, arg: Any) -> LocalTransactionState:
        self.worker.began(arg, msg.transaction_id)
        if arg.kind == NO_ROW:
            state = LocalTransactionState.UNKNOW  # never ran: the check decides ROLLBACK
        else:
            state = super().execute_local_transaction(msg, arg)
        self.worker.local_done(arg, msg.transaction_id, state)
        return state

    def check_local_transaction(self, msg: Any) -> LocalTransactionState:
        state = super().check_local_transaction(msg)
        self.worker.checked(msg, state)
        return state


def run_sync(worker: Worker) -> None:
    producer = TransactionProducer(
        worker.conf(), listener=SyncListener(worker), **worker.producer_kwargs()
    )
    producer.start()
    timers = Producer(worker.conf(), **worker.timer_kwargs())
    worker.rec.emit(ev.worker("ready", role="producer", group=worker.group, api="sync"))
    pause = 1.0 / worker.cfg.ops_per_s
    try:
        while not worker.drain.is_set():
            started = time.monotonic()
            op = worker.next_op()
            try:
                worker.before_send(op)
                msgs = op.to_kafka()
                result = (
                    producer.send_transaction(msgs, op)
                    if op.multi
                    else producer.send_message_in_transaction(msgs[0], op)
                )
                worker.sent(op, result)
            except (RmqError, RuntimeError, BufferError) as exc:
                worker.failed(op, exc)
            worker.send_timer(timers, op)
            worker.drain.wait(max(0.0, pause - (time.monotonic() - started)))
        worker.rec.emit(ev.worker("drained"))
        while not worker.stop.wait(0.2):
            pass  # the check threads answer meanwhile
    finally:
        timers.close(SHUTDOWN_TIMEOUT_S)
        producer.shutdown(SHUTDOWN_TIMEOUT_S)
        worker.rec.emit(ev.worker("stopped"))


# -- the asyncio producer -------------------------------------------------------------------
def async_listener(worker: Worker) -> AsyncBarrierTransactionListener:
    import aiosqlite

    @asynccontextmanager
    async def connection() -> AsyncIterator[Any]:
        conn = await aiosqlite.connect(str(worker.db), isolation_level=None, timeout=10)
        try:
            yield conn
        finally:
            await conn.close()

    async def business(cursor: Any, msg: Any, op: Op) -> LocalTransactionState | None:
        await cursor.executemany(INSERT_SQL, business_rows(msg.transaction_id, op, worker.name))
        if op.kind == SLOW:
            await asyncio.sleep(worker.slow_s)
        if op.kind == RAISE:
            raise PlannedFailure(f"op {op.n}: planned failure")
        return answer_for(op.kind)

    class Listener(AsyncBarrierTransactionListener):
        async def execute_local_transaction(self, msg: Any, arg: Any) -> LocalTransactionState:
            worker.began(arg, msg.transaction_id)
            if arg.kind == NO_ROW:
                state = LocalTransactionState.UNKNOW
            else:
                state = await super().execute_local_transaction(msg, arg)
            worker.local_done(arg, msg.transaction_id, state)
            return state

        async def check_local_transaction(self, msg: Any) -> LocalTransactionState:
            state = await super().check_local_transaction(msg)
            worker.checked(msg, state)
            return state

    barrier = AsyncTransactionBarrier(table=BARRIER_TABLE, lock_timeout_s=BARRIER_LOCK_S)
    return Listener(barrier, connection=connection, business=business)


async def run_async(worker: Worker) -> None:
    loop = asyncio.get_running_loop()
    drain, stop = asyncio.Event(), asyncio.Event()
    loop.add_signal_handler(signal.SIGUSR1, drain.set)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    producer = AsyncTransactionProducer(
        worker.conf(), listener=async_listener(worker), **worker.producer_kwargs()
    )
    await producer.start()
    timers = AsyncProducer(worker.conf(), **worker.timer_kwargs())
    worker.rec.emit(ev.worker("ready", role="producer", group=worker.group, api="async"))
    pause = ASYNC_CONCURRENCY / worker.cfg.ops_per_s

    async def sender() -> None:
        while not drain.is_set() and not stop.is_set():
            started = time.monotonic()
            op = worker.next_op()
            try:
                await asyncio.to_thread(worker.before_send, op)  # topic creation blocks
                msgs = op.to_kafka()
                result = await (
                    producer.send_transaction(msgs, op)
                    if op.multi
                    else producer.send_message_in_transaction(msgs[0], op)
                )
                worker.sent(op, result)
            except (RmqError, RuntimeError, BufferError) as exc:
                worker.failed(op, exc)
            await worker.send_timer_async(timers, op)
            with suppress(TimeoutError):
                await asyncio.wait_for(drain.wait(), max(0.0, pause - (time.monotonic() - started)))

    try:
        await asyncio.gather(*(sender() for _ in range(ASYNC_CONCURRENCY)))
        worker.rec.emit(ev.worker("drained"))
        await stop.wait()  # the checks are answered on this loop meanwhile
    finally:
        await timers.close(SHUTDOWN_TIMEOUT_S)
        await producer.shutdown(SHUTDOWN_TIMEOUT_S)
        worker.rec.emit(ev.worker("stopped"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--api", choices=("sync", "async"), required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    worker = Worker(CampaignConfig.read(args.config), args.index, args.api)
    worker.rec.emit(ev.worker("start", role="producer", group=worker.group, api=args.api))
    if args.api == "async":
        asyncio.run(run_async(worker))
    else:
        signal.signal(signal.SIGUSR1, lambda *_: worker.drain.set())
        signal.signal(signal.SIGTERM, lambda *_: (worker.drain.set(), worker.stop.set()))
        run_sync(worker)
    worker.rec.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
