"""The back-check workers: RocketMQ's check executor (``setExecutorService``), with a timeout.

``threads`` workers take check jobs from a bounded queue and ask the listener. A check that
runs past ``timeout_s`` is answered UNKNOW on its behalf (the coordinator checks again
later) and its worker is replaced, so one hung ``check_local_transaction`` never stops the
instance's other checks; the hung thread's answer, if it ever comes, is dropped. A job that
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

    def __init__(self, *, threads: int, timeout_s: float, queue_size: int,
                 ask: Callable[[CheckRequest], LocalTransactionState],
                 reply: Callable[[CheckRequest, LocalTransactionState], Any],
                 done: Callable[[CheckJob], Any], name: str) -> None:
        self._ask, self._reply, self._done = ask, reply, done
        self._timeout_s = timeout_s
        self._threads = threads
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

    @property
    def maxsize(self) -> int:
        return self._jobs.maxsize

    def start(self) -> None:
        for _ in range(self._threads):
            self._spawn()
        watchdog = threading.Thread(target=self._watch, name=f"rmq-check-watchdog-{self._name}",
                                    daemon=True)
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
        worker = next(self._ids)
        thread = threading.Thread(target=self._work, args=(worker,), daemon=True,
                                  name=f"rmq-check-worker-{self._name}-{worker}")
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
                state = self._ask(job.check)
            except Exception as exc:  # a request no Message can be built from, or a bug
                with self._lock:
                    self._running.pop(worker, None)
                self.skipped += 1
                log.warning("%s: check #%d skipped, it cannot be asked: %r", job.where,
                            job.check.check_seq, exc)
                self._done(job)
                continue
            with self._lock:
                if self._running.pop(worker, None) is None:
                    # The watchdog answered UNKNOW for it and started a replacement.
                    log.warning("%s: check #%d returned %s after its timeout; dropped (UNKNOW "
                                "was sent)", job.where, job.check.check_seq, state.value)
                    return
            self._send(job, state)

    def _send(self, job: CheckJob, state: LocalTransactionState) -> None:
        try:
            self._reply(job.check, state)
            self.answered += 1
        except Exception as exc:  # not lost: the coordinator checks again later
            log.warning("%s: could not answer check #%d: %r", job.where, job.check.check_seq,
                        exc)
        finally:
            self._done(job)

    def _watch(self) -> None:
        """Answer UNKNOW for every check past its timeout and replace its worker."""
        while not self._stop.wait(WATCH_SLICE_S):
            now = time.monotonic()
            with self._lock:
                late = [(w, job) for w, (job, started) in self._running.items()
                        if now - started > self._timeout_s]
                for worker, _ in late:
                    del self._running[worker]
            for _, job in late:
                self.timed_out += 1
                log.warning("%s: check_local_transaction of check #%d ran past its %g s "
                            "timeout; answering UNKNOW (checked again later) and replacing "
                            "its thread", job.where, job.check.check_seq, self._timeout_s)
                self._spawn()
                self._send(job, LocalTransactionState.UNKNOW)
