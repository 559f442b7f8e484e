"""The victim of the bench's takeover case, run as its own process:
``python -m benchmarks.orderly_child BOOTSTRAP PREFIX GROUP TOPIC LEASE_MS
RENEW_MS SESSION_MS``.

An orderly consumer that subscribes, prints ``LOCKED`` once it holds a queue lock, and then
only holds it until the bench kills it with SIGKILL.
"""

from __future__ import annotations

import sys
import time

from benchmarks.common import CASE_TIMEOUT_S
from benchmarks.orderly import ORDERLY_BATCH
from rmq_semantics.orderly import ConsumeOrderlyStatus, OrderlyConsumer

# How often the status is read while waiting for the first lock.
LOCK_POLL_S = 0.05


def _listener(msgs: list, context: object) -> ConsumeOrderlyStatus:
    return ConsumeOrderlyStatus.SUCCESS


def main(argv: list[str]) -> int:
    bootstrap, prefix, group, topic, lease_ms, renew_ms, session_ms = argv[:7]
    consumer = OrderlyConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "session.timeout.ms": int(session_ms),
            "auto.offset.reset": "earliest",
        },
        listener=_listener,
        topic_prefix=prefix,
        lock_lease_ms=int(lease_ms),
        lock_renew_ms=int(renew_ms),
        batch_size=ORDERLY_BATCH,
    )
    consumer.subscribe([topic])
    consumer.start()
    try:
        deadline = time.monotonic() + CASE_TIMEOUT_S
        while not any(status.locked for status in consumer.status().values()):
            if time.monotonic() > deadline:
                return 1  # the bench sees no LOCKED line and reports it
            time.sleep(LOCK_POLL_S)
        print("LOCKED", flush=True)
        # Held until the bench kills this process; bounded so an orphan does not linger.
        time.sleep(CASE_TIMEOUT_S)
        return 0
    finally:
        consumer.shutdown()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
