"""Timer messages on the wire (``rmq_semantics.records.timer``, issue 35): the timer record
written and parsed, what makes one malformed, the delivered record's headers, the cancel
record, the wheel's level arithmetic, the timer partition, the topic names and specs."""

from __future__ import annotations

import pytest
from confluent_kafka import TopicPartition
from hypothesis import given
from hypothesis import strategies as st

from rmq_semantics.errors import ConfigError, MalformedRecordError, SystemTopicError
from rmq_semantics.message import Message
from rmq_semantics.records.codec import (
    MAGIC,
    RecordType,
    decode,
    decode_timer_cancel,
    encode,
)
from rmq_semantics.records.group_auth import derive_group_key, sign_timer_headers
from rmq_semantics.records.headers import H
from rmq_semantics.records.timer import (
    DEFAULT_MAX_DELAY_MS,
    ROCKETMQ4_DELAY_LEVELS_MS,
    TimerCancel,
    cancel_window_start,
    format_delay_levels,
    hold_ms,
    level_for,
    max_level,
    parse_delay_levels,
    parse_timer,
    timer_headers,
    timer_partition,
    unparsed_timer,
    valid_timer_id,
)
from rmq_semantics.selector import java_partition
from rmq_semantics.topics import (
    SystemPartitionFilter,
    SystemTopics,
    is_system_topic,
    refuse_system_destination,
    refuse_system_topics,
    timer_topic_specs,
)
from spark.subscription import _probe_names, guard_subscription

T = 1_700_000_000_000
ID = "0123456789abcdef0123456789abcdef"


def _msg(**kw) -> Message:
    return Message("orders", b"v", key=b"k", headers={"app": b"1"}, tags="A", keys="K1", **kw)


def _headers(**kw) -> list:
    return timer_headers(_msg(**kw), ID, T + 60_000, T)


# -- the timer record ---------------------------------------------------------------------
def test_a_timer_record_round_trips_through_its_headers():
    msg = _msg(partition=2, message_group="g1")
    headers = timer_headers(msg, ID, T + 60_000, T, producer_group="pg")
    record = parse_timer(0, 3, 41, T + 5, msg.key, msg.value, headers)
    assert (
        record.timer_id,
        record.deliver_at_ms,
        record.real_topic,
        record.real_partition,
        record.born_ts,
        record.producer_group,
        record.group_mac,
        record.origin_offset,
    ) == (ID, T + 60_000, "orders", 2, T, "pg", None, 41)
    assert record.user_headers() == [("app", b"1")]
    assert (H.TAGS, b"A") in record.headers and (H.MESSAGE_GROUP, b"g1") in record.headers
    assert record.where == f"timer[3]@41 id={ID}"


def test_timer_headers_leave_out_what_the_message_and_producer_do_not_set():
    headers = timer_headers(Message("orders", b"v"), ID, T, T)
    assert [n for n, _ in headers] == [H.TIMER_ID, H.DELIVER_AT, H.REAL_TOPIC, H.BORN_TS]
    record = parse_timer(0, 0, 0, T, None, b"v", headers)
    assert (record.real_partition, record.producer_group) == (None, None)


@pytest.mark.parametrize(
    "broken",
    [
        {H.TIMER_ID: None},
        {H.TIMER_ID: b""},
        {H.TIMER_ID: b"t" * 129},
        {H.TIMER_ID: b"id\xff"},
        {H.TIMER_ID: b"a\nb"},
        {H.DELIVER_AT: None},
        {H.DELIVER_AT: b"-1"},
        {H.DELIVER_AT: b"1e3"},
        {H.DELIVER_AT: b"99999999999999999999"},
        {H.REAL_TOPIC: b""},
        {H.REAL_TOPIC: b"no such/topic"},
        {H.REAL_TOPIC: b".."},
        {H.REAL_TOPIC: b"t\xff"},
        {H.BORN_TS: b"x"},
        {H.REAL_PARTITION: b"-3"},
        {H.REAL_PARTITION: str(2**31).encode()},
        {H.PRODUCER_GROUP: b"\xff"},
        {H.TIMER_ORIGIN: b"5"},  # only a coordinator's re-append carries it
    ],
    ids=str,
)
def test_a_broken_timer_record_is_malformed_with_its_reason(broken):
    headers = dict(timer_headers(Message("orders", b"v"), ID, T, T))
    headers.update(broken)
    with pytest.raises(MalformedRecordError, match=r"timer\[0\]@3: "):
        parse_timer(0, 0, 3, T, None, b"v", list(headers.items()))


