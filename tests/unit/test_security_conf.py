"""Security settings reach every client untouched; the Spark source gets their Java form."""

from __future__ import annotations

import argparse

import pytest

from rmq_semantics import AuthenticationError, KafkaOperationError, RmqError
from rmq_semantics.clientconf import shared_conf
from rmq_semantics.errors import ConfigError
from rmq_semantics.settings import kafka_conf_from_args
from spark.kafka_options import cli_source_options, spark_kafka_options

SASL = {
    "bootstrap.servers": "b:9092",
    "security.protocol": "SASL_SSL",
    "sasl.mechanisms": "PLAIN",
    "sasl.username": "alice",
    "sasl.password": "s3cret",
    "ssl.ca.location": "/etc/ca.pem",
    "enable.ssl.certificate.verification": "true",
}


def test_internal_clients_keep_every_security_setting_and_drop_tuning():
    conf = shared_conf({**SASL, "linger.ms": 5, "group.id": "g", "client.id": "me"})
    assert {k: v for k, v in conf.items() if k != "logger"} == {**SASL, "client.id": "me"}


def test_cli_conf_takes_env_then_flags_then_bootstrap(monkeypatch):
    monkeypatch.setenv("RMQ_KAFKA_SASL_PASSWORD", "from-env")
    monkeypatch.setenv("RMQ_KAFKA_SASL_USERNAME", "env-user")
    monkeypatch.setenv("RMQ_KAFKA_BOOTSTRAP_SERVERS", "ignored:1")
    args = argparse.Namespace(
        bootstrap_servers="b:9092",
        kafka_option=[
            "security.protocol=SASL_PLAINTEXT",
            "sasl.username=flag-user",
            "sasl.password=a=b",
        ],
    )
    conf = kafka_conf_from_args(args)
    assert conf["bootstrap.servers"] == "b:9092"
    assert conf["sasl.username"] == "flag-user"  # a flag wins over the environment
    assert conf["sasl.password"] == "a=b"  # only the first '=' splits
    assert conf["security.protocol"] == "SASL_PLAINTEXT"


def test_cli_conf_refuses_an_option_without_value(monkeypatch):
    with pytest.raises(ConfigError, match="want KEY=VALUE"):
        kafka_conf_from_args(argparse.Namespace(bootstrap_servers="b", kafka_option=["oops"]))


def test_spark_options_from_librdkafka_sasl_plain():
    options = spark_kafka_options(SASL)
    assert options == {
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "PLAIN",
        "kafka.sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule "
        'required username="alice" password="s3cret";',
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": "/etc/ca.pem",
    }  # bootstrap.servers is the job's own argument; Java always verifies certificates


def test_spark_options_quote_jaas_values_and_pick_scram():
    options = spark_kafka_options(
        {
            "security.protocol": "sasl_ssl",
            "sasl.mechanisms": "SCRAM-SHA-512",
            "sasl.username": 'a"b',
            "sasl.password": "c\\d",
        }
    )
    assert options["kafka.security.protocol"] == "SASL_SSL"
    assert options["kafka.sasl.jaas.config"] == (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="a\\"b" password="c\\\\d";'
    )


@pytest.mark.parametrize(
    "conf, message",
    [
        ({"sasl.mechanisms": "GSSAPI", "sasl.username": "u", "sasl.password": "p"}, "GSSAPI"),
        ({"sasl.username": "u"}, "go together"),
        ({"ssl.certificate.location": "/c.pem"}, "ssl.certificate.location"),
    ],
)
def test_spark_options_refuse_what_they_cannot_translate(conf, message):
    with pytest.raises(ConfigError, match=message):
        spark_kafka_options(conf)


def test_spark_cli_translates_security_options_and_env(monkeypatch):
    monkeypatch.setenv("RMQ_KAFKA_SASL_PASSWORD", "pw")
    monkeypatch.setenv("RMQ_KAFKA_CLIENT_ID", "not-a-source-option")
    options = cli_source_options(
        [
            ("security.protocol", "SASL_PLAINTEXT"),
            ("sasl.mechanisms", "PLAIN"),
            ("sasl.username", "u"),
            ("maxOffsetsPerTrigger", "10"),
        ]
    )
    assert options == {
        "kafka.security.protocol": "SASL_PLAINTEXT",
        "kafka.sasl.mechanism": "PLAIN",
        "kafka.sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule "
        'required username="u" password="pw";',
        "maxOffsetsPerTrigger": "10",
    }


def test_authentication_error_is_in_the_family_and_not_retriable():
    assert issubclass(AuthenticationError, KafkaOperationError)
    assert issubclass(AuthenticationError, RmqError)
    assert AuthenticationError("x").retriable is False
    assert AuthenticationError.code == "authentication"
