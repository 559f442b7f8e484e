"""A SimpleConsumer in its own process, for kill tests (``python -m`` this module).

By default it receives one message with ``--invisible-s``, writes ``{"message_id",
"attempt"}`` as one JSON line to ``--result``, and then holds it without an ack until it is
killed (or for ``--hold-s``, then exits 1).

With ``--work`` it receives batches and acks each message until SIGTERM (then closes and
exits 0), logging one JSON line per event to ``--result``: ``parts`` (its assigned
partitions, when they change), ``batch`` (a receive's count, before its messages), ``recv``
and ``ack`` (``id``, ``body``, ``attempt``), ``refused``
(an ack the consumer refused). With ``--hold-after N``, once it has acked N messages, it acks
the first half of the next batch of two or more, writes ``holding`` and holds the rest
without an ack until it is killed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time

from rmq_semantics import ReceiptError
from rmq_semantics.simple.consumer import MessageView, SimpleConsumer
from tests.group_protocol import group_conf


class EventLog:
    """JSON lines appended with one write each, so a SIGKILL never leaves half a line."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, event: str, message: MessageView | None = None, **fields: object) -> None:
        line: dict[str, object] = {"e": event, "t": time.time_ns(), **fields}
        if message is not None:
            line |= {
                "id": message.message_id,
                "body": (message.body or b"").decode(),
                "attempt": message.delivery_attempt,
            }
        os.write(self.fd, (json.dumps(line) + "\n").encode())


def hold_one(consumer: SimpleConsumer, args: argparse.Namespace) -> int:
    deadline = time.monotonic() + 60
    got: list[MessageView] = []
    while not got and time.monotonic() < deadline:
        got = consumer.receive(1, args.invisible_s)
    if not got:
        return 2
    with open(args.result, "a") as out:
        out.write(json.dumps({"message_id": got[0].message_id, "attempt": got[0].delivery_attempt}))
        out.write("\n")
    time.sleep(args.hold_s)  # holding the message, no ack, no close: the test kills us
    return 1


def work(consumer: SimpleConsumer, args: argparse.Namespace) -> int:
    log = EventLog(args.result)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    parts: list[str] = []
    acked = 0
    try:
        while not stop.is_set():
            batch = consumer.receive(args.batch, args.invisible_s)
            now_parts = sorted(consumer.status())
            if now_parts != parts:
                parts = now_parts
                log.write("parts", parts=parts)
            hold = args.hold_after is not None and acked >= args.hold_after and len(batch) >= 2
            if batch:
                log.write("batch", n=len(batch))
            for message in batch:
                log.write("recv", message)
            for message in batch[: len(batch) // 2] if hold else batch:
                try:
                    consumer.ack(message)
                except ReceiptError as exc:  # its invisible duration passed: it comes again
                    log.write("refused", message, why=str(exc))
                    continue
                log.write("ack", message)
                acked += 1
            if hold:
                log.write("holding")
                time.sleep(args.hold_s)  # no ack, no close: the test kills us
                return 1
    finally:
        if stop.is_set():
            consumer.close()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    for name in ("--bootstrap", "--group", "--topic", "--prefix", "--result"):
        parser.add_argument(name, required=True)
    parser.add_argument("--invisible-s", type=float, default=2.0)
    parser.add_argument("--session-timeout-ms", default="6000", help="'' for the default")
    parser.add_argument("--hold-s", type=float, default=120.0)
    parser.add_argument("--work", action="store_true")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--hold-after", type=int, default=None)
    parser.add_argument("--commit-interval-ms", type=int, default=100)
    args = parser.parse_args()
    conf = {"bootstrap.servers": args.bootstrap, "auto.offset.reset": "earliest"}
    if args.session_timeout_ms:
        conf["session.timeout.ms"] = args.session_timeout_ms
    conf = group_conf(conf)
    consumer = SimpleConsumer(
        conf,
        args.group,
        {args.topic: None},
        topic_prefix=args.prefix,
        await_duration=0.5 if args.work else 5,
        commit_interval_ms=args.commit_interval_ms,
    )
    consumer.startup()
    return work(consumer, args) if args.work else hold_one(consumer, args)


if __name__ == "__main__":
    sys.exit(main())
