"""The client side of timer messages without a broker (issue 35): ``Message``'s delivery
time, its resolution and the max-delay refusal, the timer and cancel records a producer
writes (signed under tenant isolation), the settings, and the transactional refusal."""

from __future__ import annotations

import pytest

from rmq_semantics import Message, Producer, ProducerSettings
from rmq_semantics.errors import ConfigError, SystemTopicError
from rmq_semantics.records.codec import decode_timer_cancel
from rmq_semantics.records.group_auth import cancel_canonical, derive_group_key
from rmq_semantics.records.headers import H
from rmq_semantics.records.timer import (
    DEFAULT_MAX_DELAY_MS,
    ROCKETMQ4_DELAY_LEVELS_MS,
    cancel_window_start,
    parse_timer,
    timer_partition,
)
from rmq_semantics.send_checks import SendChecks
from rmq_semantics.settings import load
from rmq_semantics.timer_writes import TimerWrites, deliver_at
from rmq_semantics.topics import SystemTopics

T = 1_700_000_000_000
CONF = {"bootstrap.servers": "unused:9092"}
TENANT_KEY = b"t" * 32


def _writes(group: str | None = None, partitions: int = 8, **settings) -> TimerWrites:
    writes = TimerWrites(CONF, SystemTopics("acme"), load(ProducerSettings, settings), group)
    writes._partitions = partitions  # as if the topics were made: no admin call here
    return writes


# -- Message ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "timing",
    [{"deliver_at_ms": T}, {"deliver_after_ms": 0}, {"delay_time_level": 3}],
)
def test_a_message_with_one_delivery_time_is_scheduled(timing):
    assert Message("orders", b"v", **timing).scheduled
    assert not Message("orders", b"v").scheduled


@pytest.mark.parametrize(
    "timing",
    [
        {"deliver_at_ms": T, "deliver_after_ms": 5},
        {"deliver_after_ms": 5, "delay_time_level": 1},
        {"deliver_at_ms": T, "delay_time_level": 1},
    ],
)
def test_two_delivery_times_are_one_config_error_naming_them(timing):
    with pytest.raises(ConfigError, match="at most one of") as info:
        Message("orders", b"v", **timing)
    assert all(name in str(info.value) for name in timing)


@pytest.mark.parametrize(
    "timing",
    [
        {"deliver_at_ms": -1},
        {"deliver_after_ms": -5},
        {"delay_time_level": 0},
        {"delay_time_level": True},
        {"deliver_at_ms": 1.5},
        {"deliver_after_ms": "10"},
    ],
    ids=str,
)
def test_a_delivery_time_out_of_range_is_a_config_error_naming_it(timing):
    [name] = timing
    with pytest.raises(ConfigError, match=f"Message.{name} must be an int"):
        Message("orders", b"v", **timing)


# -- when it is due -----------------------------------------------------------------------
def test_deliver_at_resolves_each_form_against_the_send_time():
    levels = ROCKETMQ4_DELAY_LEVELS_MS
    assert deliver_at(Message("t", b"v", deliver_at_ms=T - 5), T, levels) == T - 5
    assert deliver_at(Message("t", b"v", deliver_after_ms=1500), T, levels) == T + 1500
    assert deliver_at(Message("t", b"v", delay_time_level=3), T, levels) == T + 10_000
    assert deliver_at(Message("t", b"v", delay_time_level=18), T, levels) == T + 7_200_000
    with pytest.raises(ConfigError, match="has 18 levels"):
        deliver_at(Message("t", b"v", delay_time_level=19), T, levels)


def test_a_message_due_past_max_delay_is_refused_with_one_line():
    writes = _writes(max_delay_ms=60_000, delay_levels="1s")
    with pytest.raises(ConfigError, match="over max_delay_ms=60000") as info:
        writes.timer_record(Message("orders", b"v", deliver_after_ms=60_001), None, T)
    assert "\n" not in str(info.value)
    writes.timer_record(Message("orders", b"v", deliver_after_ms=60_000), None, T)
    past = writes.timer_record(Message("orders", b"v", deliver_at_ms=T - 10**6), None, T)
    assert parse_timer(0, 0, 0, T, None, b"v", past.headers).deliver_at_ms == T - 10**6


