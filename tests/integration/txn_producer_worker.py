"""A producer process for crash tests: writes one transactional message, records the local
transaction in a file 'database', prints HALF_WRITTEN and then blocks so the test can
SIGKILL it before its end request is sent."""

from __future__ import annotations

import sys
from pathlib import Path

from rmq_semantics import LocalTransactionState, Message, TransactionListener, TransactionProducer


class BlockingListener(TransactionListener):
    def __init__(self, db: Path, commit: bool) -> None:
        self.db = db
        self.commit = commit

    def execute_local_transaction(self, msg, arg):
        if self.commit:
            (self.db / msg.transaction_id).write_text("committed")
        print(f"HALF_WRITTEN {msg.transaction_id}", flush=True)
        sys.stdin.readline()  # the test kills us here
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg):
        return LocalTransactionState.UNKNOW


def main() -> None:
    bootstrap, prefix, group, topic, db, commit, value = sys.argv[1:8]
    listener = BlockingListener(Path(db), commit == "commit")
    producer = TransactionProducer(
        {"bootstrap.servers": bootstrap},
        producer_group=group,
        listener=listener,
        topic_prefix=prefix,
        half_partitions=4,
    )
    producer.start()
    producer.send_message_in_transaction(Message(topic, value.encode()))


if __name__ == "__main__":
    main()
