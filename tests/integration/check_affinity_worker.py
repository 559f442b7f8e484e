"""Producer instance "A" of the check-affinity test, in its own process so it can be
SIGKILLed. ``holds`` on stdin prints ``HOLDS <n>``: how many check partitions it holds now
(what its half records name). Any other line names a batch: it sends that many transactions whose
local transaction answers UNKNOW, values ``<batch>-<i>``, and prints ``SENT <batch>``. Its
back-checks print ``CHECKED <value>`` and answer COMMIT, except for batches named ``doomed``,
whose checks hang (the test kills A before or while they run)."""

from __future__ import annotations

import sys
import threading

from rmq_semantics import LocalTransactionState, Message, TransactionListener, TransactionProducer

_out = threading.Lock()


def say(line: str) -> None:
    """One whole line at a time: check threads print concurrently."""
    with _out:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class Listener(TransactionListener):
    def execute_local_transaction(self, msg, arg):
        return LocalTransactionState.UNKNOW

    def check_local_transaction(self, msg):
        say(f"CHECKED {msg.value.decode()}")
        if msg.value.startswith(b"doomed-"):
            threading.Event().wait()
        return LocalTransactionState.COMMIT_MESSAGE


def main() -> None:
    bootstrap, prefix, group, topic, half_partitions, check_partitions = sys.argv[1:7]
    producer = TransactionProducer(
        {"bootstrap.servers": bootstrap},
        producer_group=group,
        listener=Listener(),
        topic_prefix=prefix,
        half_partitions=int(half_partitions),
        check_partitions=int(check_partitions),
        instance_id="A",
    )
    producer.start()
    say("STARTED")
    for line in sys.stdin:
        if line.strip() == "holds":  # the check partitions it would name now
            say(f"HOLDS {len(producer._checks.held_partitions)}")
            continue
        batch, count = line.split()
        for i in range(int(count)):
            producer.send_message_in_transaction(Message(topic, f"{batch}-{i}".encode()))
        say(f"SENT {batch}")
    producer.shutdown()


if __name__ == "__main__":
    main()
