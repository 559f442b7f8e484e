"""Back-checks stay available and go to the right producer, on the real broker.

- A producer whose ``check_local_transaction`` hangs on one transaction keeps answering its
  other checks (a pool of ``check_threads``), answers the hung one UNKNOW after
  ``check_timeout_ms`` (visible as its end request on the Op topic), and the other producer
  of the group goes on answering and promoting.
- Check affinity: while producer A lives, the checks of the transactions A sent go to A and
  those B sent go to B; after A is SIGKILLed, A's transactions are checked by B and promoted
  once.
"""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading

import pytest
from confluent_kafka.admin import AdminClient

from rmq_semantics import LocalTransactionState as S
from rmq_semantics import Message, TransactionListener, TransactionProducer
from rmq_semantics.records.codec import decode
from rmq_semantics.records.txn import EndRequest, EndState
from rmq_semantics.topics import SystemTopics
from tests.integration.txn_helpers import FAST, REPO, ThreadCoordinator, read_to_end, wait_for

pytestmark = pytest.mark.integration

HALF, CHECK = FAST["half_partitions"], FAST["check_partitions"]


class RecordingListener(TransactionListener):
    """Local transactions answer UNKNOW (so every transaction is checked); checks record
    the value and answer COMMIT, except ``hang-*`` ones, which wait until released."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.checked: list[bytes] = []
        self.release = threading.Event()

    def execute_local_transaction(self, msg, arg):
        return S.UNKNOW

    def check_local_transaction(self, msg):
        with self.lock:
            self.checked.append(msg.value)
        if msg.value.startswith(b"hang-"):
            self.release.wait(120)
        return S.COMMIT_MESSAGE

    def values(self, prefix: bytes) -> set[bytes]:
        with self.lock:
            return {v for v in self.checked if v.startswith(prefix)}


def _producer(conf, prefix, group, listener, instance_id, **kw) -> TransactionProducer:
    return TransactionProducer(
        conf,
        producer_group=group,
        listener=listener,
        topic_prefix=prefix,
        half_partitions=HALF,
        check_partitions=CHECK,
        instance_id=instance_id,
        **kw,
    )


def _send(producer: TransactionProducer, topic: str, batch: str, n: int) -> set[bytes]:
    values = {f"{batch}-{i}".encode() for i in range(n)}
    for value in sorted(values):
        producer.send_message_in_transaction(Message(topic, value))
    return values


def _promoted(conf, topic) -> list[bytes]:
    return [m.value() for m in read_to_end(conf, topic, 1)]


def _check_members(conf: dict, prefix: str, group: str) -> list[int]:
    """How many check partitions each member of the group's check consumer group holds."""
    admin = AdminClient(conf)
    check_group = SystemTopics(prefix).check_group(group)
    description = admin.describe_consumer_groups([check_group])[check_group].result(10)
    return sorted(len(m.assignment.topic_partitions) for m in description.members)


def test_a_hung_check_times_out_unknow_while_both_producers_go_on_answering(
    broker, make_topic, unique
):
    prefix = unique("ha").replace("-", "")
    topic = make_topic("hung")
    conf = broker.conf()
    group = unique("pg")
    hung, fine = RecordingListener(), RecordingListener()
    with (
        ThreadCoordinator(conf, topic_prefix=prefix),
        _producer(conf, prefix, group, hung, "hung", check_threads=2, check_timeout_ms=1000) as p1,
        _producer(conf, prefix, group, fine, "fine") as p2,
    ):
        try:
            wait_for(
                lambda: (
                    _check_members(conf, prefix, group) == [1, 1]
                    and all(len(p._checks.held_partitions) == 1 for p in (p1, p2))
                ),
                60,
                "both producers each holding a check partition",
            )
            [hang_value] = _send(p1, topic, "hang", 1)
            expected = _send(p1, topic, "p1", 10) | _send(p2, topic, "p2", 10)
            wait_for(
                lambda: set(_promoted(conf, topic)) >= expected,
                90,
                "every other transaction promoted",
                details=lambda: f"promoted {sorted(_promoted(conf, topic))}",
            )
            wait_for(lambda: p1.checks_timed_out >= 1, 30, "the hung check to time out")
            # The hung instance answered its own other checks: its pool kept working.
            assert hung.values(b"p1-") == {v for v in expected if v.startswith(b"p1-")}, (
                f"hung checked {sorted(hung.checked)}, fine checked {sorted(fine.checked)}"
            )
            assert fine.values(b"p2-") == {v for v in expected if v.startswith(b"p2-")}
            assert hang_value not in fine.checked  # affinity: A's check never went to B
        finally:
            hung.release.set()
    promoted = _promoted(conf, topic)
    assert sorted(promoted) == sorted(expected), "each promoted exactly once, the hung one never"
    unknown = [
        r for r in _op_requests(conf, prefix) if r.from_check and r.state is EndState.UNKNOWN
    ]
    assert unknown, "the timed-out check was answered UNKNOW"


