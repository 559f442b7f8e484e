"""A SimpleConsumer in its own process, for kill tests (``python -m`` this module).

It receives one message with ``--invisible-s``, writes ``{"message_id", "attempt"}`` as one
JSON line to ``--result``, and then holds it without an ack until it is killed (or for
``--hold-s``, then exits 1).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from rmq_semantics.simple.consumer import SimpleConsumer
from tests.group_protocol import group_conf


def main() -> int:
    parser = argparse.ArgumentParser()
    for name in ("--bootstrap", "--group", "--topic", "--prefix", "--result"):
        parser.add_argument(name, required=True)
    parser.add_argument("--invisible-s", type=float, default=2.0)
    parser.add_argument("--session-timeout-ms", default="6000")
    parser.add_argument("--hold-s", type=float, default=120.0)
    args = parser.parse_args()
    conf = group_conf(
        {
            "bootstrap.servers": args.bootstrap,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": args.session_timeout_ms,
        }
    )
    consumer = SimpleConsumer(
        conf, args.group, {args.topic: None}, topic_prefix=args.prefix, await_duration=5
    )
    consumer.startup()
    deadline = time.monotonic() + 60
    got = []
    while not got and time.monotonic() < deadline:
        got = consumer.receive(1, args.invisible_s)
    if not got:
        return 2
    with open(args.result, "a") as out:
        out.write(json.dumps({"message_id": got[0].message_id, "attempt": got[0].delivery_attempt}))
        out.write("\n")
    time.sleep(args.hold_s)  # holding the message, no ack, no close: the test kills us
    return 1


if __name__ == "__main__":
    sys.exit(main())