def test_a_header_given_twice_is_malformed():
    headers = [*timer_headers(Message("orders", b"v"), ID, T, T), (H.DELIVER_AT, b"1")]
    with pytest.raises(MalformedRecordError, match="appears twice"):
        parse_timer(0, 0, 3, T, None, b"v", headers)


def test_a_level_record_needs_its_origin_and_keeps_it_through_re_appends():
    intake = parse_timer(0, 5, 17, T, b"k", b"v", _headers())
    on_level = parse_timer(4, 5, 900, T + 1, b"k", b"v", intake.reappended_headers())
    assert on_level.origin_offset == 17 and on_level.where == f"timer_4[5]@900 id={ID}"
    again = parse_timer(2, 5, 3, T + 2, b"k", b"v", on_level.reappended_headers())
    assert again.origin_offset == 17
    assert [n for n, _ in again.headers].count(H.TIMER_ORIGIN) == 1
    with pytest.raises(MalformedRecordError, match="missing on a level"):
        parse_timer(3, 5, 1, T, b"k", b"v", _headers())


def test_the_delivered_record_keeps_user_and_kept_headers_and_names_its_intake_record():
    record = parse_timer(0, 6, 23, T, b"k", b"v", _headers(message_group="g1", partition=1))
    on_level = parse_timer(7, 6, 4, T, b"k", b"v", record.reappended_headers())
    delivered = dict(on_level.delivered_headers(T + 61_000))
    assert delivered == {
        "app": b"1",
        H.TAGS: b"A",
        H.KEYS: b"K1",
        H.MESSAGE_GROUP: b"g1",
        H.TIMER_ID: ID.encode(),
        H.DELIVERED_AT: str(T + 61_000).encode(),
        H.PROMOTED_FROM: b"timer:6:23",
    }


def test_exceeds_compares_the_delay_with_the_birth_time():
    record = parse_timer(0, 0, 0, T, None, b"v", _headers())  # due 60 s after its birth
    assert not record.exceeds(60_000) and record.exceeds(59_999)


def test_an_unparsed_timer_keeps_what_can_be_read_and_never_raises():
    headers = [(H.TIMER_ID, b"x\xff"), (H.REAL_TOPIC, None), ("junk", b"\x00")]
    record = unparsed_timer(3, 2, 9, T, b"k", b"v", headers)
    assert (record.level, record.partition, record.offset) == (3, 2, 9)
    assert (record.timer_id, record.real_topic, record.headers) == ("x\ufffd", "", headers)
    assert unparsed_timer(0, 0, 0, T, None, None, None).headers == []


def test_a_signed_timer_record_verifies_as_read_and_re_appended_not_when_changed():
    key = derive_group_key(b"k" * 32, "pg")
    msg = _msg()
    headers = sign_timer_headers(
        key, timer_headers(msg, ID, T + 5000, T, producer_group="pg"), msg.key, msg.value
    )
    record = parse_timer(0, 1, 2, T, msg.key, msg.value, headers)
    assert key.verifies(record.canonical(), record.group_mac)
    on_level = parse_timer(1, 1, 9, T, msg.key, msg.value, record.reappended_headers())
    assert key.verifies(on_level.canonical(), on_level.group_mac)
    later = dict(headers) | {H.DELIVER_AT: str(T + 6000).encode()}
    moved = parse_timer(0, 1, 2, T, msg.key, msg.value, list(later.items()))
    assert not key.verifies(moved.canonical(), moved.group_mac)
    other = parse_timer(0, 1, 2, T, msg.key, b"other", headers)
    assert not key.verifies(other.canonical(), other.group_mac)