def _op_requests(conf: dict, prefix: str) -> list[EndRequest]:
    records = read_to_end(conf, SystemTopics(prefix).op, HALF)
    out = []
    for record in records:
        decoded = decode(record.value())
        if isinstance(decoded, EndRequest):
            out.append(decoded)
    return out


def test_checks_go_to_the_instance_that_sent_the_half_and_to_the_group_after_it_dies(
    broker, make_topic, unique
):
    prefix = unique("af").replace("-", "")
    topic = make_topic("affinity")
    conf = broker.conf()
    group = unique("pg")
    b_listener = RecordingListener()
    lines: queue.Queue[str] = queue.Queue()
    with (
        ThreadCoordinator(conf, topic_prefix=prefix),
        _producer(conf, prefix, group, b_listener, "B") as b,
    ):
        a = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integration.check_affinity_worker",
                broker.bootstrap,
                prefix,
                group,
                topic,
                str(HALF),
                str(CHECK),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        threading.Thread(
            target=lambda: [lines.put(x.strip()) for x in a.stdout], daemon=True
        ).start()
        checked_by_a: set[bytes] = set()

        def a_says(expected: str | None) -> str | None:
            """Read A's lines until one starting with ``expected`` (None: until none is
            waiting); that line."""
            while True:
                try:
                    line = lines.get(timeout=60) if expected else lines.get_nowait()
                except queue.Empty:
                    return None
                if line.startswith("CHECKED "):
                    checked_by_a.add(line.split()[1].encode())
                elif expected and line.startswith(expected):
                    return line

        def a_holds() -> int:
            a.stdin.write("holds\n")
            a.stdin.flush()
            return int(a_says("HOLDS").split()[1])

        try:
            a_says("STARTED")
            wait_for(
                lambda: (
                    _check_members(conf, prefix, group) == [1, 1]
                    and a_holds() == 1
                    and len(b._checks.held_partitions) == 1
                ),
                60,
                "A and B each holding a check partition",
            )
            a.stdin.write("first 10\n")
            a.stdin.flush()
            a_says("SENT first")
            first = {f"first-{i}".encode() for i in range(10)}
            from_b = _send(b, topic, "b", 10)
            wait_for(
                lambda: set(_promoted(conf, topic)) >= first | from_b,
                90,
                "the first batches promoted",
            )
            wait_for(
                lambda: a_says(None) or first <= checked_by_a,
                30,
                "A's lines about its checks",
                details=lambda: (
                    f"A checked {sorted(checked_by_a)}, B checked {sorted(b_listener.checked)}"
                ),
            )
            assert not (from_b & checked_by_a), "B's checks went to A"
            assert not b_listener.values(b"first-"), "A's checks went to B while A lived"
            assert b_listener.values(b"b-") == from_b

            a.stdin.write("doomed 5\n")
            a.stdin.flush()
            a_says("SENT doomed")
        finally:
            a.send_signal(signal.SIGKILL)
            a.wait(30)
        doomed = {f"doomed-{i}".encode() for i in range(5)}
        wait_for(
            lambda: set(_promoted(conf, topic)) >= doomed,
            120,
            "A's last transactions checked by B and promoted",
        )
        assert b_listener.values(b"doomed-") == doomed
    promoted = _promoted(conf, topic)
    assert sorted(promoted) == sorted(first | from_b | doomed), "each exactly once"
