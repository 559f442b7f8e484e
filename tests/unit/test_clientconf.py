"""The one client-conf builder: what each kind of client the product makes gets from a user's
conf (no broker needed: librdkafka checks settings when a client is constructed)."""

from __future__ import annotations

import confluent_kafka
import pytest

from rmq_semantics.checks import CheckResponder
from rmq_semantics.clientconf import client_conf, new_client, shared_conf
from rmq_semantics.errors import ConfigError
from rmq_semantics.lock_client import LockClient
from rmq_semantics.orderly.consumer import consumer_conf
from rmq_semantics.producer import (
    BATCH_LINGER_MS,
    CALL_LINGER_MS,
    CallProducer,
    given_linger_ms,
    producer_defaults,
)
from rmq_semantics.topics import SystemTopics


def oauth_cb(_config: str) -> tuple[str, float]:
    return "token", 0.0


USER = {
    "bootstrap.servers": "b:9092",
    "security.protocol": "SASL_SSL",
    "sasl.mechanisms": "OAUTHBEARER",
    "oauth_cb": oauth_cb,
    "enable.ssl.certificate.verification": False,
    "ssl.ca.location": "/ca.pem",
    "linger.ms": 50,
    "group.id": "billing",
    "client.id": "svc",
}
SECURITY = {
    k: USER[k]
    for k in (
        "bootstrap.servers",
        "security.protocol",
        "sasl.mechanisms",
        "oauth_cb",
        "enable.ssl.certificate.verification",
        "ssl.ca.location",
        "client.id",
    )
}


def without_logger(conf: dict) -> dict:
    return {k: v for k, v in conf.items() if k != "logger"}


def test_internal_clients_get_every_security_key_and_none_of_the_tuning():
    assert without_logger(shared_conf(USER)) == SECURITY
    assert without_logger(client_conf(USER, internal=True)) == SECURITY


def test_every_internal_client_the_product_builds_gets_the_security_keys():
    lock = LockClient(USER)._conf
    checks = CheckResponder(
        USER, SystemTopics("__rmq"), "pg", instance_id="i1", ask=print, reply=print
    )._conf
    dlq = producer_defaults(USER, internal=True)
    for conf in (lock, checks, dlq):
        assert {k: conf[k] for k in SECURITY} == SECURITY
        assert conf.get("linger.ms") != USER["linger.ms"]  # the user's tuning stays out
        assert conf["logger"].name == "rmq_semantics.librdkafka"
    assert dlq["linger.ms"] == BATCH_LINGER_MS  # set, not left to the client's default


def test_a_producers_linger_is_set_and_the_users_own_wins_under_either_name():
    assert producer_defaults({"bootstrap.servers": "b"})["linger.ms"] == BATCH_LINGER_MS
    assert producer_defaults(USER)["linger.ms"] == 50
    aliased = producer_defaults({"bootstrap.servers": "b", "queue.buffering.max.ms": 7})
    assert "linger.ms" not in aliased and aliased["queue.buffering.max.ms"] == 7
    call = CallProducer({"bootstrap.servers": "b", "linger.ms": BATCH_LINGER_MS}, "t")
    assert call._conf["linger.ms"] == CALL_LINGER_MS
    own = CallProducer({"bootstrap.servers": "b", "queue.buffering.max.ms": 7}, "t", linger_ms=7)
    assert own._conf["linger.ms"] == 7 and "queue.buffering.max.ms" not in own._conf
    assert given_linger_ms({"queue.buffering.max.ms": "7"}) == 7
    assert given_linger_ms({"bootstrap.servers": "b"}) is None


def test_user_facing_clients_keep_the_whole_conf_plus_defaults_the_caller_can_override():
    conf = consumer_conf(USER)
    assert {k: conf[k] for k in USER} == USER
    assert conf["isolation.level"] == "read_committed" and conf["enable.auto.commit"] is False
    assert conf["fetch.queue.backoff.ms"] == 10  # not librdkafka's 1 s stall per full queue
    assert consumer_conf({**USER, "fetch.queue.backoff.ms": 500})["fetch.queue.backoff.ms"] == 500
    assert producer_defaults({**USER, "acks": "1"})["acks"] == "1"
    assert producer_defaults(USER)["enable.idempotence"] is True


def test_forced_settings_win_and_the_callers_dict_is_never_mutated():
    original = dict(USER)
    out = client_conf(USER, defaults={"linger.ms": 5, "acks": "all"}, forced={"group.id": "ours"})
    assert out["linger.ms"] == 50 and out["acks"] == "all" and out["group.id"] == "ours"
    assert original == USER


def test_a_conf_without_bootstrap_names_the_client():
    with pytest.raises(ConfigError, match="LockClient conf must be a dict with 'bootstrap"):
        LockClient({"security.protocol": "SSL"})


def test_a_setting_librdkafka_refuses_is_one_config_error():
    with pytest.raises(ConfigError, match=r"invalid producer conf: .*no\.such\.setting"):
        new_client(
            confluent_kafka.Producer, {"bootstrap.servers": "b:1", "no.such.setting": 1}, "producer"
        )
