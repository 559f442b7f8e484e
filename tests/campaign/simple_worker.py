"""A campaign SimpleConsumer process (issue 36): ``python -m tests.campaign.simple_worker
--config F --group G --instance I``.

One ``SimpleConsumer`` of group G on the run's first topics (the subscription takes names,
so the topics producers create mid-run are not its), driven by one thread: ``receive``, then
per message what ``workload.simple_fate`` says (ack; leave the first delivery unacked; never
ack: a poison message, dead-lettered after ``max_delivery_attempts``; change the invisible
duration, then ack), each call written to the history as a ``simple`` event once it returned
(received with the ``delivery_attempt`` and the message group, ack_ok, ack_refused, changed,
change_refused). One thread, so an instance's events are in the order of its calls. Its
public ``counts`` go to the history every second (``status``), and each time its group
session timed out (librdkafka's SESSTMOUT line) a ``note`` "session lost".

SIGTERM shuts the consumer down cleanly (exit 0); the nemesis SIGKILLs it like the others.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from confluent_kafka import KafkaException

from rmq_semantics import MessageView, ReceiptError, RmqError, SimpleConsumer
from tests.campaign import events as ev
from tests.campaign.config import HEARTBEAT_MS, CampaignConfig
from tests.campaign.history import Recorder
from tests.campaign.simple_checks import SESSION_LOST
from tests.campaign.workload import (
    SIMPLE_CHANGE,
    SIMPLE_ONCE,
    SIMPLE_POISON,
    parse_body,
    simple_fate,
)

ROLE = "simple"
BATCH = 16
AWAIT_S = 1.0  # receive's long poll: the stop flag is looked at this often
COMMIT_INTERVAL_MS = 100  # the SimpleConsumer's default, written down for the checker
STATUS_EVERY_S = 1.0


def history_path(cfg: CampaignConfig, instance: int) -> Path:
    return Path(cfg.out_dir) / "history" / f"{ROLE}-{instance}.jsonl"


class SessionLost(logging.Handler):
    """librdkafka's SESSTMOUT line (the group session timed out: the partitions go without
    a commit) as a ``note`` event ``session lost`` of this instance."""

    def __init__(self, rec: Recorder) -> None:
        super().__init__(logging.WARNING)
        self.rec = rec

    def emit(self, record: logging.LogRecord) -> None:
        if "SESSTMOUT" in record.getMessage():
            self.rec.emit(ev.note(SESSION_LOST))


class SimpleWorker:
    def __init__(self, cfg: CampaignConfig, group: str, instance: int) -> None:
        self.cfg, self.group = cfg, group
        self.name = f"{ROLE}-{instance}"  # the nemesis's target name too
        self.rec = Recorder(history_path(cfg, instance), self.name)
        self.stop = threading.Event()
        self.consumer: SimpleConsumer | None = None

    def settings(self) -> dict:
        return {
            "max_attempts": self.cfg.simple_max_attempts,
            "invisible_ms": int(self.cfg.simple_invisible_s * 1000),
            "commit_interval_ms": COMMIT_INTERVAL_MS,
        }

    def emit(self, event: str, msg: MessageView, mid: str, attempt: int | None = None) -> None:
        self.rec.emit(
            ev.simple(
                event,
                self.group,
                self.name,
                msg.topic,
                msg.partition,
                msg.offset,
                mid,
                message_group=msg.message_group,
                attempt=attempt,
            )
        )

    def handle(self, consumer: SimpleConsumer, msg: MessageView) -> None:
        where = f"{msg.topic}[{msg.partition}]@{msg.offset}"
        mid = parse_body(msg.body).get("mid") or f"<no msg id at {where}>"
        self.emit("received", msg, mid, msg.delivery_attempt)
        fate = simple_fate(mid, msg.delivery_attempt)
        if fate in (SIMPLE_POISON, SIMPLE_ONCE):
            return  # left invisible: it comes back (or goes to the DLQ)
        if fate == SIMPLE_CHANGE:
            try:
                msg = consumer.change_invisible_duration(msg, self.cfg.simple_invisible_s * 2)
                self.emit("changed", msg, mid)
            except RmqError:  # refused, or its commit failed: it comes back
                self.emit("change_refused", msg, mid)
                return
        try:
            consumer.ack(msg)
        except ReceiptError:
            self.emit("ack_refused", msg, mid)
            return
        self.emit("ack_ok", msg, mid)

    def snapshot(self) -> None:
        while not self.stop.wait(STATUS_EVERY_S):
            consumer = self.consumer
            if consumer is not None:
                self.rec.emit(ev.status(self.name, counts=dict(consumer.counts)))

    def run(self) -> int:
        topics = list(self.cfg.topics)
        consumer = self.consumer = SimpleConsumer(
            {
                "bootstrap.servers": self.cfg.bootstrap,
                "session.timeout.ms": self.cfg.session_timeout_ms,
                "heartbeat.interval.ms": HEARTBEAT_MS,
                "auto.offset.reset": "earliest",
            },
            self.group,
            {t: None for t in topics},
            topic_prefix=self.cfg.topic_prefix,
            client_id=self.name,
            await_duration=AWAIT_S,
            max_delivery_attempts=self.cfg.simple_max_attempts,
            commit_interval_ms=COMMIT_INTERVAL_MS,
        )
        logging.getLogger("rmq_semantics.librdkafka").addHandler(SessionLost(self.rec))
        consumer.startup()
        self.rec.emit(ev.subscribe(ROLE, self.group, self.name, topics, settings=self.settings()))
        self.rec.emit(ev.worker("ready", role=ROLE, group=self.group))
        threading.Thread(target=self.snapshot, daemon=True).start()
        try:
            while not self.stop.is_set():
                try:
                    batch = consumer.receive(BATCH, self.cfg.simple_invisible_s)
                except (RmqError, KafkaException) as exc:  # a fault: noted, receive again
                    self.rec.emit(ev.note("receive failed", error=repr(exc)[:300]))
                    self.stop.wait(AWAIT_S)
                    continue
                for msg in batch:
                    self.handle(consumer, msg)
        finally:
            consumer.shutdown()
            self.rec.emit(ev.worker("stopped"))
            self.rec.close()
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--instance", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    worker = SimpleWorker(CampaignConfig.read(args.config), args.group, args.instance)
    worker.rec.emit(ev.worker("start", role=ROLE, group=args.group))
    signal.signal(signal.SIGTERM, lambda *_: worker.stop.set())
    return worker.run()


if __name__ == "__main__":
    sys.exit(main())
