"""An orderly consumer in its own process, for kill/pause tests (``python -m`` this module).

Every line it appends to ``--result`` is one JSON object:

- ``{"kind": "ready"}`` once started;
- ``{"kind": "start"|"end", "partition", "offset", "value", "epoch", "reconsume"}`` around
  each message handed to the listener; a value starting with ``--slow-prefix`` makes the
  listener work for ``--slow-s`` seconds between the two (the window a test kills or
  pauses the process in);
- ``{"kind": "event", "event": ..., fields}`` for the consumer's protocol events
  (``lock_granted``, ``lock_lost``, ``committed``, ``commit_skipped``, ``dlq``), taken from
  its log records.

SIGTERM shuts the consumer down cleanly and exits 0. ``--ordering key`` runs key mode with
``--max-workers`` threads; ``--work-ms`` makes each call work a random 0..N ms.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import signal
import sys
import threading
import time

from rmq_semantics.orderly import ConsumeOrderlyStatus, OrderlyConsumer
from tests.group_protocol import group_conf


class ResultFile:
    def __init__(self, path: str, client_id: str) -> None:
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 (lives as long as the process)
        self._lock = threading.Lock()
        self.client_id = client_id

    def write(self, kind: str, **fields: object) -> None:
        line = json.dumps({"kind": kind, "client": self.client_id, "t": time.time(), **fields})
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()


class EventHandler(logging.Handler):
    """Writes the orderly consumer's protocol events (log records with ``rmq_event``)."""

    def __init__(self, result: ResultFile) -> None:
        super().__init__(logging.DEBUG)
        self.result = result

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, "rmq_event", None)
        if event is not None:
            self.result.write("event", event=event, **getattr(record, "rmq_fields", {}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--topic-prefix", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--result", required=True)
    parser.add_argument("--client-id", required=True)
    parser.add_argument("--lock-lease-ms", type=int, default=3000)
    parser.add_argument("--lock-renew-ms", type=int, default=1000)
    parser.add_argument("--session-timeout-ms", type=int, default=6000)
    parser.add_argument("--slow-prefix", default="slow")
    parser.add_argument("--slow-s", type=float, default=3.0)
    parser.add_argument("--ordering", default="partition")
    parser.add_argument("--max-workers", type=int, default=None)
    parser.add_argument("--work-ms", type=float, default=0.0)
    args = parser.parse_args(argv)

    result = ResultFile(args.result, args.client_id)
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s worker %(levelname)s %(name)s: %(message)s",
    )
    orderly_log = logging.getLogger("rmq_semantics.orderly")
    orderly_log.setLevel(logging.DEBUG)
    orderly_log.addHandler(EventHandler(result))

    slow = args.slow_prefix.encode()

    def listener(msgs, context):
        for m in msgs:
            fields = {
                "partition": m.partition,
                "offset": m.offset,
                "value": (m.value or b"").decode(),
                "epoch": context.lock_epoch,
                "reconsume": m.reconsume_times,
            }
            result.write("start", **fields)
            if (m.value or b"").startswith(slow):
                time.sleep(args.slow_s)  # simulated work: the window a test acts in
            elif args.work_ms:
                time.sleep(random.uniform(0, args.work_ms) / 1000)  # simulated work
            result.write("end", **fields)
        return ConsumeOrderlyStatus.SUCCESS

    conf = group_conf(
        {
            "bootstrap.servers": args.bootstrap_servers,
            "group.id": args.group,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": args.session_timeout_ms,
            "heartbeat.interval.ms": 500,
        }
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    consumer = OrderlyConsumer(
        conf,
        listener=listener,
        lock_lease_ms=args.lock_lease_ms,
        lock_renew_ms=args.lock_renew_ms,
        topic_prefix=args.topic_prefix,
        client_id=args.client_id,
        ordering=args.ordering,
        max_workers=args.max_workers,
    )
    consumer.subscribe([args.topic])
    consumer.start()
    result.write("ready")
    try:
        while not stop.wait(0.2):
            pass
    finally:
        consumer.shutdown()
        result.write("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