def test_the_default_max_delay_is_three_days():
    writes = _writes()
    assert writes.settings.max_delay_ms == DEFAULT_MAX_DELAY_MS == 3 * 86_400_000
    with pytest.raises(ConfigError, match="max_delay_ms"):
        writes.timer_record(Message("t", b"v", deliver_after_ms=DEFAULT_MAX_DELAY_MS + 1), None, T)


# -- the records --------------------------------------------------------------------------
def test_the_timer_record_goes_to_the_intake_in_the_ids_partition_with_its_headers():
    writes = _writes("pg", partitions=8)
    msg = Message("orders", b"v", key=b"k", headers={"app": "1"}, tags="A", delay_time_level=2)
    write = writes.timer_record(msg, 3, T)
    assert write.topic == "acme_timer" and len(write.message_id) == 32
    assert write.partition == timer_partition(write.message_id, 8)
    assert (write.key, write.value) == (b"k", b"v")
    record = parse_timer(0, write.partition, 0, T, write.key, write.value, write.headers)
    assert (record.timer_id, record.deliver_at_ms, record.real_topic) == (
        write.message_id,
        T + 5000,
        "orders",
    )
    assert (record.real_partition, record.born_ts, record.producer_group) == (3, T, "pg")
    assert record.user_headers() == [("app", b"1")] and (H.TAGS, b"A") in record.headers
    assert record.group_mac is None  # no tenant isolation


def test_each_send_gets_a_new_message_id():
    writes = _writes()
    msg = Message("orders", b"v", deliver_after_ms=0)
    assert len({writes.timer_record(msg, None, T).message_id for _ in range(50)}) == 50


def test_the_cancel_record_is_keyed_by_the_id_in_its_timer_partition():
    writes = _writes("pg", partitions=4)
    write = writes.cancel_record("abc123", T)
    assert (write.topic, write.partition, write.key) == (
        "acme_timer_cancel",
        timer_partition("abc123", 4),
        b"abc123",
    )
    cancel = decode_timer_cancel(write.key, write.value)
    assert (cancel.timer_id, cancel.producer_group, cancel.ts) == ("abc123", "pg", T)
    assert write.headers == []
    with pytest.raises(ConfigError, match="message id"):
        writes.cancel_record("")


def test_under_tenant_isolation_both_records_are_signed_with_the_groups_key():
    key = derive_group_key(TENANT_KEY, "pg")
    writes = _writes("pg", group_key=key.text())
    msg = Message("orders", b"v", key=b"k", deliver_after_ms=10)
    write = writes.timer_record(msg, None, T)
    record = parse_timer(0, write.partition, 0, T, write.key, write.value, write.headers)
    assert key.verifies(record.canonical(), record.group_mac)
    assert not derive_group_key(TENANT_KEY, "other").verifies(record.canonical(), record.group_mac)
    cancel = writes.cancel_record(write.message_id, T)
    [(name, mac)] = cancel.headers
    assert name == H.GROUP_MAC
    assert key.verifies(cancel_canonical(cancel.topic, cancel.partition, cancel.value), mac)


def test_a_group_key_without_a_producer_group_is_refused_at_the_first_timer_write():
    key = derive_group_key(TENANT_KEY, "pg")
    writes = _writes(None, group_key=key.text())  # constructing is fine: no timer yet
    with pytest.raises(ConfigError, match="producer_group="):
        writes.timer_record(Message("orders", b"v", deliver_after_ms=1), None, T)
    with pytest.raises(ConfigError, match="producer_group="):
        writes.cancel_record("abc")


def test_a_missing_key_file_fails_only_a_timer_write():
    writes = _writes("pg", group_key_file="/nonexistent/key")
    with pytest.raises(ConfigError, match="group_key_file"):
        writes.cancel_record("abc")


