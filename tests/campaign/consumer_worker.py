"""A campaign consumer process: ``python -m tests.campaign.consumer_worker --config F
--role push|orderly-partition|orderly-key --group G --instance I``.

Subscribes by the pattern of every workload topic (those created mid-run too) through the
public classes (``PushConsumer``, ``OrderlyConsumer`` in partition or key mode) and records
every record its listener processes: class, instance, topic, partition, offset, key,
message id, reconsume count (``consumed`` events, history.py; a push call's events carry its
start, ``start_mono_s``, and are recorded at its end). Push calls that fail add a
``push_retry`` per message. Orderly calls add the lock epoch the batch runs under
(``context.lock_epoch``); each orderly call is a ``batch`` (queue ``group/topic/partition``
as the lock service names it, its start and end, the lease left then by
``OrderlyConsumer.status()``), written once the consumer's ``committed`` or
``commit_skipped`` protocol event tells whether it was committed. The protocol events
(``lock_granted``, ``lock_lost``, ``committed``, ``commit_skipped``, ``dlq``: log records
marked for monitoring) and a status snapshot every second go to the history too.

SIGTERM shuts the consumer down cleanly (exit 0).
"""

from __future__ import annotations

import argparse
import logging
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rmq_semantics import (
    ConsumeConcurrentlyStatus,
    ConsumeOrderlyStatus,
    OrderlyConsumer,
    PushConsumer,
)
from tests.campaign import events as ev
from tests.campaign.config import HEARTBEAT_MS, CampaignConfig
from tests.campaign.history import Recorder
from tests.campaign.workload import orderly_suspends, parse_body, push_fails

ROLES = ("push", "orderly-partition", "orderly-key")
STATUS_EVERY_S = 1.0
# Simulated work per record: up to this many ms, so calls overlap and leases matter.
WORK_MS = 4.0
SHUTDOWN_TIMEOUT_S = 30.0
# Fast retries: the campaign's push retries come back within seconds.
PUSH_DELAY_LEVELS = (1.0, 2.0)
# Pattern subscriptions see a topic created mid-run within this.
METADATA_REFRESH_MS = 2000


def history_path(cfg: CampaignConfig, role: str, instance: int) -> Path:
    return Path(cfg.out_dir) / "history" / f"{role}-{instance}.jsonl"


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class Batches:
    """Orderly batches waiting for the consumer to say whether it committed them (the
    ``committed``/``commit_skipped`` protocol events carry the next offset and the epoch)."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.lock = threading.Lock()
        self.waiting: dict[tuple[str, int], list[dict]] = {}

    def add(self, tp: tuple[str, int], batch: dict, *, settled: bool = False) -> None:
        if settled:  # a suspended batch: redelivered, never committed as it ran
            self.rec.emit(ev.batch(**batch, committed=False))
            return
        with self.lock:
            self.waiting.setdefault(tp, []).append(batch)

    def sent(self, tp: tuple[str, int], offset: int) -> None:
        """The commit of every waiting batch below ``offset`` was sent now (if not before)."""
        at = wall_ms()
        with self.lock:
            for b in self.waiting.get(tp, []):
                if max(b["offsets"], default=-1) < offset:
                    b.setdefault("commit_sent_ms", at)

    def resolve(self, tp: tuple[str, int], offset: int, committed: bool) -> None:
        """Every waiting batch below ``offset`` was committed (or skipped) now."""
        with self.lock:
            waiting = self.waiting.get(tp, [])
            done = [b for b in waiting if max(b["offsets"], default=-1) < offset]
            self.waiting[tp] = [b for b in waiting if b not in done]
        at = wall_ms()
        for b in done:
            self.rec.emit(ev.batch(**b, committed=committed, commit_ms=at if committed else None))

    def flush(self) -> None:
        with self.lock:
            left = [b for batches in self.waiting.values() for b in batches]
            self.waiting.clear()
        for b in left:
            self.rec.emit(ev.batch(**b, committed=False))


class EventHandler(logging.Handler):
    """The orderly consumer's protocol events (log records with ``rmq_event``)."""

    def __init__(self, rec: Recorder, instance: str, group: str, batches: Batches) -> None:
        super().__init__(logging.DEBUG)
        self.rec, self.instance, self.group, self.batches = rec, instance, group, batches

    def emit(self, record: logging.LogRecord) -> None:
        name = getattr(record, "rmq_event", None)
        if name is None:
            return
        fields = dict(getattr(record, "rmq_fields", {}))
        self.rec.emit(ev.orderly_event(name, self.instance, self.group, **fields))
        tp = (fields.get("topic"), fields.get("partition"))
        if name == "commit_sent" and fields.get("offset") is not None:
            self.batches.sent(tp, int(fields["offset"]))
        elif name in ("committed", "commit_skipped") and fields.get("offset") is not None:
            self.batches.resolve(tp, int(fields["offset"]), name == "committed")
        elif name == "dlq":
            where = f"{tp[0]}[{tp[1]}]@{fields.get('offset')}"
            self.rec.emit(
                ev.dlq(
                    "orderly",
                    self.group,
                    where,
                    topic=tp[0],
                    partition=tp[1],
                    offset=fields.get("offset"),
                    reason="orderly dlq event",
                )
            )


