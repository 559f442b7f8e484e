"""The queue-lock service: RocketMQ's broker-side ``RebalanceLockManager`` on Kafka.

Clients (:class:`rmq_semantics.lock_client.LockClient`) write batch lock/unlock requests
to ``<prefix>_lock_request``, partitioned by the lock key ``group/topic/partition``. The
service instances form one consumer group (``<prefix>_lock_coordinator``) over that topic,
so several instances split the partitions. The owner of request partition p keeps the
lock table of every key in p; the table is persisted in the compacted ``<prefix>_lock``
topic, partition p, so a restarted or new owner continues with the same locks and the
epochs keep growing. For each batch of requests the owner writes, in ONE Kafka
transaction, the changed lock entries, one reply per request to ``<prefix>_lock_reply``
(the partition the client named) and its consumer offsets
(``send_offsets_to_transaction`` with the group metadata). A zombie owner is therefore
fenced: its transaction fails once the group has moved on, and its replies, never
committed, are invisible to the clients (who read replies ``read_committed``).

Takeover of a partition: wait for stable committed offsets (librdkafka asks for them when
``isolation.level=read_committed``; a zombie's pending transaction resolves first), read
the lock topic partition to its end, then resume consuming requests. Held leases are
extended to a full lease from the takeover (see :meth:`LockTable.restore`).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from coordinator.lock import LockTable
from coordinator.promote import RETRY_BACKOFF_MS
from coordinator.settings import CoordinatorSettings
from rmq_semantics.errors import (
    ConfigError,
    FatalKafkaError,
    KafkaOperationError,
    MalformedRecordError,
    RmqError,
)
from rmq_semantics.records.codec import decode_as, decode_lock_state, encode
from rmq_semantics.records.locks import LockReply, LockRequest, QueueResult, RequestKind
from rmq_semantics.retry import retrying
from rmq_semantics.settings import add_arguments, load
from rmq_semantics.topics import SystemTopics, ensure_topics, topic_partition_count

__all__ = ["LockService", "lock_coordinator_group", "lock_topic_specs", "main"]

log = logging.getLogger(__name__)

# First wait for a request; bounds how late a stop flag or a rebuild is noticed.
POLL_WAIT_S = 0.05
MAX_BATCH = 500
# Generous for a loaded 2-core broker; a transaction normally commits in a few ms.
TXN_CALL_TIMEOUT_S = 30.0
# A dead owner's open transaction blocks read_committed readers (clients waiting for
# replies, the next owner's rebuild) until the broker aborts it: keep it short.
TRANSACTION_TIMEOUT_MS = 10000
# Retriable commit_transaction errors are retried this long before the batch is aborted.
COMMIT_DEADLINE_S = 30.0
# A broker that is still starting is waited for this long at startup.
STARTUP_DEADLINE_S = 60.0
# Stable committed offsets wait for a zombie's pending transaction (<= its timeout).
COMMITTED_TIMEOUT_S = 2 * TRANSACTION_TIMEOUT_MS / 1000
REBUILD_TIMEOUT_S = 30.0
# After a failed rebuild or a retriable error: pause before trying again.
RETRY_PAUSE_S = 0.5
# A dead service instance's partitions move to the others within this; well under a lease.
SESSION_TIMEOUT_MS = 10000
# Requests and replies are only useful for seconds; an hour leaves room for debugging.
SHORT_RETENTION_MS = 3600 * 1000
# How long close() from another thread waits for run() to finish its transaction.
CLOSE_TIMEOUT_S = TXN_CALL_TIMEOUT_S + 5


def lock_coordinator_group(prefix: str) -> str:
    """The consumer group the lock-service instances form."""
    return f"{prefix}_lock_coordinator"


def lock_topic_specs(settings: CoordinatorSettings) -> dict[str, tuple[int, dict[str, str]]]:
    """Request, state and reply topics: ``half_partitions`` partitions each."""
    topics = SystemTopics(settings.topic_prefix)
    n = settings.half_partitions
    short = {"cleanup.policy": "delete", "retention.ms": str(SHORT_RETENTION_MS)}
    return {
        topics.lock_request: (n, short),
        # Never deleted by time: a released lock's epoch must survive (epochs only grow).
        topics.lock: (n, {"cleanup.policy": "compact"}),
        topics.lock_reply: (n, short),
    }


@dataclass(frozen=True)
class _Clients:
    consumer: confluent_kafka.Consumer
    producer: confluent_kafka.Producer
    reader: confluent_kafka.Consumer


def _now_ms() -> int:
    return int(time.time() * 1000)


class LockService:
    """Owns request partitions through a consumer group and answers lock requests.

    ``conf`` holds ``bootstrap.servers`` and any security settings; they are passed to
    every client untouched. ``run(stop)`` blocks until ``stop`` is set; ``close()`` is
    idempotent. ``metrics`` (optional) is a :class:`coordinator.metrics.CoordinatorMetrics`.
    """

    def __init__(self, conf: dict, settings: CoordinatorSettings, *,
                 metrics: Any = None) -> None:
        if not isinstance(conf, dict) or "bootstrap.servers" not in conf:
            raise ConfigError("LockService conf must be a dict with 'bootstrap.servers'")
        self.conf = dict(conf)
        self.settings = settings
        self.metrics = metrics
        self.topics = SystemTopics(settings.topic_prefix)
        self.instance_id = settings.instance_id or uuid.uuid4().hex[:12]
        self.group = lock_coordinator_group(settings.topic_prefix)
        self.transactional_id = f"{self.group}-{self.instance_id}"
        #: Set once the service is consuming requests (tests and health checks wait on it).
        self.ready = threading.Event()
        #: Counters: requests, granted, renewed, taken_over, denied, released, malformed, ...
        self.counts: Counter[str] = Counter()
        self._tables: dict[int, LockTable] = {}
        self._assigned: set[int] = set()
        self._unready: set[int] = set()
        self._request_partitions = 0
        self._reply_partitions = 0
        self._c: _Clients | None = None
        self._halt = threading.Event()
        self._finished = threading.Event()
        self._finished.set()
        self._state_lock = threading.Lock()
        self._runner: threading.Thread | None = None
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Start, answer requests until ``stop`` is set, then release everything."""
        with self._state_lock:
            if self._closed:
                raise ConfigError("LockService.run: the service is closed; make a new one")
            self._runner = threading.current_thread()
            self._finished.clear()
        try:
            self._startup(stop)
            log.info("lock service %s running (prefix %s, %d request partitions)",
                     self.instance_id, self.settings.topic_prefix, self._request_partitions)
            self.ready.set()
            while not (stop.is_set() or self._halt.is_set()):
                try:
                    self._step()
                except FatalKafkaError:
                    raise
                except RmqError as exc:
                    log.warning("lock service: %s; retrying in %.1f s", exc, RETRY_PAUSE_S)
                    stop.wait(RETRY_PAUSE_S)
        finally:
            self.ready.clear()
            self._close_clients()
            self._finished.set()
            log.info("lock service %s stopped", self.instance_id)

    def close(self) -> None:
        """Stop (after the transaction in progress) and release the clients. Idempotent."""
        self._halt.set()
        runner = self._runner
        if (runner is not None and runner is not threading.current_thread()
                and not self._finished.wait(CLOSE_TIMEOUT_S)):
            log.warning("lock service %s did not stop within %.0f s", self.instance_id,
                        CLOSE_TIMEOUT_S)
            return
        self._close_clients()

    def _close_clients(self) -> None:
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
            clients, self._c = self._c, None
        if clients is None:
            return
        for client in (clients.consumer, clients.reader):
            try:
                client.close()
            except (KafkaException, RuntimeError) as exc:
                log.warning("closing lock-service consumer: %s", exc)
        clients.producer.flush(TXN_CALL_TIMEOUT_S)

    def _clients(self) -> _Clients:
        if self._c is None:
            raise KafkaOperationError("the lock service is not running (call run())")
        return self._c

    def __enter__(self) -> LockService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- startup ---------------------------------------------------------------------------
    def _client_conf(self, **extra: object) -> dict:
        conf = dict(self.conf)
        conf.setdefault("logger", logging.getLogger("rmq_semantics.librdkafka"))
        conf.update(extra)
        return conf

    def _startup(self, stop: threading.Event) -> None:
        for attempt in retrying(STARTUP_DEADLINE_S, stop):
            with attempt:
                ensure_topics(self.conf, lock_topic_specs(self.settings))
        requests = topic_partition_count(self.conf, self.topics.lock_request)
        state = topic_partition_count(self.conf, self.topics.lock)
        replies = topic_partition_count(self.conf, self.topics.lock_reply)
        if not requests or requests != state or not replies:
            raise ConfigError(
                f"{self.topics.lock_request} has {requests} partitions and {self.topics.lock} "
                f"has {state}; they must be co-partitioned (same count) — delete and recreate "
                "them with the same half_partitions")
        if requests != self.settings.half_partitions:
            log.warning("%s has %d partitions (half_partitions=%d); using %d",
                        self.topics.lock_request, requests, self.settings.half_partitions,
                        requests)
        self._request_partitions, self._reply_partitions = requests, replies
        producer = confluent_kafka.Producer(self._client_conf(**{
            "transactional.id": self.transactional_id,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 1,
            "retry.backoff.ms": RETRY_BACKOFF_MS,  # see coordinator.promote
            "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
        }))
        self._txn_call(producer.init_transactions, "initialising transactions")
        consumer = confluent_kafka.Consumer(self._client_conf(**{
            "group.id": self.group,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "partition.assignment.strategy": "range",
            "session.timeout.ms": SESSION_TIMEOUT_MS,
            "fetch.wait.max.ms": 20,
        }))
        reader = confluent_kafka.Consumer(self._client_conf(**{
            "group.id": f"{self.group}-reader",  # never joined nor committed: assign() only
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 10,  # the end of a partition is an empty fetch: answer fast
        }))
        with self._state_lock:
            self._c = _Clients(consumer, producer, reader)
        consumer.subscribe([self.topics.lock_request], on_assign=self._on_assign,
                           on_revoke=self._on_revoke, on_lost=self._on_revoke)

    def _txn_call(self, fn: Any, what: str, *args: Any) -> None:
        try:
            fn(*args, TXN_CALL_TIMEOUT_S)
        except KafkaException as exc:
            err: KafkaError = exc.args[0]
            if err.fatal():
                raise FatalKafkaError(
                    f"{what}: {err.str()} (fatal; was this instance fenced by another with "
                    f"transactional.id {self.transactional_id}?)", err) from exc
            raise KafkaOperationError.wrap(what, err) from exc

    # -- partition ownership (called from inside consume()) ---------------------------------
    def _on_assign(self, consumer: confluent_kafka.Consumer, partitions: list) -> None:
        consumer.assign(partitions)
        if partitions:
            consumer.pause(partitions)  # until the lock table of each is rebuilt
        for tp in partitions:
            self._assigned.add(tp.partition)
            self._unready.add(tp.partition)
        log.info("lock service %s assigned request partitions %s", self.instance_id,
                 sorted(tp.partition for tp in partitions))

    def _on_revoke(self, consumer: confluent_kafka.Consumer, partitions: list) -> None:
        # Between transactions by construction: consume() is only called outside one.
        for tp in partitions:
            self._assigned.discard(tp.partition)
            self._unready.discard(tp.partition)
            self._tables.pop(tp.partition, None)
        log.info("lock service %s gave up request partitions %s", self.instance_id,
                 sorted(tp.partition for tp in partitions))

    def _rebuild(self) -> None:
        """Load the lock tables of the partitions just taken over, then resume them."""
        clients = self._clients()
        parts = sorted(self._unready)
        request_tps = [TopicPartition(self.topics.lock_request, p) for p in parts]
        try:
            committed = clients.consumer.committed(request_tps, timeout=COMMITTED_TIMEOUT_S)
        except KafkaException as exc:
            raise KafkaOperationError.wrap("reading committed request offsets",
                                           exc.args[0]) from exc
        tables = {p: LockTable() for p in parts}
        eof: set[int] = set()
        clients.reader.assign([TopicPartition(self.topics.lock, p,
                                            confluent_kafka.OFFSET_BEGINNING) for p in parts])
        loaded = 0
        try:
            deadline = time.monotonic() + REBUILD_TIMEOUT_S
            while len(eof) < len(parts):
                if time.monotonic() > deadline:
                    raise KafkaOperationError(
                        f"reading {self.topics.lock} partitions {parts} did not reach the end "
                        f"within {REBUILD_TIMEOUT_S:.0f} s")
                msg = clients.reader.poll(0.1)
                if msg is None:
                    continue
                if msg.error() is not None:
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        eof.add(msg.partition())
                        continue
                    raise KafkaOperationError.wrap(f"reading {self.topics.lock}", msg.error())
                if msg.value() is None:
                    continue
                try:
                    entry = decode_lock_state(msg.key(), msg.value())
                except MalformedRecordError as exc:
                    self._count("malformed")
                    log.warning("%s[%d]@%d skipped: %s", msg.topic(), msg.partition(),
                                msg.offset(), exc)
                    continue
                grace = entry.lease_ms or self.settings.lock_lease_ms
                tables[msg.partition()].restore(entry, _now_ms(), grace)
                loaded += 1
        finally:
            clients.reader.unassign()
        for tp in committed:
            if tp.partition in self._unready:
                self._tables[tp.partition] = tables[tp.partition]
                # Replay exactly from the committed offset (matters after an abort).
                start = TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0
                                       else confluent_kafka.OFFSET_BEGINNING)
                try:
                    clients.consumer.seek(start)
                except KafkaException as exc:  # not fetching yet: it starts there anyway
                    log.debug("seek %s[%d]@%d: %s", tp.topic, tp.partition, start.offset,
                              exc.args[0].str())
                self._unready.discard(tp.partition)
        clients.consumer.resume(request_tps)
        log.info("lock service %s took over partitions %s with %d lock records", self.instance_id,
                 parts, loaded)

    # -- the main loop ---------------------------------------------------------------------
    def _step(self) -> None:
        if self._unready:
            self._rebuild()
        try:
            msgs = self._clients().consumer.consume(MAX_BATCH, POLL_WAIT_S)
        except KafkaException as exc:
            raise KafkaOperationError.wrap("consuming lock requests", exc.args[0]) from exc
        batch = []
        for msg in msgs:
            if msg.error() is not None:
                if msg.error().fatal():
                    raise FatalKafkaError.wrap("consuming lock requests", msg.error())
                log.warning("lock request consumer: %s", msg.error().str())
                continue
            p = msg.partition()
            if p in self._assigned and p not in self._unready:
                batch.append(msg)
        if batch:
            self._process(batch)

    def _lease(self, request: LockRequest) -> int:
        ceiling = self.settings.lock_lease_ms
        return min(request.lease_ms, ceiling) if request.lease_ms > 0 else ceiling

    def _process(self, batch: list) -> None:
        now = _now_ms()
        staged: dict[int, LockTable] = {}
        replies: list[tuple[int, LockReply]] = []
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for msg in batch:
            p = msg.partition()
            first.setdefault(p, msg.offset())
            last[p] = msg.offset()
            table = staged.get(p)
            if table is None:
                table = staged[p] = self._tables.setdefault(p, LockTable()).overlay()
            try:
                request = decode_as(LockRequest, msg.value())
            except MalformedRecordError as exc:
                self._count("malformed")
                log.warning("%s[%d]@%d skipped: %s", msg.topic(), p, msg.offset(), exc)
                continue
            self._count("requests")
            results = tuple(self._decide(table, p, request, now, ref) for ref in request.queues)
            if 0 <= request.reply_partition < self._reply_partitions:
                replies.append((request.reply_partition, LockReply(
                    request.request_id, request.client_id, request.kind, results)))
            else:
                log.warning("%s[%d]@%d: reply partition %d does not exist; not answered",
                            msg.topic(), p, msg.offset(), request.reply_partition)
        offsets = [TopicPartition(self.topics.lock_request, p, off + 1)
                   for p, off in sorted(last.items())]
        if self._write(staged, replies, offsets, first):
            for p, table in staged.items():
                if p in self._tables:
                    self._tables[p].absorb(table)

    def _decide(self, table: LockTable, partition: int, request: LockRequest, now: int,
                ref: Any) -> QueueResult:
        key = ref.key(request.group)
        if key.request_partition(self._request_partitions) != partition:
            self._count("misrouted")
            return QueueResult.refused(ref, "misrouted")
        try:
            if request.kind is RequestKind.LOCK:
                decision = table.lock(key, request.client_id, self._lease(request), now)
            else:
                decision = table.unlock(key, request.client_id, now, ref.epoch)
        except ConfigError as exc:
            self._count("invalid")
            log.warning("lock request %s from %s for %s refused: %s", request.request_id,
                        request.client_id, key, exc)
            return QueueResult.refused(ref, "invalid")
        self._count(decision.reason)
        if decision.reason == "taken_over":
            log.info("%s: lapsed lease taken over by %s with epoch %d", key,
                     request.client_id, decision.epoch)
        return decision.result()

    def _write(self, staged: dict[int, LockTable], replies: list[tuple[int, LockReply]],
               offsets: list[TopicPartition], first: dict[int, int]) -> bool:
        """One transaction: state changes, replies, offsets. False: aborted, replay."""
        producer, consumer = self._clients().producer, self._clients().consumer
        try:
            producer.begin_transaction()
            for p, table in staged.items():
                for entry in table:
                    producer.produce(self.topics.lock, encode(entry), key=entry.key.record_key(),
                                     partition=p)
            for partition, reply in replies:
                producer.produce(self.topics.lock_reply, encode(reply),
                                 key=reply.client_id.encode(), partition=partition)
            producer.send_offsets_to_transaction(
                offsets, consumer.consumer_group_metadata(), TXN_CALL_TIMEOUT_S)
            self._commit(producer)
            return True
        except KafkaException as exc:
            self._abort(exc.args[0], exc, first)
        except BufferError as exc:  # local queue full: treat like an abortable error
            self._abort(KafkaError(KafkaError._QUEUE_FULL), exc, first)
        return False

    def _commit(self, producer: confluent_kafka.Producer) -> None:
        for attempt in retrying(COMMIT_DEADLINE_S):
            with attempt:
                producer.commit_transaction(TXN_CALL_TIMEOUT_S)

    def _abort(self, err: KafkaError, exc: BaseException, first: dict[int, int]) -> None:
        if err.fatal():
            raise FatalKafkaError(f"lock service transaction: {err.str()} (fatal)",
                                        err) from exc
        log.warning("lock service transaction failed (%s); aborting and replaying partitions "
                    "%s from committed offsets", err.str(), sorted(first))
        self._count("aborted")
        clients = self._clients()
        try:
            clients.producer.abort_transaction(TXN_CALL_TIMEOUT_S)
        except KafkaException as abort_exc:
            abort_err: KafkaError = abort_exc.args[0]
            raise FatalKafkaError(f"could not abort the lock transaction: "
                                        f"{abort_err.str()}", abort_err) from abort_exc
        # Replay: rebuild the tables from the lock topic and seek to the committed offsets.
        replay = [TopicPartition(self.topics.lock_request, p) for p in first
                  if p in self._assigned]
        if replay:
            clients.consumer.pause(replay)
            self._unready.update(tp.partition for tp in replay)

    def _count(self, event: str) -> None:
        self.counts[event] += 1
        family = getattr(self.metrics, "lock_events", None)
        if family is not None:
            family.labels(event).inc()

    # -- inspection ------------------------------------------------------------------------
    def owned_partitions(self) -> list[int]:
        """Request partitions this instance owns and serves."""
        return sorted(self._assigned - self._unready)


def main(argv: list[str] | None = None) -> int:
    """``python -m coordinator.lock_service --bootstrap-servers B [settings]``."""
    parser = argparse.ArgumentParser(prog="python -m coordinator.lock_service",
                                     description="Run the queue-lock service alone.")
    parser.add_argument("--bootstrap-servers", required=True, metavar="HOST:PORT")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    add_arguments(parser, CoordinatorSettings)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    interrupts = 0

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal interrupts
        interrupts += 1
        if interrupts > 1 and signum == signal.SIGINT:
            raise SystemExit(130)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        settings = load(CoordinatorSettings, args)
        LockService({"bootstrap.servers": args.bootstrap_servers}, settings).run(stop)
    except RmqError as exc:
        print(f"lock-service: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    # Run the importable module's main(), so log records carry its logger names.
    from coordinator.lock_service import main as module_main

    sys.exit(module_main())
