"""Key mode's worker pool (``ordering="key"``): listener calls of ready keys, in parallel.

One :class:`~rmq_semantics.orderly.keys.KeyScheduler` holds the records the partition
feeders (:mod:`~rmq_semantics.orderly.keyfeed`) took from the partitions this consumer
holds, as :class:`~rmq_semantics.orderly.keyunits.Unit` s (consecutive records of one key,
up to ``batch_size``). Up to ``max_workers`` units are in listener calls at once, never two
of one key: a sync listener runs on ``max_workers`` threads, an ``async def`` one on one
event loop thread (a dispatcher thread submits the calls and settles their outcomes).

Outcomes: SUCCESS marks the unit's offsets done in its partition's tracker and leaves the
committable offset (with the done offsets above it) for the poll thread to commit, checked
against the lock epoch the call ran under. SUSPEND (or a raise, or a wrong return) delays
only that key; once retried ``max_reconsume_times`` times the unit is dead-lettered and the
key moves on. A unit whose lease lapsed before its call goes back uncounted.

``consume_timeout_ms`` (RocketMQ's ``consumeTimeout``): an ``async def`` call still running
then is cancelled and counts as failed; a sync call cannot be stopped, so it holds its key
until it returns and then counts as failed whatever it returned (its work is redone: at
least once). Either way a key that keeps timing out reaches the DLQ.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from rmq_semantics.consumed import offset_of
from rmq_semantics.errors import IllegalStateError
from rmq_semantics.orderly.api import ConsumeOrderlyContext, ConsumeOrderlyStatus
from rmq_semantics.orderly.dlq import Failure
from rmq_semantics.orderly.keys import KeyScheduler, KeysStatus, OrderingKey
from rmq_semantics.orderly.keyunits import Session, Unit
from rmq_semantics.orderly.offsets import split_metadata
from rmq_semantics.orderly.queue import QueuePhase
from rmq_semantics.orderly.runtime import WAIT_SLICE_S

if TYPE_CHECKING:
    from rmq_semantics.orderly.commits import Commits
    from rmq_semantics.orderly.dlq import DeadLetters

__all__ = [
    "DEFAULT_CONSUME_TIMEOUT_MS",
    "DEFAULT_KEY_WORKERS",
    "KeyPool",
    "Unit",
    "is_async_listener",
]

log = logging.getLogger(__name__)

#: Key mode's default ``max_workers`` (Parallel Consumer's benchmark ran 16 threads).
DEFAULT_KEY_WORKERS = 16
#: RocketMQ's ``consumeTimeout`` default, 15 minutes.
DEFAULT_CONSUME_TIMEOUT_MS = 15 * 60 * 1000
SUSPEND = ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
SUCCESS = ConsumeOrderlyStatus.SUCCESS
ACKS = frozenset({SUCCESS, ConsumeOrderlyStatus.COMMIT, ConsumeOrderlyStatus.ROLLBACK})


def _unit_key(unit: Unit) -> OrderingKey:
    return unit.key


def _unit_offset(unit: Unit) -> int:
    return unit.offset


def is_async_listener(listener: Callable[..., Any]) -> bool:
    """Whether calling ``listener`` returns a coroutine (``async def``, also as ``__call__``)."""
    call = getattr(listener, "__call__", None)  # noqa: B004 (a callable object's async __call__)
    return inspect.iscoroutinefunction(listener) or inspect.iscoroutinefunction(call)


def _status_of(result: object, unit: Unit) -> ConsumeOrderlyStatus:
    if isinstance(result, ConsumeOrderlyStatus):
        return result
    log.warning(
        "%s: listener returned %r, not a ConsumeOrderlyStatus; suspending the key",
        unit.where,
        result,
    )
    unit.reason = "bad_status"
    return SUSPEND


class KeyPool:
    """The scheduler of every held partition's units and the threads that run them."""

    def __init__(
        self,
        listener: Callable[..., Any],
        *,
        max_workers: int,
        max_reconsume_times: int,
        commits: Commits,
        dead_letters: DeadLetters,
        name: str,
        consume_timeout_ms: int = DEFAULT_CONSUME_TIMEOUT_MS,
    ) -> None:
        self._listener = listener
        self._timeout_s = consume_timeout_ms / 1000
        self.max_workers = max_workers
        self.max_reconsume_times = max_reconsume_times
        self._commits = commits
        self._dead_letters = dead_letters
        self._name = name
        self._scheduler = KeyScheduler(max_workers, key_of=_unit_key, offset_of=_unit_offset)
        self._cv = threading.Condition()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.is_async = is_async_listener(listener)
        self._loop: asyncio.AbstractEventLoop | None = None
        # Async calls done on the loop, settled by the dispatcher (a dead letter may block).
        self._completed: queue.SimpleQueue[tuple[Unit, ConsumeOrderlyContext, Future]] = (
            queue.SimpleQueue()
        )

    # -- life ------------------------------------------------------------------------------------
    def start(self) -> None:
        targets: list[tuple[str, Callable[[], None]]]
        if self.is_async:
            self._loop = asyncio.new_event_loop()
            targets = [("loop", self._loop.run_forever), ("dispatch", self._dispatch_async)]
        else:
            targets = [(f"key{i}", self._work) for i in range(self.max_workers)]
        for name, target in targets:
            thread = threading.Thread(
                target=target, daemon=True, name=f"rmq-orderly-{name}-{self._name}"
            )
            self._threads.append(thread)
            thread.start()

    def stop(self, deadline: float) -> None:
        """Stop taking units and join the threads (a hung listener is left behind by
        ``deadline``, a ``time.monotonic()`` instant). Idempotent."""
        self._stop.set()
        with self._cv:
            self._cv.notify_all()
        loop = self._loop
        for thread in self._threads:
            if thread.name.startswith("rmq-orderly-loop") and loop is not None:
                loop.call_soon_threadsafe(loop.stop)
            thread.join(max(0.1, deadline - time.monotonic()))
        if loop is not None and not loop.is_running() and not loop.is_closed():
            loop.close()

    # -- the feeders' side ----------------------------------------------------------------------
    def offer(self, units: list[Unit]) -> None:
        """Queue ``units`` (one partition's, offset order) behind their keys' earlier ones."""
        with self._cv:
            for unit in units:
                self._scheduler.offer(unit)
            self._cv.notify_all()

    def drop(self, tp: tuple[str, int]) -> None:
        """Forget ``tp``'s waiting units (its session ends); those in calls finish."""
        with self._cv:
            self._scheduler.drop_partition(tp)

    def wait_idle(self, session: Session, until: Callable[[], bool]) -> bool:
        """Wait until no unit of ``session`` is in a call, or ``until()`` says stop waiting;
        True when idle."""
        with self._cv:
            while session.in_flight:
                if until() or self._stop.is_set():
                    return False
                self._cv.wait(WAIT_SLICE_S)
            return True

    def keys_status(self) -> dict[tuple[str, int], KeysStatus]:
        with self._cv:
            return self._scheduler.status()

    # -- taking units ------------------------------------------------------------------------------
    def _take(self) -> Unit | None:
        """The next ready unit (``_cv`` held), counted in flight in its session."""
        unit = self._scheduler.next_ready(time.monotonic())
        if unit is not None:
            unit.session.in_flight += 1
        return unit

    def _wait(self) -> None:
        """Nothing ready (``_cv`` held): wait for a unit, a completion or a key's wake-up."""
        timeout = WAIT_SLICE_S
        wake = self._scheduler.next_wakeup()
        if wake is not None:
            timeout = max(0.0, min(timeout, wake - time.monotonic()))
        self._cv.wait(timeout)

    def _runnable(self, unit: Unit) -> bool:
        """The unit's session still holds its lock: else it goes back, uncounted."""
        session = unit.session
        q, st = session.q, session.q.state
        with q.cv:
            ok = (
                not session.closed
                and st.phase is QueuePhase.ALIGNED
                and st.aligned_epoch == session.epoch
                and st.lease_ok(time.monotonic())
            )
        if not ok:
            self._back(unit, time.monotonic() + WAIT_SLICE_S)
        return ok

    # -- sync: worker threads --------------------------------------------------------------------
    def _work(self) -> None:
        while not self._stop.is_set():
            with self._cv:
                unit = self._take()
                if unit is None:
                    self._wait()
                    continue
            try:
                if not self._runnable(unit):
                    continue
                context = self._context(unit)
                started = time.monotonic()
                try:
                    status = _status_of(self._listener(unit.messages(), context), unit)
                except Exception as exc:
                    status = self._raised(unit, exc, context)
                if time.monotonic() - started > self._timeout_s:
                    status = self._timed_out(unit, context)
                self._settle(unit, status, context.suspend_ms)
            except Exception:  # a bug must not kill the thread with the unit in flight
                log.exception("%s: key worker error", unit.where)
                self._back_if_in_flight(unit)

    # -- async: one event loop, one dispatcher thread -----------------------------------------
    def _dispatch_async(self) -> None:
        loop = self._loop
        assert loop is not None
        while not self._stop.is_set():
            self._settle_completed()
            with self._cv:
                unit = self._take()
                if unit is None:
                    if self._completed.empty():
                        self._wait()
                    continue
            if not self._runnable(unit):
                continue
            context = self._context(unit)
            try:
                future = asyncio.run_coroutine_threadsafe(
                    asyncio.wait_for(self._listener(unit.messages(), context), self._timeout_s),
                    loop,
                )
            except Exception as exc:  # wrong arguments, or it returned no coroutine
                future = Future()
                future.set_exception(exc)
            future.add_done_callback(functools.partial(self._complete_async, unit, context))

    def _complete_async(self, unit: Unit, context: ConsumeOrderlyContext, future: Future) -> None:
        self._completed.put((unit, context, future))  # on the loop thread
        with self._cv:
            self._cv.notify_all()

    def _settle_completed(self) -> None:
        while True:
            try:
                unit, context, future = self._completed.get_nowait()
            except queue.Empty:
                return
            try:
                if future.cancelled():
                    status = SUSPEND
                elif isinstance(exc := future.exception(), TimeoutError):
                    status = self._timed_out(unit, context)  # wait_for cancelled the call
                elif exc is not None:
                    status = self._raised(unit, exc, context)
                else:
                    status = _status_of(future.result(), unit)
                self._settle(unit, status, context.suspend_ms)
            except Exception:
                log.exception("%s: key dispatcher error", unit.where)
                self._back_if_in_flight(unit)

    # -- outcomes ---------------------------------------------------------------------------------
    @staticmethod
    def _context(unit: Unit) -> ConsumeOrderlyContext:
        tp = unit.session.q.tp
        return ConsumeOrderlyContext(tp[0], tp[1], unit.session.epoch, key_mode=True)

    @staticmethod
    def _raised(
        unit: Unit, exc: BaseException, context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        log.warning(
            "%s: listener raised %r; suspending the key for %d ms",
            unit.where,
            exc,
            context.suspend_ms,
        )
        unit.reason, unit.error = "raised", exc
        return SUSPEND

    def _timed_out(self, unit: Unit, context: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
        log.warning(
            "%s: listener call ran past consume_timeout_ms (%d ms); counted as failed,"
            " suspending the key for %d ms",
            unit.where,
            int(self._timeout_s * 1000),
            context.suspend_ms,
        )
        unit.reason, unit.error = "timed_out", None
        return SUSPEND

    def _settle(self, unit: Unit, status: ConsumeOrderlyStatus, suspend_ms: int) -> None:
        # Auto-commit is always on here: COMMIT and ROLLBACK ack, as in RocketMQ.
        if status in ACKS:
            self._finish(unit)
            return
        failure = unit.failure = unit.failure or Failure()
        failure.record(unit.reason or "suspended", unit.error)
        unit.reason = unit.error = None
        retried = not 0 <= self.max_reconsume_times <= unit.reconsume_times
        if not retried and self._dead_letter(unit):
            self._finish(unit)
            return
        if retried:
            unit.reconsume_times += 1
        self._back(unit, time.monotonic() + suspend_ms / 1000)

    def _back(self, unit: Unit, until: float) -> None:
        """The unit goes first again for its key at ``until`` (forgotten if its partition
        was dropped meanwhile: the next holder redoes it)."""
        with self._cv:
            self._scheduler.suspend(unit, until)
            unit.session.in_flight -= 1
            self._cv.notify_all()

    def _back_if_in_flight(self, unit: Unit) -> None:
        """After a bug: give the unit back unless it was settled already."""
        with contextlib.suppress(IllegalStateError):  # settled: nothing is in flight
            self._back(unit, time.monotonic() + WAIT_SLICE_S)

    def _finish(self, unit: Unit) -> None:
        """Done: the key's next unit may go; the offsets are done in the partition's tracker
        and the new committable offset is left for the poll thread (under the call's
        epoch, so a deposed holder's commit is refused)."""
        with self._cv:
            self._scheduler.finished(unit)
            unit.session.in_flight -= 1
            self._cv.notify_all()
        size_of = unit.session.q.state.size_of
        self.done_offsets(
            unit.session,
            [offset_of(record) for record in unit.records],
            freed_bytes=sum(map(size_of, unit.records)),
        )

    def done_offsets(self, session: Any, offsets: list[int], freed_bytes: int = 0) -> None:
        """``offsets`` of ``session`` are finished (processed, or skipped by the tag filter),
        and ``freed_bytes`` of the records it took with them: leave the new committable
        offset for the poll thread."""
        q = session.q
        with q.cv:  # one completion at a time per partition: commits never go backwards
            session.taken_bytes -= freed_bytes
            if session.closed:
                return
            tracker = session.tracker
            for offset in offsets:
                tracker.done(offset)
            committable = tracker.committable()
            q.cv.notify_all()  # the feeder may be waiting for the gap to shrink
            if committable is not None:
                offset, metadata = committable
                self._commits.processed(q, offset, session.epoch, split_metadata(metadata)[0])

    def _dead_letter(self, unit: Unit) -> bool:
        q = unit.session.q
        reason = self._commits.may_commit(q, unit.session.epoch)  # a deposed holder must not
        if reason is not None:
            log.warning("%s: not dead-lettering: %s", unit.where, reason)
            return False
        return self._dead_letters.send(unit.messages(), unit.session.epoch, unit.failure)