def record_of(msg: Any) -> dict:
    body = parse_body(msg.value)
    key = msg.key.decode(errors="replace") if isinstance(msg.key, bytes) else msg.key
    where = f"{msg.topic}[{msg.partition}]@{msg.offset}"
    return {
        "topic": msg.topic,
        "partition": msg.partition,
        "offset": msg.offset,
        "key": key,
        "msg_id": body.get("mid") or f"<no msg id at {where}>",
    }


class ConsumerWorker:
    def __init__(self, cfg: CampaignConfig, role: str, group: str, instance: int) -> None:
        self.cfg, self.role, self.group, self.instance = cfg, role, group, instance
        self.name = f"{role}-{instance}"
        self.rec = Recorder(history_path(cfg, role, instance), self.name)
        self.stop = threading.Event()
        self.rng = random.Random(f"{cfg.seed}/{self.name}")
        self.rng_lock = threading.Lock()
        self.consumer: Any = None
        self.cls = "push" if role == "push" else "orderly"
        # The instance's name at the lock service too (a restart keeps it).
        self.client_id = f"{group}-{self.name}"
        self.batches = Batches(self.rec)

    def conf(self) -> dict:
        return {
            "bootstrap.servers": self.cfg.bootstrap,
            "group.id": self.group,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": self.cfg.session_timeout_ms,
            "heartbeat.interval.ms": HEARTBEAT_MS,
            "topic.metadata.refresh.interval.ms": METADATA_REFRESH_MS,
        }

    def work(self) -> None:
        with self.rng_lock:
            pause = self.rng.uniform(0, WORK_MS) / 1000
        time.sleep(pause)

    # -- push ----------------------------------------------------------------------------
    def push_listener(self, msgs: list, context: Any) -> ConsumeConcurrentlyStatus:
        started = time.monotonic()  # the call's start; its events' own times are its end
        status = ConsumeConcurrentlyStatus.CONSUME_SUCCESS
        for msg in msgs:
            fields = record_of(msg)
            self.work()
            fail = push_fails(fields["msg_id"], msg.reconsume_times)
            draft = ev.consumed(
                "push",
                self.group,
                self.client_id,
                **fields,
                result="RECONSUME_LATER" if fail else "SUCCESS",
            )
            self.rec.record(
                draft.kind,
                **draft.fields,
                reconsume_times=msg.reconsume_times,
                retry_topic=getattr(msg, "retry_topic", None),
                start_mono_s=started,
            )
            if fail:
                status = ConsumeConcurrentlyStatus.RECONSUME_LATER
        if status is ConsumeConcurrentlyStatus.RECONSUME_LATER:  # the whole batch comes back
            for msg in msgs:
                fields = record_of(msg)
                self.rec.emit(
                    ev.push_retry(
                        self.group,
                        fields["msg_id"],
                        topic=msg.topic,
                        partition=msg.partition,
                        offset=msg.offset,
                        reconsume_times=msg.reconsume_times,
                        retry_topic=getattr(msg, "retry_topic", None),
                    )
                )
        return status

    def make_push(self) -> PushConsumer:
        return PushConsumer(
            self.conf(),
            listener=self.push_listener,
            max_workers=4,
            max_reconsume_times=self.cfg.push_max_reconsume,
            delay_levels=PUSH_DELAY_LEVELS,
            topic_prefix=self.cfg.topic_prefix,
            client_id=self.client_id,
        )

    # -- orderly -------------------------------------------------------------------------
    def lease_left(self, topic: str, partition: int) -> int | None:
        try:
            status = self.consumer.status().get((topic, partition))
        except Exception:  # a status read racing a rebalance: the record goes without it
            return None
        return None if status is None else status.lease_remaining_ms

    def orderly_listener(self, msgs: list, context: Any) -> ConsumeOrderlyStatus:
        start = wall_ms()
        lease = self.lease_left(context.topic, context.partition)
        suspend = False
        for msg in msgs:
            fields = record_of(msg)
            self.work()
            suspend = suspend or orderly_suspends(fields["msg_id"], msg.reconsume_times)
            draft = ev.consumed(
                "orderly",
                self.group,
                self.client_id,
                **fields,
                result="SUSPEND" if suspend else "SUCCESS",
            )
            self.rec.record(
                draft.kind,
                **draft.fields,
                epoch=context.lock_epoch,
                reconsume_times=msg.reconsume_times,
            )
        tp = (context.topic, context.partition)
        self.batches.add(
            tp,
            {
                "queue": f"{self.group}/{context.topic}/{context.partition}",
                "instance": self.client_id,
                "epoch": context.lock_epoch,
                "lease_granted_ms": None,
                "lease_valid_until_ms": start + (lease or 0),
                "start_ms": start,
                "end_ms": wall_ms(),
                "offsets": [m.offset for m in msgs],
            },
            settled=suspend,
        )
        if suspend:
            context.suspend_ms = 200
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return ConsumeOrderlyStatus.SUCCESS

    def make_orderly(self) -> OrderlyConsumer:
        ordering = "key" if self.role == "orderly-key" else "partition"
        handler = EventHandler(self.rec, self.client_id, self.group, self.batches)
        orderly_log = logging.getLogger("rmq_semantics.orderly")
        orderly_log.setLevel(logging.DEBUG)
        orderly_log.addHandler(handler)
        return OrderlyConsumer(
            self.conf(),
            listener=self.orderly_listener,
            lock_lease_ms=self.cfg.consumer_lease_ms,
            lock_renew_ms=self.cfg.consumer_renew_ms,
            topic_prefix=self.cfg.topic_prefix,
            ordering=ordering,
            max_workers=4 if ordering == "key" else None,
            client_id=self.client_id,
        )

    def snapshot(self) -> None:
        """The consumer's public status, every second, until stopped."""
        while not self.stop.wait(STATUS_EVERY_S):
            try:
                if isinstance(self.consumer, OrderlyConsumer):
                    queues = [
                        {
                            "topic": s.topic,
                            "partition": s.partition,
                            "lock": s.lock_state,
                            "epoch": s.epoch,
                            "lease_ms": s.lease_remaining_ms,
                            "committed": s.committed_offset,
                            "lag": s.lag,
                        }
                        for s in self.consumer.status().values()
                    ]
                    self.rec.emit(ev.status(self.client_id, queues=queues))
                else:
                    self.rec.emit(ev.status(self.client_id, counts=self.consumer.counts))
            except Exception as exc:  # a snapshot is diagnostic: never stop the process
                self.rec.emit(ev.note("status failed", error=repr(exc)[:200]))

    def run(self) -> int:
        self.consumer = self.make_push() if self.role == "push" else self.make_orderly()
        self.consumer.subscribe([self.cfg.topic_pattern])
        self.consumer.start()
        self.rec.emit(
            ev.subscribe(
                self.cls,
                self.group,
                self.client_id,
                [],
                mode=None if self.role == "push" else self.role.removeprefix("orderly-"),
                pattern=self.cfg.topic_pattern,
            )
        )
        self.rec.emit(ev.worker("ready", role=self.role, group=self.group))
        watcher = threading.Thread(target=self.snapshot, daemon=True)
        watcher.start()
        try:
            while not self.stop.wait(0.2):
                pass
        finally:
            self.consumer.shutdown(SHUTDOWN_TIMEOUT_S)
            self.batches.flush()
            self.rec.emit(ev.worker("stopped"))
            self.rec.close()
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--role", choices=ROLES, required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--instance", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for handler in logging.getLogger().handlers:  # the orderly logger's DEBUG events stay
        handler.setLevel(logging.WARNING)  # in the history, off stderr
    worker = ConsumerWorker(CampaignConfig.read(args.config), args.role, args.group, args.instance)
    worker.rec.emit(ev.worker("start", role=args.role, group=args.group))
    signal.signal(signal.SIGTERM, lambda *_: worker.stop.set())
    return worker.run()


if __name__ == "__main__":
    sys.exit(main())
