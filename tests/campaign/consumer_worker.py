"""A campaign consumer process: ``python -m tests.campaign.consumer_worker --config F
--role push|orderly-partition|orderly-key --group G --instance I``.

Subscribes by the pattern of every workload topic (those created mid-run too) through the
public classes (``PushConsumer``, ``OrderlyConsumer`` in partition or key mode) and records
every record its listener processes: class, instance, topic, partition, offset, key,
message id, reconsume count, and the start and end of the call (``mono``: the host's
monotonic clock, comparable across processes). Orderly calls add the queue, the lock epoch
the batch runs under (``context.lock_epoch``) and the lease left then
(``OrderlyConsumer.status()``); the orderly consumer's protocol events (``lock_granted``,
``lock_lost``, ``committed``, ``commit_skipped``, ``dlq``: log records marked for
monitoring) and a status snapshot every second go to the history too.

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
from tests.campaign._stubs import Recorder
from tests.campaign.config import HEARTBEAT_MS, CampaignConfig
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


class EventHandler(logging.Handler):
    """The orderly consumer's protocol events (log records with ``rmq_event``)."""

    def __init__(self, rec: Recorder, fields: dict) -> None:
        super().__init__(logging.DEBUG)
        self.rec, self.fields = rec, fields

    def emit(self, record: logging.LogRecord) -> None:
        name = getattr(record, "rmq_event", None)
        if name is not None:
            self.rec.record("orderly_event", event=name, **self.fields,
                            **getattr(record, "rmq_fields", {}))


def record_of(msg: Any) -> dict:
    body = parse_body(msg.value)
    key = msg.key.decode(errors="replace") if isinstance(msg.key, bytes) else msg.key
    return {"topic": msg.topic, "partition": msg.partition, "offset": msg.offset, "key": key,
            "mid": body.get("mid"), "reconsume": msg.reconsume_times}


