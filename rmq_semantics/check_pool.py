"""The back-check workers: RocketMQ's check executor (``setExecutorService``), with a timeout.

``threads`` workers take check jobs from a bounded queue and ask the listener. A check that
runs past ``timeout_s`` is answered UNKNOW on its behalf (the coordinator checks again
later) and its worker is replaced, so one hung ``check_local_transaction`` never stops the
instance's other checks; the hung thread's answer, if it ever comes, is dropped, and the
thread works again if the pool is short of workers. At most ``max_abandoned`` hung threads
are replaced: past that (a database that hangs every check) no thread is started, and while
every worker hangs the queued checks are answered UNKNOW at once (``starved``). A job that
cannot be asked at all (a request no ``Message`` can be built from) is logged and skipped:
no worker ever dies of one.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rmq_semantics.records.txn import CheckRequest
from rmq_semantics.transaction_api import LocalTransactionState

__all__ = ["CheckJob", "CheckPool"]

log = logging.getLogger(__name__)

# How often the watchdog looks for checks past their timeout, and the workers' wait slice
# (it bounds how long a shutdown waits for an idle worker).
WATCH_SLICE_S = 0.1


@dataclass(frozen=True, slots=True)
class CheckJob:
    """One check request and where it was read (for logs and the offsets to commit)."""

    check: CheckRequest
    topic: str
    partition: int
    offset: int

    @property
    def where(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset} txn={self.check.txn_id}"


class CheckPool:
    """``ask(check) -> state`` on ``threads`` workers, then ``reply(check, state)``;
    ``done(job)`` once a job is answered, timed out or skipped (never before its reply)."""

    def __init__(
        self,
        *,
        threads: int,
        timeout_s: float,
        queue_size: int,
        ask: Callable[[CheckRequest], LocalTransactionState],
        reply: Callable[[CheckRequest, LocalTransactionState], Any],
        done: Callable[[CheckJob], Any],
        name: str,
        max_abandoned: int | None = None,
    ) -> None:
        self._ask, self._reply, self._done = ask, reply, done
        self._timeout_s = timeout_s
        self._threads = threads
        self._max_abandoned = threads if max_abandoned is None else max_abandoned
        self._live = 0  # workers not abandoned
        self._abandoned: set[int] = set()  # workers past their timeout, still in the listener
        self._name = name
        self._jobs: queue.Queue[CheckJob] = queue.Queue(maxsize=queue_size)
        self._lock = threading.Lock()
        self._running: dict[int, tuple[CheckJob, float]] = {}  # worker id -> job, start
        self._ids = itertools.count(1)
        self._workers: list[threading.Thread] = []
        self._stop = threading.Event()
        #: Checks answered (the listener's answer, or UNKNOW after a raise).
        self.answered = 0
        #: Checks answered UNKNOW because the listener ran past the timeout.
        self.timed_out = 0
        #: Jobs skipped: no answer could be asked for (logged with where they were read).
        self.skipped = 0
        #: Checks answered UNKNOW unasked: every worker hung and no more may be started.
        self.starved = 0

    @property
    def abandoned(self) -> int:
        """Threads still in a listener call past its timeout (at most ``max_abandoned``)."""
        with self._lock:
            return len(self._abandoned)

    @property
    def maxsize(self) -> int:
        return self._jobs.maxsize

    def start(self) -> None:
        for _ in range(self._threads):
            self._spawn()
        watchdog = threading.Thread(
            target=self._watch, name=f"rmq-check-watchdog-{self._name}", daemon=True
        )
        watchdog.start()
        self._workers.append(watchdog)

    def submit(self, job: CheckJob) -> bool:
        """Queue ``job``; False when the queue is full (the caller drops it)."""
        try:
            self._jobs.put_nowait(job)
            return True
        except queue.Full:
            return False

    def stop(self, timeout: float) -> None:
        """Stop taking jobs and wait up to ``timeout`` for the workers. A worker stuck in the
        listener is left to finish on its own (daemon). Idempotent."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        for thread in self._workers:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._workers = []

    # -- workers -------------------------------------------------------------------------
    def _spawn(self) -> None:
        with self._lock:
            self._live += 1
        worker = next(self._ids)
        thread = threading.Thread(
            target=self._work,
            args=(worker,),
            daemon=True,
            name=f"rmq-check-worker-{self._name}-{worker}",
        )
        thread.start()
        with self._lock:
            self._workers = [t for t in self._workers if t.is_alive()] + [thread]

    def _work(self, worker: int) -> None:
        while not self._stop.is_set():
            try:
                job = self._jobs.get(timeout=WATCH_SLICE_S)
            except queue.Empty:
                continue
            with self._lock:
                self._running[worker] = (job, time.monotonic())
            try:
                state, error = self._ask(job.check), None
            except Exception as exc:  # a request no Message can be built from, or a bug
                state, error = LocalTransactionState.UNKNOW, exc
            with self._lock:
                late = self._running.pop(worker, None) is None
                rejoin = late and self._live < self._threads
                if late:  # the watchdog answered UNKNOW for it
                    self._abandoned.discard(worker)
                    self._live += rejoin
            if late:
                log.warning(
                    "%s: check #%d returned %s after its timeout; dropped (UNKNOW was sent)",
                    job.where,
                    job.check.check_seq,
                    repr(error) if error else state.value,
                )
                if not rejoin:
                    return
            elif error is not None:
                self.skipped += 1
                log.warning(
                    "%s: check #%d skipped, it cannot be asked: %r",
                    job.where,
                    job.check.check_seq,
                    error,
                )
                self._done(job)
            else:
                self._send(job, state)

    def _send(self, job: CheckJob, state: LocalTransactionState) -> None:
        try:
            self._reply(job.check, state)
            self.answered += 1
        except Exception as exc:  # not lost: the coordinator checks again later
            log.warning("%s: could not answer check #%d: %r", job.where, job.check.check_seq, exc)
        finally:
            self._done(job)

    def _watch(self) -> None:
        """Answer UNKNOW for every check past its timeout and replace its worker (up to
        ``max_abandoned`` hung ones); while every worker hangs, answer the queue UNKNOW."""
        while not self._stop.wait(WATCH_SLICE_S):
            now = time.monotonic()
            with self._lock:
                late = [
                    (w, job)
                    for w, (job, started) in self._running.items()
                    if now - started > self._timeout_s
                ]
                for worker, _ in late:
                    del self._running[worker]
                    self._abandoned.add(worker)
                    self._live -= 1
                replace = min(
                    len(late),
                    self._max_abandoned + self._threads - self._live - len(self._abandoned),
                )
            for n, (_, job) in enumerate(late):
                self.timed_out += 1
                log.warning(
                    "%s: check_local_transaction of check #%d ran past its %g s "
                    "timeout; answering UNKNOW (checked again later)%s",
                    job.where,
                    job.check.check_seq,
                    self._timeout_s,
                    " and replacing its thread"
                    if n < replace
                    else f"; {self._max_abandoned} hung threads already, none started",
                )
                if n < replace:
                    self._spawn()
                self._send(job, LocalTransactionState.UNKNOW)
            self._starve()

    def _starve(self) -> None:
        """No worker left (all hung, no more may start): queued checks are answered UNKNOW
        now rather than waiting unseen; the coordinator checks them again later."""
        while self._live == 0 and not self._stop.is_set():
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return
            self.starved += 1
            log.warning(
                "%s: check #%d answered UNKNOW unasked: every check thread is stuck "
                "in check_local_transaction",
                job.where,
                job.check.check_seq,
            )
            self._send(job, LocalTransactionState.UNKNOW)
