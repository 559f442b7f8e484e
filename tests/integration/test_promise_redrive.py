"""``rmq-semantics txn redrive`` of one transaction run twice at once (issue 29): whichever
run starts second fences the first, so the discarded message is written back, and so
promoted, exactly once; the fenced run says so in one error line and exits non-zero."""

from __future__ import annotations

import threading

import pytest

from rmq_semantics import LocalTransactionState as S
from rmq_semantics import Message, TransactionProducer
from rmq_semantics.cli import main
from rmq_semantics.records.headers import H
from rmq_semantics.tools import admin
from rmq_semantics.tools.admin import list_discarded
from tests.integration.txn_helpers import (
    ScriptedListener,
    ThreadCoordinator,
    no_pending,
    read_to_end,
    wait_for,
)

pytestmark = pytest.mark.integration


def test_two_concurrent_redrives_of_one_transaction_promote_it_once(
    broker, make_topic, unique, monkeypatch, capsys
):
    prefix = unique("rd").replace("-", "")
    topic = make_topic("redrive")
    group = unique("pg")
    answer = {"check": S.UNKNOW}
    listener = ScriptedListener(
        lambda v: S.COMMIT_MESSAGE if v == b"behind" else S.UNKNOW, lambda v: answer["check"]
    )
    conf = broker.conf()
    argv = ["txn", "redrive", "", "--bootstrap-servers", broker.bootstrap, "--topic-prefix", prefix]

    # The interleaving no public call can force: the first run stops after its last check
    # (the done-marker scan) until the second run has finished; the same private function is
    # the last check before the write in today's code and in the fixed one.
    first_checked, second_done = threading.Event(), threading.Event()
    real_check = admin._promoted_since

    def pausing_check(*args, **kwargs):
        found = real_check(*args, **kwargs)
        if threading.current_thread().name == "first-redrive":
            first_checked.set()
            assert second_done.wait(120), "the second redrive never finished"
        return found

    monkeypatch.setattr(admin, "_promoted_since", pausing_check)
    exits: dict[str, int] = {}
    with (
        ThreadCoordinator(conf, topic_prefix=prefix, half_partitions=1, check_max=1) as coordinator,
        TransactionProducer(
            conf, producer_group=group, listener=listener, topic_prefix=prefix, half_partitions=1
        ) as producer,
    ):
        result = producer.send_message_in_transaction(Message(topic, b"once"))
        wait_for(
            lambda: any(t.txn_id == result.transaction_id for t in list_discarded(conf, prefix)),
            60,
            "the discard",
        )
        answer["check"] = S.COMMIT_MESSAGE
        argv[2] = result.transaction_id
        first = threading.Thread(
            target=lambda: exits.update(first=main(argv)), name="first-redrive"
        )
        first.start()
        assert first_checked.wait(120), "the first redrive never reached its write"
        try:
            exits["second"] = main(argv)
        finally:
            second_done.set()
            first.join(120)
        assert not first.is_alive()

        # A transaction behind the re-driven half, committed at once: when it is promoted
        # and nothing is pending, every re-driven copy before it has been decided.
        producer.send_message_in_transaction(Message(topic, b"behind"))
        wait_for(
            lambda: b"behind" in [m.value() for m in read_to_end(conf, topic, 1)],
            60,
            "the transaction behind to be promoted",
        )
        wait_for(lambda: no_pending(coordinator, 1), 60, "the re-driven copies to be decided")
        half = read_to_end(conf, f"{prefix}_half", 1)
        exits["third"] = main(argv)  # started after the commit: its checks see the copy
    promoted = [m.value() for m in read_to_end(conf, topic, 1)]
    assert sorted(promoted) == [b"behind", b"once"], "the discarded message was promoted twice"
    assert len([m for m in half if H.REDRIVE_OF in dict(m.headers() or [])]) == 1
    assert (exits["first"], exits["second"], exits["third"]) == (2, 0, 2)
    fenced, refused = [
        line
        for line in capsys.readouterr().err.splitlines()
        if line.startswith("rmq-semantics: error:")
    ]
    assert "fenced" in fenced and result.transaction_id in fenced
    assert "already promoted" in refused