class ConsumerWorker:
    def __init__(self, cfg: CampaignConfig, role: str, group: str, instance: int) -> None:
        self.cfg, self.role, self.group, self.instance = cfg, role, group, instance
        self.name = f"{role}-{instance}"
        self.rec = Recorder(history_path(cfg, role, instance), self.name)
        self.stop = threading.Event()
        self.rng = random.Random(f"{cfg.seed}/{self.name}")
        self.rng_lock = threading.Lock()
        self.consumer: Any = None
        self.cls = "PushConsumer" if role == "push" else "OrderlyConsumer"

    def conf(self) -> dict:
        return {"bootstrap.servers": self.cfg.bootstrap, "group.id": self.group,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": self.cfg.session_timeout_ms,
                "heartbeat.interval.ms": HEARTBEAT_MS,
                "topic.metadata.refresh.interval.ms": METADATA_REFRESH_MS}

    def work(self) -> None:
        with self.rng_lock:
            pause = self.rng.uniform(0, WORK_MS) / 1000
        time.sleep(pause)

    # -- push ----------------------------------------------------------------------------
    def push_listener(self, msgs: list, context: Any) -> ConsumeConcurrentlyStatus:
        status = ConsumeConcurrentlyStatus.CONSUME_SUCCESS
        for msg in msgs:
            start = time.monotonic()
            fields = record_of(msg)
            self.work()
            fail = bool(fields["mid"]) and push_fails(fields["mid"], msg.reconsume_times)
            self.rec.record("process", cls=self.cls, role=self.role, group=self.group,
                            instance=self.name, start=start,
                            retry_topic=getattr(msg, "retry_topic", None),
                            outcome="retry" if fail else "ok", **fields)
            if fail:
                status = ConsumeConcurrentlyStatus.RECONSUME_LATER
        return status

    def make_push(self) -> PushConsumer:
        return PushConsumer(self.conf(), listener=self.push_listener, max_workers=4,
                            max_reconsume_times=self.cfg.push_max_reconsume,
                            delay_levels=PUSH_DELAY_LEVELS, topic_prefix=self.cfg.topic_prefix,
                            client_id=f"{self.group}-{self.name}")

    # -- orderly -------------------------------------------------------------------------
    def lease_left(self, topic: str, partition: int) -> int | None:
        try:
            status = self.consumer.status().get((topic, partition))
        except Exception:  # a status read racing a rebalance: the record goes without it
            return None
        return None if status is None else status.lease_remaining_ms

    def orderly_listener(self, msgs: list, context: Any) -> ConsumeOrderlyStatus:
        start = time.monotonic()
        lease = self.lease_left(context.topic, context.partition)
        suspend = False
        for msg in msgs:
            fields = record_of(msg)
            self.work()
            suspend = suspend or (bool(fields["mid"])
                                  and orderly_suspends(fields["mid"], msg.reconsume_times))
            self.rec.record("process", cls=self.cls, role=self.role, group=self.group,
                            instance=self.name, start=start, epoch=context.lock_epoch,
                            queue=f"{context.topic}[{context.partition}]", lease_ms=lease,
                            batch=len(msgs), outcome="suspend" if suspend else "ok",
                            **fields)
        if suspend:
            context.suspend_ms = 200
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return ConsumeOrderlyStatus.SUCCESS

    def make_orderly(self) -> OrderlyConsumer:
        ordering = "key" if self.role == "orderly-key" else "partition"
        handler = EventHandler(self.rec, {"instance": self.name, "group": self.group})
        orderly_log = logging.getLogger("rmq_semantics.orderly")
        orderly_log.setLevel(logging.DEBUG)
        orderly_log.addHandler(handler)
        return OrderlyConsumer(self.conf(), listener=self.orderly_listener,
                               lock_lease_ms=self.cfg.consumer_lease_ms,
                               lock_renew_ms=self.cfg.consumer_renew_ms,
                               topic_prefix=self.cfg.topic_prefix, ordering=ordering,
                               max_workers=4 if ordering == "key" else None,
                               client_id=f"{self.group}-{self.name}")

    def snapshot(self) -> None:
        """The consumer's public status, every second, until stopped."""
        while not self.stop.wait(STATUS_EVERY_S):
            try:
                if isinstance(self.consumer, OrderlyConsumer):
                    queues = [{"topic": s.topic, "partition": s.partition,
                               "lock": s.lock_state, "epoch": s.epoch,
                               "lease_ms": s.lease_remaining_ms,
                               "committed": s.committed_offset, "lag": s.lag}
                              for s in self.consumer.status().values()]
                    self.rec.record("status", instance=self.name, queues=queues)
                else:
                    self.rec.record("status", instance=self.name, counts=self.consumer.counts)
            except Exception as exc:  # a snapshot is diagnostic: never stop the process
                self.rec.record("status_error", error=repr(exc)[:200])

    def run(self) -> int:
        self.consumer = self.make_push() if self.role == "push" else self.make_orderly()
        self.consumer.subscribe([self.cfg.topic_pattern])
        self.consumer.start()
        self.rec.record("ready", cls=self.cls, role=self.role, group=self.group,
                        subscription=[self.cfg.topic_pattern])
        watcher = threading.Thread(target=self.snapshot, daemon=True)
        watcher.start()
        try:
            while not self.stop.wait(0.2):
                pass
        finally:
            self.consumer.shutdown(SHUTDOWN_TIMEOUT_S)
            self.rec.record("stopped")
            self.rec.close()
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--role", choices=ROLES, required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--instance", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:  # the orderly logger's DEBUG events stay
        handler.setLevel(logging.WARNING)         # in the history, off stderr
    worker = ConsumerWorker(CampaignConfig.read(args.config), args.role, args.group,
                            args.instance)
    worker.rec.record("start", role=args.role, group=args.group)
    signal.signal(signal.SIGTERM, lambda *_: worker.stop.set())
    return worker.run()


if __name__ == "__main__":
    sys.exit(main())