def test_signing_leaves_headers_that_are_not_a_signed_timer_record_alone():
    key = derive_group_key(b"k" * 32, "pg")
    headers = timer_headers(Message("orders", b"v"), ID, T, T)  # no producer group
    assert sign_timer_headers(key, headers, None, b"v") == headers


# -- the cancel record --------------------------------------------------------------------
def test_a_cancel_record_round_trips_and_checks_its_key():
    cancel = TimerCancel(ID, "pg", T)
    data = encode(cancel)
    assert data[:3] == bytes([MAGIC, RecordType.TIMER_CANCEL, 1])
    assert decode(data) == cancel
    assert decode_timer_cancel(ID.encode(), data) == cancel
    assert decode_timer_cancel(None, encode(TimerCancel(ID, None, T))).producer_group is None
    with pytest.raises(MalformedRecordError, match="is not its id"):
        decode_timer_cancel(b"other", data)


@pytest.mark.parametrize(
    "cancel",
    [
        TimerCancel("", "pg", T),
        TimerCancel("x" * 129, "pg", T),
        TimerCancel(ID, "", T),
        TimerCancel(ID, "pg", -1),
        TimerCancel("a\x00", None, T),
    ],
    ids=repr,
)
def test_a_cancel_a_producer_could_not_write_is_malformed(cancel):
    with pytest.raises(MalformedRecordError, match="timer cancel: "):
        decode_timer_cancel(None, encode(cancel))


@pytest.mark.parametrize("data", [None, b"", b"\x00", bytes([MAGIC, 10, 1]) + b"\xff\xff"])
def test_garbage_on_the_cancel_topic_is_malformed(data):
    with pytest.raises(MalformedRecordError):
        decode_timer_cancel(None, data)


# -- arithmetic ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("remaining_ms", "level"),
    [
        (-5, 0),
        (0, 0),
        (999, 0),
        (1000, 1),
        (1999, 1),
        (2000, 2),
        (3999, 2),
        (4000, 3),
        (60_000, 6),
        (DEFAULT_MAX_DELAY_MS, 18),
    ],
)
def test_level_for_holds_a_record_no_longer_than_it_has_left(remaining_ms, level):
    assert level_for(remaining_ms) == level
    if level:
        assert hold_ms(level) <= remaining_ms < 2 * hold_ms(level)


def test_max_level_is_18_for_three_days_and_hold_doubles():
    assert max_level(DEFAULT_MAX_DELAY_MS) == 18
    assert max_level(1000) == 1 and max_level(2**20 * 1000) == 21
    assert [hold_ms(level) for level in (1, 2, 3, 18)] == [1000, 2000, 4000, 2**17 * 1000]
    with pytest.raises(ConfigError):
        hold_ms(0)
    with pytest.raises(ConfigError):
        max_level(999)


def test_the_timer_partition_is_javas_murmur2_of_the_id():
    assert timer_partition(ID, 8) == java_partition(ID.encode(), 8)
    assert {timer_partition(f"{i:032x}", 8) for i in range(200)} == set(range(8))


def test_rocketmq4s_delay_table_and_its_text_form():
    assert len(ROCKETMQ4_DELAY_LEVELS_MS) == 18
    assert ROCKETMQ4_DELAY_LEVELS_MS[:4] == (1000, 5000, 10_000, 30_000)
    assert ROCKETMQ4_DELAY_LEVELS_MS[-1] == 2 * 3600 * 1000
    assert parse_delay_levels(format_delay_levels(ROCKETMQ4_DELAY_LEVELS_MS)) == (
        ROCKETMQ4_DELAY_LEVELS_MS
    )
    assert parse_delay_levels("90s 2d") == (90_000, 2 * 86_400_000)


@pytest.mark.parametrize("text", ["", "  ", "5", "1x", "-1s", "1.5m", "s", "1s,2s"])
def test_a_bad_delay_table_is_a_config_error_naming_it(text):
    with pytest.raises(ConfigError, match="delay_levels"):
        parse_delay_levels(text)


