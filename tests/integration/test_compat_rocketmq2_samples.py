"""The RocketMQ 2.x Python client's own samples run on Kafka (issue 37): ``samples/producer.py``
and ``samples/consumer.py`` of the ``rocketmq-client-python`` 2.0.0 sdist (downloaded from
PyPI, never copied here), with their import line changed to
``rmq_semantics.compat.rocketmq_client``, the name-server address pointed at the embedded
broker, and the topic and groups given unique names.

The producer sample runs as a script (its ten synchronous sends), then its orderly and
transactional senders are called from it (the transactional one sleeps for ever after
sending, so it is stopped once the coordinator's back-check, which the sample answers
COMMIT, has made its messages visible); the consumer sample then prints every message, and
each of the thirty arrives once, with the sample's body and property. An orderly
``PushConsumer`` consumes the messages of one sharding key in order."""

from __future__ import annotations

import ast
import os
import re
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from rmq_semantics.compat.rocketmq_client import (
    ConsumeStatus,
    Message,
    Producer,
    PushConsumer,
    ReceivedMessage,
    SendStatus,
)
from tests.integration.txn_helpers import REPO, ThreadCoordinator, TopicReader, wait_for
from tests.rocketmq_packages import v2_source

pytestmark = pytest.mark.integration

WAIT_S = 90
IMPORT = "from rocketmq.client import"
OURS = "from rmq_semantics.compat.rocketmq_client import"
NAME_SERVER = "'127.0.0.1:9876'"


def rewritten(member: str, replacements: dict[str, str]) -> str:
    """The sample's source with each replacement made (each must occur: a changed upstream
    sample fails here, not later)."""
    source = v2_source(member)
    for old, new in {IMPORT: OURS, **replacements}.items():
        if old not in source:
            raise AssertionError(f"{member} no longer contains {old!r}")
        source = source.replace(old, new)
    ast.parse(source)  # still Python after the rewrite
    return source


def run_python(workdir: Path, *args: str, timeout_s: float = WAIT_S) -> str:
    proc = subprocess.run(
        [sys.executable, "-u", *args],
        cwd=workdir,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert proc.returncode == 0, f"{args} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    return proc.stdout


class Background:
    """A sample that never ends by itself, its output in a file."""

    def __init__(self, workdir: Path, name: str, *args: str) -> None:
        self.out = workdir / f"{name}.out"
        self.err = workdir / f"{name}.err"
        with self.out.open("w") as out, self.err.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-u", *args],
                cwd=workdir,
                env={**os.environ, "PYTHONPATH": str(REPO)},
                stdout=out,
                stderr=err,
            )

    def details(self) -> str:
        return f"exit {self.proc.poll()}; stderr:\n{self.err.read_text()[-3000:]}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)


def test_the_2x_samples_send_and_consume_every_message_once(broker, make_topic, unique, tmp_path):
    topic = make_topic("TopicTest", partitions=2)
    address = f"'{broker.bootstrap}'"
    producer_source = rewritten(
        "samples/producer.py",
        {
            NAME_SERVER: address,
            "'TopicTest'": f"'{topic}'",
            "gid = 'test'": f"gid = '{unique('gid')}'",
        },
    )
    (tmp_path / "producer.py").write_text(producer_source)
    consumer_source = rewritten(
        "samples/consumer.py",
        {
            NAME_SERVER: address,
            "'TopicTest'": f"'{topic}'",
            "'consumer_group'": f"'{unique('consumer_group')}'",
        },
    )
    (tmp_path / "consumer.py").write_text(consumer_source)

    # The script as its __main__ runs it: ten synchronous sends.
    out = run_python(tmp_path, "producer.py")
    ok = f"send message status: {SendStatus.OK} msgId: "  # str() of an IntEnum: its number
    assert out.count(ok) == 10, out
    assert "send sync message done" in out
    # Its orderly sender: ten messages of one sharding key, one partition, in order.
    out = run_python(tmp_path, "-c", "import producer; producer.send_orderly_with_sharding_key(10)")
    assert out.count(ok) == 10, out
    orderly_ids = [line.rsplit(" ", 1)[1] for line in out.splitlines() if "msgId" in line]
    assert len({i.rsplit(":", 2)[1] for i in orderly_ids}) == 1  # one partition
    assert [int(i.rsplit(":", 1)[1]) for i in orderly_ids] == sorted(
        int(i.rsplit(":", 1)[1]) for i in orderly_ids
    )

    # Its transactional sender: the local transaction says UNKNOWN, the check says COMMIT.
    reader = TopicReader(broker.conf(), topic, 2)
    with ThreadCoordinator(broker.conf()):
        sender = Background(
            tmp_path, "txn", "-c", "import producer; producer.send_transaction_message(10)"
        )
        try:
            reader.read_until(lambda r: len(r) >= 30, WAIT_S, "the committed transactions")
            assert "send transaction message done" in sender.out.read_text(), sender.details()
        finally:
            sender.stop()
    records = reader.settle(2.0)
    reader.close()
    assert len(records) == 30
    assert sender.out.read_text().count("check: message body") >= 10

    consumer = Background(tmp_path, "consumer", "consumer.py")
    # The sample prints from the consumer's threads, so lines may interleave (print writes
    # its arguments one at a time): each printed id is whole, so count those.
    ids = re.compile(rf"{re.escape(topic)}:\d+:\d+")
    try:
        wait_for(
            lambda: len(ids.findall(consumer.out.read_text())) >= 30,
            WAIT_S,
            "the consumer sample to print 30 messages",
            details=consumer.details,
        )
    finally:
        consumer.stop()
    printed = consumer.out.read_text()
    assert len(ids.findall(printed)) == 30
    assert len(set(ids.findall(printed))) == 30  # each message once
    assert printed.count("b'message body'") == printed.count("b'test'") == 30


def test_an_orderly_2x_push_consumer_consumes_a_sharding_key_in_order_retrying_in_place(
    broker, make_topic, unique
):
    prefix = f"rmq2{uuid.uuid4().hex[:8]}"
    topic = make_topic("Orderly", partitions=2)
    producer = Producer(unique("gid"), topic_prefix=prefix)
    producer.set_name_server_address(broker.bootstrap)
    producer.start()
    for i in range(5):
        for key in ("a", "b"):
            msg = Message(topic)
            msg.set_body(f"{key}-{i}")
            assert producer.send_orderly_with_sharding_key(msg, key).status == SendStatus.OK
    producer.shutdown()

    calls: list[tuple[bytes, int]] = []
    lock = threading.Lock()

    def callback(msg: ReceivedMessage) -> ConsumeStatus:
        with lock:
            calls.append((msg.body, msg.reconsume_times))
        if msg.body == b"a-1" and msg.reconsume_times == 0:
            return ConsumeStatus.RECONSUME_LATER
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(unique("orderly"), orderly=True, topic_prefix=prefix)
    consumer.set_name_server_address(broker.bootstrap)
    consumer.subscribe(topic, callback)
    with ThreadCoordinator(broker.conf(), topic_prefix=prefix):  # the queue locks
        consumer.start()
        try:
            wait_for(lambda: len(calls) >= 11, WAIT_S, "every message and the retry")
        finally:
            consumer.shutdown()
    a = [(body, times) for body, times in calls if body.startswith(b"a")]
    b = [body for body, _ in calls if body.startswith(b"b")]
    assert a == [(b"a-0", 0), (b"a-1", 0), (b"a-1", 1), (b"a-2", 0), (b"a-3", 0), (b"a-4", 0)]
    assert b == [b"b-0", b"b-1", b"b-2", b"b-3", b"b-4"]