# -- settings -----------------------------------------------------------------------------
def test_the_producer_takes_the_timer_settings_as_kwargs_and_env(monkeypatch):
    with Producer(CONF, max_delay_ms=3_600_000, delay_levels="1s 1h") as producer:
        assert producer.settings.max_delay_ms == 3_600_000
        assert producer.settings.delay_levels == "1s 1h"
    monkeypatch.setenv("RMQ_TIMER_PARTITIONS", "4")
    monkeypatch.setenv("RMQ_DELAY_LEVELS", "2s 4s")
    with Producer(CONF) as producer:
        assert (producer.settings.timer_partitions, producer.settings.delay_levels) == (4, "2s 4s")


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"max_delay_ms": 999}, "max_delay_ms must be at least 1000"),
        ({"max_delay_ms": 60_000}, "over max_delay_ms=60000"),  # the table reaches 2 h
        ({"delay_levels": "1s 5x"}, "delay_levels"),
        ({"timer_partitions": 0}, "timer_partitions must be a positive int"),
    ],
)
def test_bad_timer_settings_are_one_config_error_naming_the_field(settings, match):
    with pytest.raises(ConfigError, match=match):
        Producer(CONF, **settings)


def test_a_producer_group_must_be_a_non_empty_str():
    with pytest.raises(ConfigError, match="producer_group"):
        Producer(CONF, producer_group="")


# -- transactions -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "timing", [{"deliver_at_ms": T}, {"deliver_after_ms": 5}, {"delay_time_level": 1}]
)
def test_a_transactional_message_with_a_delivery_time_is_refused_naming_rocketmqs_rule(timing):
    checks = SendChecks(None, CONF, "acme")  # no partition cache: refused before any use
    with pytest.raises(ConfigError, match="cannot be scheduled") as info:
        checks.check([Message("orders", b"v"), Message("orders", b"v", **timing)], 1.0)
    text = str(info.value)
    assert "RocketMQ" in text and "\n" not in text and next(iter(timing)) in text


# -- what a producer may not write ---------------------------------------------------------
def test_a_timer_message_for_a_system_topic_is_refused_before_anything_is_made():
    with Producer(CONF) as producer, pytest.raises(SystemTopicError):
        producer.send(Message("__rmq_half", b"v", deliver_after_ms=1))


@pytest.mark.parametrize("name", [H.TIMER_ID, H.DELIVER_AT, H.DELIVERED_AT, H.TIMER_ORIGIN])
def test_the_drop_in_refuses_the_timer_headers(name):
    """Only ``send`` writes a timer record: a record carrying one of these elsewhere would
    pass for the coordinator's (rmq.delivered_at) or confuse a reader."""
    with Producer(CONF) as producer, pytest.raises(ConfigError, match="reserved"):
        producer.produce("orders", b"v", headers=[(name, b"1")])


def test_a_recall_is_refused_exactly_past_timer_cancels_max_in_its_window(monkeypatch):
    """Issue 44, item 9: the producer counts its cancel's predecessors in the window from
    the first offset at or after the window's start (Kafka's look-up by time, faked here)."""
    asked: list[tuple[str, int, int]] = []

    def first_at(admin, topic, partition, ts):
        asked.append((topic, partition, ts))
        return 100

    monkeypatch.setattr("rmq_semantics.timer_writes.offset_for_time", first_at)
    monkeypatch.setattr("rmq_semantics.timer_writes.admin_client", lambda conf: object())
    writes = _writes(timer_cancels_max=5, max_delay_ms=60_000, delay_levels="1s")
    cancel = writes.cancel_record("f" * 32, now_ms=T)
    assert cancel.timestamp == T == decode_timer_cancel(cancel.key, cancel.value).ts
    assert writes.cancel_refusal(cancel, 104, 1.0) is None  # 4 before it
    refused = writes.cancel_refusal(cancel, 105, 1.0)
    assert refused is not None and "timer_cancels_max=5" in refused and "5 cancel" in refused
    assert set(asked) == {(cancel.topic, cancel.partition, cancel_window_start(T, 60_000))}
