"""The concurrent consumer's pure parts: delay levels, the shared dead-letter and retry
header builder, and the repair of forged retry headers."""

from __future__ import annotations

import pytest

from rmq_semantics.errors import ConfigError
from rmq_semantics.push import ConsumeConcurrentlyContext, PushConsumer
from rmq_semantics.push.retry import (
    DEFAULT_DELAY_LEVELS,
    check_delay_levels,
    level_of,
    read_retry,
)
from rmq_semantics.records.dead_letter import dlq_headers, retry_headers
from rmq_semantics.records.headers import H

WHERE = ("__rmq_retry_g_1", 0, 42)


def test_default_levels_are_rocketmqs():
    assert DEFAULT_DELAY_LEVELS == (
        1,
        5,
        10,
        30,
        60,
        120,
        180,
        240,
        300,
        360,
        420,
        480,
        540,
        600,
        1200,
        1800,
        3600,
        7200,
    )


@pytest.mark.parametrize("levels", [(), (1, -1), ("x",), (float("inf"),), None])
def test_bad_delay_levels_are_one_config_error(levels):
    with pytest.raises(ConfigError, match="delay_levels"):
        check_delay_levels(levels)


def test_reconsume_n_waits_level_n_capped_unless_the_context_asks():
    assert [level_of(n, 0, 3) for n in (1, 2, 3, 4, 17)] == [1, 2, 3, 3, 3]
    assert level_of(1, 2, 3) == 2 and level_of(1, 9, 3) == 3


def test_context_level_is_settable_and_checked():
    context = ConsumeConcurrentlyContext("t", 0, 1)
    context.delay_level_when_next_consume = 3
    assert context.delay_level_when_next_consume == 3
    with pytest.raises(ConfigError):
        context.delay_level_when_next_consume = "3"


def test_dlq_headers_replace_old_bookkeeping_and_name_the_exception():
    old = [("app", b"1"), (H.RECONSUME_TIMES, b"2"), (H.DLQ_EXCEPTION, b"Forged")]
    out = dict(
        dlq_headers(
            old,
            topic="t",
            partition=1,
            offset=7,
            reconsume_times=16,
            error=ValueError("boom"),
            first_failure_ms=10,
            last_failure_ms=20,
        )
    )
    assert out == {
        "app": b"1",
        H.DLQ_ORIGINAL_TOPIC: b"t",
        H.DLQ_ORIGINAL_PARTITION: b"1",
        H.DLQ_ORIGINAL_OFFSET: b"7",
        H.DLQ_RECONSUME_TIMES: b"16",
        H.DLQ_EXCEPTION: b"ValueError",
        H.DLQ_EXCEPTION_MESSAGE: b"boom",
        H.DLQ_FIRST_FAILURE_TS: b"10",
        H.DLQ_LAST_FAILURE_TS: b"20",
    }


def test_a_good_retry_record_reads_back_without_problems():
    headers = retry_headers(
        [("app", b"1")],
        topic="orders",
        partition=2,
        offset=9,
        reconsume_times=3,
        first_failure_ms=100,
        due_ms=1500,
    )
    info = read_retry(
        headers, where=WHERE, level_delay_ms=1000, now_ms=1000, max_reconsume_times=16
    )
    assert (
        info.reconsume_times,
        info.topic,
        info.partition,
        info.offset,
        info.first_failure_ms,
        info.due_ms,
        info.problems,
    ) == (3, "orders", 2, 9, 100, 1500, ())


@pytest.mark.parametrize(
    ("name", "value"),
    [
        (H.RECONSUME_TIMES, b"x"),
        (H.RECONSUME_TIMES, b"0"),
        (H.RECONSUME_TIMES, None),
        (H.RETRY_DUE_TS, b"-1"),
        (H.RETRY_DUE_TS, str(10**15).encode()),
        (H.ORIGINAL_TOPIC, b"\xff"),
        (H.ORIGINAL_PARTITION, b"p"),
        (H.FIRST_FAILURE_TS, b"1.5"),
    ],
)
def test_forged_retry_headers_are_repaired_and_reported(name, value):
    headers = [
        (k, v)
        for k, v in retry_headers(
            [],
            topic="orders",
            partition=2,
            offset=9,
            reconsume_times=3,
            first_failure_ms=100,
            due_ms=1500,
        )
        if k != name
    ]
    if value is not None:
        headers.append((name, value))
    info = read_retry(
        headers, where=WHERE, level_delay_ms=1000, now_ms=1000, max_reconsume_times=16
    )
    assert info.problems and name in info.problems[0]
    if name == H.RECONSUME_TIMES:
        assert info.reconsume_times == 16  # a failure sends it to the DLQ: no endless loop
    if name == H.RETRY_DUE_TS:
        assert info.due_ms == 1000  # due now: a forged time never holds the partition
    if name in (H.ORIGINAL_TOPIC, H.ORIGINAL_PARTITION):
        assert (info.topic, info.partition, info.offset) == WHERE


def test_push_consumer_refuses_bad_settings_in_one_line():
    conf = {"bootstrap.servers": "x:1", "group.id": "g"}
    with pytest.raises(ConfigError, match="max_workers"):
        PushConsumer(conf, listener=lambda m, c: None, max_workers=0)
    with pytest.raises(ConfigError, match=r"enable\.auto\.commit"):
        PushConsumer({**conf, "enable.auto.commit": True}, listener=lambda m, c: None)
    with pytest.raises(ConfigError, match="listener"):
        PushConsumer(conf, listener=3)
    consumer = PushConsumer(conf, listener=lambda m, c: None, delay_levels=(1, 2))
    assert consumer.retry_topics == ["__rmq_retry_g_1", "__rmq_retry_g_2"]
    assert consumer.dlq_topic == "__rmq_dlq_g"
    with pytest.raises(ConfigError, match="system topic"):
        consumer.subscribe(["__rmq_retry_g_1"])
    with pytest.raises(ConfigError, match="tags"):
        consumer.subscribe(["t"], tags="A ||")


def test_a_copy_is_written_now_and_carries_its_birth_time():
    from rmq_semantics.push import PushMessage
    from rmq_semantics.push.retry import born_of, out_record

    msg = PushMessage("t", 0, 5, b"k", b"v", (("app", b"1"),), 1000, 1000)
    copy = out_record(
        msg,
        now_ms=9000,
        topic="r",
        retry=True,
        due_ms=9500,
        error=None,
        first_failure_ms=None,
        source="t[0]@5",
    )
    assert copy.timestamp == 9000 and born_of(copy.headers, 9000) == 1000
    assert born_of([(H.BORN_TS, b"x")], 9000) == 9000