@pytest.mark.parametrize("bad", ["", "x" * 129, "a b\n", "é", 5, None])
def test_valid_timer_id_refuses_what_no_send_returned(bad):
    with pytest.raises(ConfigError, match="message id"):
        valid_timer_id(bad)


# -- topics -------------------------------------------------------------------------------
def test_timer_topic_names_come_from_the_prefix_and_are_system_topics():
    topics = SystemTopics("acme")
    names = [topics.timer, topics.timer_level(1), topics.timer_level(18), topics.timer_cancel]
    assert names == ["acme_timer", "acme_timer_1", "acme_timer_18", "acme_timer_cancel"]
    assert all(is_system_topic(n, "acme") for n in names)


def test_timer_topic_specs_are_co_partitioned_and_levels_use_log_append_time():
    topics = SystemTopics()
    specs = timer_topic_specs(topics, 8, DEFAULT_MAX_DELAY_MS)
    assert len(specs) == 2 + 18 and {p for p, _ in specs.values()} == {8}
    assert specs[topics.timer_level(18)][1]["message.timestamp.type"] == "LogAppendTime"
    assert "message.timestamp.type" not in specs[topics.timer][1]
    week = str(7 * 24 * 3600 * 1000)
    assert {c["retention.ms"] for _, c in specs.values()} == {week}
    client = timer_topic_specs(topics, 4, 30 * 86_400_000, levels=False)
    assert set(client) == {topics.timer, topics.timer_cancel}
    assert client[topics.timer][1]["retention.ms"] == str(60 * 86_400_000)


# -- isolation: no consumer class and not the Spark job reads a timer topic ----------------
def _timer_topics(prefix: str) -> list[str]:
    topics = SystemTopics(prefix)
    return [topics.timer, topics.timer_level(1), topics.timer_level(18), topics.timer_cancel]


@pytest.mark.parametrize("prefix", ["__rmq", "acme"])
def test_the_consumers_partition_filter_leaves_every_timer_topic_out(prefix):
    system = SystemPartitionFilter(prefix, "test")
    system.name([f"{prefix}_biz", *_timer_topics(prefix)])  # named: still not readable
    offered = [TopicPartition(t, 0) for t in (f"{prefix}biz", *_timer_topics(prefix))]
    assert [tp.topic for tp in system.keep(offered)] == [f"{prefix}biz"]
    assert system.skipped_partitions == 4


@pytest.mark.parametrize("topic", _timer_topics("__rmq"))
def test_a_timer_topic_is_refused_by_name_to_consumers_and_producers(topic):
    with pytest.raises(SystemTopicError):
        refuse_system_topics([topic], "__rmq")
    with pytest.raises(SystemTopicError):
        refuse_system_destination(topic, "__rmq")


@pytest.mark.parametrize(
    "topics",
    [*_timer_topics("__rmq"), "orders,__rmq_timer_cancel", "^__rmq_timer.*", "^.*_timer_[0-9]+$"],
)
def test_the_spark_guard_refuses_timer_topics_and_patterns_that_reach_them(topics):
    with pytest.raises(SystemTopicError):
        guard_subscription(topics)


def test_the_spark_jobs_java_probe_names_the_timer_topics():
    probes = set(_probe_names("acme"))
    assert set(_timer_topics("acme")[:2]) <= probes and "acme_timer_cancel" in probes


@given(
    st.integers(0, 2**45),
    st.integers(0, 10**7),
    st.integers(1000, 30 * 86_400_000),
)
def test_a_cancels_window_spans_two_maximum_delays_and_moves_in_64_steps(ts, later, max_delay):
    """The window a producer and the coordinators count a cancel in (issue 44, item 9)."""
    keep = 2 * max_delay
    start = cancel_window_start(ts, max_delay)
    assert ts - keep - max(1000, keep // 64) < start <= ts - keep
    assert cancel_window_start(ts + later, max_delay) >= start  # never moves back
