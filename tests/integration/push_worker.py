"""A PushConsumer in its own process, for the SIGKILL test (``python -m`` this module).

Each delivery appends one JSON line ``{"n", "reconsume", "outcome"}`` to ``--result``
before the listener returns (the policy of push_helpers.outcome, 1 ms of work each).
``--hang-on N``: the call of message N writes its line (outcome ``HANG``) and never returns,
as a listener stuck when its process dies.
SIGTERM shuts the consumer down cleanly and exits 0.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time

from rmq_semantics.push import ConsumeConcurrentlyStatus, PushConsumer
from tests.group_protocol import group_conf
from tests.integration.push_helpers import LEVELS, MAX_RECONSUME, outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    for flag in ("--bootstrap-servers", "--topic-prefix", "--group", "--topic", "--result"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--hang-on", type=int)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s worker %(levelname)s %(name)s: %(message)s",
    )
    out = open(args.result, "a", buffering=1)  # noqa: SIM115 (lives as long as the process)
    lock = threading.Lock()

    def listener(msgs, context):
        m = msgs[0]
        n = int(m.value)
        if n == args.hang_on:
            with lock:
                hang = {"n": n, "reconsume": m.reconsume_times, "outcome": "HANG"}
                out.write(json.dumps(hang) + "\n")
            threading.Event().wait()
        time.sleep(0.001)  # simulated work
        try:
            result = outcome(n, m.reconsume_times)
        except ValueError:
            result = None
        line = json.dumps(
            {"n": n, "reconsume": m.reconsume_times, "outcome": result.name if result else "RAISED"}
        )
        with lock:
            out.write(line + "\n")
            out.flush()
        if result is None:
            raise ValueError(f"message {n} always fails")
        return result

    conf = group_conf(
        {
            "bootstrap.servers": args.bootstrap_servers,
            "group.id": args.group,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
        }
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    consumer = PushConsumer(
        conf,
        listener=listener,
        max_workers=4,
        max_reconsume_times=MAX_RECONSUME,
        delay_levels=LEVELS,
        topic_prefix=args.topic_prefix,
    )
    consumer.subscribe([args.topic])
    consumer.start()
    try:
        while not stop.wait(0.2):
            pass
    finally:
        consumer.shutdown()
    return 0


if __name__ == "__main__":
    assert ConsumeConcurrentlyStatus  # the statuses the policy returns
    sys.exit(main())
