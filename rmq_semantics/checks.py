"""Back-checks on the producer side: RocketMQ's ``checkTransactionState`` for one group.

The coordinator writes check requests for a producer group to the check topic, spread over
its partitions by transaction id, or, with check affinity, to one of the partitions the
sending instance's check consumer held when it wrote the half record
(``rmq.check_partitions``): the check reaches that instance while it still holds them, and
whoever took them over once it is gone. Every live producer of the group is a member of one
consumer group over the check topic, so each request reaches one of them.

A :class:`CheckResponder` consumes them, drops those superseded by a newer check of the same
half record, and hands each to a :class:`CheckPool` that asks the listener with a timeout.
A request's offset is committed only once it is answered (or skipped), so an instance that
dies mid-check leaves it to the next owner of the partition.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from tenacity import retry_if_exception

from rmq_semantics.check_pool import CheckJob, CheckPool
from rmq_semantics.clientconf import client_conf
from rmq_semantics.errors import ConfigError, MalformedRecordError
from rmq_semantics.message import Headers
from rmq_semantics.multi import check_view
from rmq_semantics.records.codec import decode
from rmq_semantics.records.half import MAX_INSTANCE_ID_LENGTH, affinity_headers
from rmq_semantics.records.txn import CheckRequest
from rmq_semantics.retry import retrying
from rmq_semantics.topics import SystemTopics
from rmq_semantics.tracing import check_span
from rmq_semantics.transaction_api import LocalTransactionState, as_state

if TYPE_CHECKING:
    from rmq_semantics.unsent import UnsentHalves

__all__ = [
    "CHECK_QUEUE_SIZE",
    "CheckCounters",
    "CheckResponder",
    "ask_listener",
    "valid_instance_id",
]

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
# Answered checks' offsets are committed at most this often (and on a revoke or shutdown).
COMMIT_EVERY_S = 0.5


def valid_instance_id(given: str | None) -> str:
    """``given`` if it is a valid instance id, else one made of host, pid and a random part
    (unique per producer, also across processes of one host)."""
    if given is None:
        return f"{socket.gethostname()[:64]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    if (
        not isinstance(given, str)
        or not given
        or len(given.encode()) > MAX_INSTANCE_ID_LENGTH
        or not given.isascii()
        or not given.isprintable()
    ):
        raise ConfigError(
            f"instance_id must be printable ASCII of 1 to "
            f"{MAX_INSTANCE_ID_LENGTH} bytes, got {given!r}"
        )
    return given


def ask_listener(listener: Any, half_topic: str, check: CheckRequest) -> LocalTransactionState:
    """``listener.check_local_transaction``'s answer to ``check``; a listener that raises
    answers UNKNOW. A request no message can be built from raises (the pool logs and skips
    it)."""
    view = check_view(check)  # a member of several: the first one and the count
    try:
        with check_span(check.headers, check.topic, check.txn_id, check.check_seq):
            return as_state(
                listener.check_local_transaction(view),
                "check_local_transaction",
                half_topic,
                check.half_partition,
                check.half_offset,
                check.txn_id,
            )
    except Exception:
        log.exception(
            "%s[%d]@%d txn=%s: check_local_transaction raised (answering UNKNOW)",
            half_topic,
            check.half_partition,
            check.half_offset,
            check.txn_id,
        )
        return LocalTransactionState.UNKNOW


class CheckCounters:
    """The back-check counters of a producer whose ``_checks`` is its CheckResponder."""

    _checks: CheckResponder
    _unsent: UnsentHalves

    @property
    def checks_answered(self) -> int:
        """Back-checks this producer answered."""
        return self._checks.answered

    @property
    def dropped_checks(self) -> int:
        """Check requests dropped because the check queue was full."""
        return self._checks.dropped

    @property
    def checks_timed_out(self) -> int:
        """Back-checks answered UNKNOW because the listener ran past ``check_timeout_ms``."""
        return self._checks.timed_out

    @property
    def failed_send_ids_dropped(self) -> int:
        """Ids of half writes reported failed forgotten before 15 minutes because over 10,000
        were kept: a check of one asks the listener again (the ROLLBACK by id the
        coordinator was sent still holds)."""
        return self._unsent.dropped


def _fatal(err: KafkaError) -> bool:
    return err.fatal() or err.code() == KafkaError._FATAL


class CheckResponder:
    """Consumes one producer group's check requests; ``ask(check)`` is the listener's
    answer (it may hang: see :class:`CheckPool`), ``reply(check, state)`` sends it.
    A KafkaOperationError or BufferError from ``reply`` is logged (the coordinator checks
    again later)."""

    def __init__(
        self,
        conf: dict,
        topics: SystemTopics,
        producer_group: str,
        *,
        instance_id: str,
        check_topic: str | None = None,
        ask: Callable[[CheckRequest], LocalTransactionState],
        reply: Callable[[CheckRequest, LocalTransactionState], object],
        threads: int = 1,
        timeout_s: float = 60.0,
        affinity: bool = True,
        queue_size: int = CHECK_QUEUE_SIZE,
    ) -> None:
        self.producer_group = producer_group
        self.topics = topics
        # The shared check topic, or the group's own under tenant isolation (its group
        # then has the topic's name: one literal ACL name covers both).
        self.check_topic = check_topic or topics.check
        self._conf = client_conf(
            conf,
            who="check consumer",
            internal=True,
            forced={
                "group.id": topics.check_group(producer_group)
                if check_topic is None
                else check_topic,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "session.timeout.ms": 10000,
                "heartbeat.interval.ms": 1000,
            },
        )
        self._pool = CheckPool(
            threads=threads,
            timeout_s=timeout_s,
            queue_size=queue_size,
            ask=ask,
            reply=reply,
            done=self._done,
            name=producer_group,
        )
        self._seen: OrderedDict[str, int] = OrderedDict()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._consumer: confluent_kafka.Consumer | None = None
        # Offsets per check partition: read up to (next offset) and jobs not yet done.
        self._offsets_lock = threading.Lock()
        self._read_to: dict[int, int] = {}
        self._unfinished: dict[int, set[int]] = {}
        self._committed: dict[int, int] = {}
        self.instance_id = instance_id
        self._affinity = affinity
        #: The check partitions held now (check affinity: named in each half record).
        self.held_partitions: tuple[int, ...] = ()
        #: Check requests dropped because the check queue was full.
        self.dropped = 0

    @property
    def answered(self) -> int:
        return self._pool.answered

    @property
    def timed_out(self) -> int:
        return self._pool.timed_out

    def affinity(self) -> Headers:
        """Check affinity's headers for a half record written now: this instance and the
        check partitions it holds (none while it holds none, or with affinity off)."""
        return affinity_headers(self.instance_id, self.held_partitions) if self._affinity else []

    def start(self) -> None:
        self._consumer = confluent_kafka.Consumer(self._conf)
        self._consumer.subscribe(
            [self.check_topic],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        self._pool.start()
        thread = threading.Thread(
            target=self._consume, daemon=True, name=f"rmq-check-consumer-{self.producer_group}"
        )
        thread.start()
        self._threads.append(thread)

    def stop(self, timeout: float) -> None:
        """Stop the consumer and the workers, commit what was answered and leave the check
        group. Idempotent."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout)
        self._threads = []
        self._pool.stop(timeout)
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            self._commit(consumer, asynchronous=False)
            consumer.close()

    # -- offsets: committed only below the first check not yet answered ------------------
    def _done(self, job: CheckJob) -> None:
        with self._offsets_lock:
            unfinished = self._unfinished.get(job.partition)
            if unfinished is not None:
                unfinished.discard(job.offset)

    def _commit(
        self,
        consumer: confluent_kafka.Consumer,
        asynchronous: bool = True,
        partitions: list[int] | None = None,
    ) -> None:
        with self._offsets_lock:
            wanted = []
            for p in self._read_to if partitions is None else partitions:
                if p not in self._read_to:
                    continue
                unfinished = self._unfinished.get(p)
                position = min(unfinished) if unfinished else self._read_to[p]
                if self._committed.get(p) != position:
                    self._committed[p] = position
                    wanted.append(TopicPartition(self.check_topic, p, position))
        if not wanted:
            return
        try:
            consumer.commit(offsets=wanted, asynchronous=asynchronous)
        except (KafkaException, RuntimeError) as exc:  # checked again: nothing is lost
            log.warning(
                "check consumer of producer group %s: commit failed: %s", self.producer_group, exc
            )
            with self._offsets_lock:
                for tp in wanted:
                    self._committed.pop(tp.partition, None)

    def _on_assign(self, consumer: confluent_kafka.Consumer, partitions: list) -> None:
        with self._offsets_lock:
            for tp in partitions:
                self._read_to.pop(tp.partition, None)
                self._unfinished[tp.partition] = set()
                self._committed.pop(tp.partition, None)
            self.held_partitions = tuple(sorted(self._unfinished))

    def _on_revoke(self, consumer: confluent_kafka.Consumer, partitions: list) -> None:
        # Checks still running for these partitions are answered anyway; their requests
        # are read again by the next owner, whose answer is a harmless duplicate.
        self._commit(consumer, asynchronous=False, partitions=[tp.partition for tp in partitions])
        self._forget(partitions)

    def _on_lost(self, consumer: confluent_kafka.Consumer, partitions: list) -> None:
        self._forget(partitions)

    def _forget(self, partitions: list) -> None:
        with self._offsets_lock:
            for tp in partitions:
                for table in (self._read_to, self._unfinished, self._committed):
                    table.pop(tp.partition, None)
            self.held_partitions = tuple(sorted(self._unfinished))

    def _superseded(self, job: CheckJob) -> bool:
        # A re-driven transaction is a new half record whose checks count from 1 again.
        check = job.check
        half_id = f"{check.txn_id}@{check.half_partition}:{check.half_offset}"
        seq = check.check_seq
        newest = self._seen.get(half_id, 0)
        if seq <= newest:
            return True
        self._seen[half_id] = seq
        self._seen.move_to_end(half_id)
        while len(self._seen) > SEEN_CHECKS:
            self._seen.popitem(last=False)
        return False

    def _consume(self) -> None:
        """Feed check requests to the pool until stopped. A failing consume is retried with
        the shared policy's pauses for as long as the producer runs (checks must resume after
        a broker outage); a fatal error stops this thread with one log line, and sending goes
        on (the coordinator checks again later)."""
        policy = retrying(CHECK_RETRY_DEADLINE_S, self._stop).copy(
            sleep=self._stop.wait,  # a shutdown cuts a pause short
            retry=retry_if_exception(
                lambda exc: isinstance(exc, KafkaException) and not _fatal(exc.args[0])
            ),
        )
        last_commit = time.monotonic()
        while not self._stop.is_set():
            try:
                msgs = policy(self._consumer.consume, 500, POLL_SLICE_S)
            except KafkaException as exc:
                if self._stop.is_set():
                    return
                if not _fatal(exc.args[0]):
                    log.error(
                        "check consumer of producer group %s failing for %.0f s: %s; retrying",
                        self.producer_group,
                        CHECK_RETRY_DEADLINE_S,
                        exc.args[0].str(),
                    )
                    continue
                self._stopped(exc.args[0])
                return
            except RuntimeError:  # closed under us: shutdown gave up waiting for this thread
                return
            self._take(msgs)
            if time.monotonic() - last_commit >= COMMIT_EVERY_S:
                last_commit = time.monotonic()
                self._commit(self._consumer)

    def _take(self, msgs: list) -> None:
        """Queue the newest check of each transaction in ``msgs``; every other record is done
        when read (malformed ones are logged with where they were read)."""
        newest: dict[str, CheckJob] = {}
        read_to: dict[int, int] = {}
        for msg in msgs:
            err = msg.error()
            if err is not None:
                if _fatal(err):
                    self._stopped(err)
                    self._stop.set()
                    return
                if err.code() != KafkaError._PARTITION_EOF:
                    log.warning("check consumer: %s", err.str())
                continue
            read_to[msg.partition()] = msg.offset() + 1
            try:
                record = decode(msg.value())
            except MalformedRecordError as exc:
                log.warning(
                    "%s[%d]@%d skipped: %s", msg.topic(), msg.partition(), msg.offset(), exc
                )
                continue
            if not isinstance(record, CheckRequest) or (
                record.producer_group != self.producer_group
            ):
                continue
            current = newest.get(record.txn_id)
            if current is None or record.check_seq > current.check.check_seq:
                newest[record.txn_id] = CheckJob(record, msg.topic(), msg.partition(), msg.offset())
        jobs = [job for job in newest.values() if not self._superseded(job)]
        with self._offsets_lock:
            for partition, offset in read_to.items():
                if partition in self._unfinished:  # still ours
                    self._read_to[partition] = offset
            jobs = [job for job in jobs if job.partition in self._unfinished]
            for job in jobs:
                self._unfinished[job.partition].add(job.offset)
        for job in jobs:
            if not self._pool.submit(job):
                self.dropped += 1
                self._done(job)
                log.warning(
                    "%s: check queue full (%d), dropping check #%d; the coordinator "
                    "will check it again",
                    job.where,
                    self._pool.maxsize,
                    job.check.check_seq,
                )

    def _stopped(self, err: KafkaError) -> None:
        log.error(
            "check consumer of producer group %s stopped: %s (fatal); back-checks go "
            "unanswered until the producer restarts",
            self.producer_group,
            err.str(),
        )
