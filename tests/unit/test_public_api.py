"""The public surface: every exported name is documented; settings and records behave."""

from __future__ import annotations

import pytest

import rmq_semantics
from coordinator.settings import CoordinatorSettings
from rmq_semantics import ConfigError, LocalTransactionState, MalformedRecordError, Message
from rmq_semantics.records.codec import decode, encode
from rmq_semantics.records.txn import DoneMarker
from rmq_semantics.settings import load


def test_every_public_name_has_a_docstring():
    missing = [
        n
        for n in rmq_semantics.__all__
        if not isinstance(getattr(rmq_semantics, n), str)
        and not (getattr(rmq_semantics, n).__doc__ or "").strip()
    ]
    assert missing == []


def test_unknow_is_rocketmqs_spelling_with_an_alias():
    assert LocalTransactionState.UNKNOWN is LocalTransactionState.UNKNOW


def test_settings_come_from_kwargs_then_env_then_defaults():
    s = load(
        CoordinatorSettings,
        {"check_max": 3},
        env={"RMQ_CHECK_MAX": "9", "RMQ_CHECK_INTERVAL_MS": "500"},
    )
    assert (s.check_max, s.check_interval_ms, s.lock_lease_ms) == (3, 500, 60000)


@pytest.mark.parametrize(
    "values, message",
    [
        ({"lock_renew_ms": 70000}, "0 < lock_renew_ms < lock_lease_ms"),
        ({"check_max": 0}, "check_max must be a positive int, got 0"),
        ({"check_max": "x"}, "check_max='x'"),
        ({"topic_prefix": "bad prefix"}, "topic_prefix='bad prefix'"),
        ({"no_such": 1}, "unknown setting"),
    ],
)
def test_bad_settings_name_the_field_and_value(values, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load(CoordinatorSettings, values, env={})


def test_message_rejects_reserved_headers_and_bad_types():
    with pytest.raises(ConfigError, match="reserved"):
        Message("t", b"v", headers={"rmq.txn_id": "x"})
    with pytest.raises(ConfigError, match=r"Message\.value"):
        Message("t", 42)


def test_system_records_round_trip_and_garbage_is_malformed():
    body = {"half_offset": 3, "txn_id": "t", "outcome": "COMMITTED", "checks_answered": 0, "ts": 1}
    assert decode(encode(DoneMarker.from_body(body))).to_body() == body
    for junk in (b"", b"\x00garbage", bytes([0xA7, 2, 1]) + b"\xff\xff", bytes([0xA7, 2, 99, 0])):
        with pytest.raises(MalformedRecordError):
            decode(junk)


def test_the_simple_consumer_is_public():
    from rmq_semantics import errors
    from rmq_semantics.settings import SimpleConsumerSettings
    from rmq_semantics.simple import consumer

    for name in ("SimpleConsumer", "MessageView", "FilterExpression", "FilterType"):
        assert name in rmq_semantics.__all__
        assert getattr(rmq_semantics, name) is getattr(consumer, name)
    assert rmq_semantics.SimpleConsumerSettings is SimpleConsumerSettings
    assert rmq_semantics.ReceiptError is errors.ReceiptError
