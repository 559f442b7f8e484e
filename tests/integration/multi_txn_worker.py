"""A producer process for the multi-message crash test: writes the first members of a
transaction (its size says more are coming), prints MEMBERS_WRITTEN and blocks, so the test
can SIGKILL it halfway through the transaction's members."""

from __future__ import annotations

import sys

from rmq_semantics import Message
from tests.integration.txn_helpers import MemberWriter


def main() -> None:
    bootstrap, prefix, group, topic, partitions, size, written = sys.argv[1:8]
    writer = MemberWriter({"bootstrap.servers": bootstrap}, prefix, group, int(partitions))
    msgs = [Message(topic, f"member-{i}".encode(), key=f"k{i}") for i in range(int(written))]
    txn_id, partition, offsets = writer.write(msgs, size=int(size))
    print(f"MEMBERS_WRITTEN {txn_id} {partition} {offsets[0]}", flush=True)
    sys.stdin.readline()  # the test kills us here


if __name__ == "__main__":
    main()
