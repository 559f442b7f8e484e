"""Options for Spark's Kafka source, from librdkafka-style settings. Pure: no Spark, no Kafka.

The coordinator and the clients take librdkafka settings (``security.protocol``,
``sasl.*``, ``ssl.*``); Spark's source wants the Java client's as ``kafka.*`` options. The
job's guarantees (``read_committed``, headers, the guarded subscription) are fixed here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rmq_semantics.errors import ConfigError
from rmq_semantics.settings import kafka_env_conf

__all__ = [
    "FIXED_OPTIONS",
    "cli_source_options",
    "is_security_key",
    "source_options",
    "spark_kafka_options",
]

#: Source options that carry the job's guarantees (lower-cased); callers may not change them.
FIXED_OPTIONS = frozenset(
    {
        "subscribe",
        "subscribepattern",
        "assign",
        "kafka.bootstrap.servers",
        "includeheaders",
        "kafka.isolation.level",
    }
)
_DEFAULTS = {
    "kafka.isolation.level": "read_committed",
    "includeHeaders": "true",
    "startingOffsets": "earliest",
    "failOnDataLoss": "false",
}
_JAAS_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
# librdkafka security settings with a same-named Java client setting.
_SAME_NAME = ("ssl.endpoint.identification.algorithm", "ssl.key.password")


def is_security_key(key: str) -> bool:
    """Whether ``key`` is a librdkafka security setting (translated, never passed as is)."""
    return key == "security.protocol" or key.startswith(("sasl.", "ssl."))


def source_options(kafka_options: Mapping[str, Any] | None) -> dict[str, str]:
    """The Kafka source's options: the job's defaults, then ``kafka_options`` (as strings).

    A caller's option may override a default (``startingOffsets``) but not one in
    :data:`FIXED_OPTIONS`: that raises :class:`ConfigError`.
    """
    options = dict(_DEFAULTS)
    fixed = {k.lower(): v for k, v in _DEFAULTS.items()}
    for key, value in (kafka_options or {}).items():
        value = str(value)
        if key.lower() in FIXED_OPTIONS and fixed.get(key.lower()) != value:
            raise ConfigError(
                f"kafka_options: {key}={value!r} is set by the job and cannot be "
                "changed (read_committed, headers and the guarded subscription "
                "are what make it read promoted records only)"
            )
        options[key] = value
    return options


def _jaas_quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def spark_kafka_options(conf: Mapping[str, Any]) -> dict[str, str]:
    """Spark Kafka source options (``kafka.*``) for the security settings of a librdkafka
    conf, so the job reads with the same settings as the coordinator and the clients.

    ``security.protocol`` -> ``kafka.security.protocol``; ``sasl.mechanisms`` (or
    ``sasl.mechanism``) -> ``kafka.sasl.mechanism``; ``sasl.username`` + ``sasl.password`` ->
    ``kafka.sasl.jaas.config`` (``PlainLoginModule`` for PLAIN, ``ScramLoginModule`` for
    SCRAM-SHA-*); ``ssl.ca.location`` / ``ssl.ca.pem`` -> a PEM truststore. Settings that are
    not about security (``bootstrap.servers``, tuning) are ignored; a security setting with no
    Java equivalent here raises :class:`ConfigError` naming it (pass ``kafka.*`` instead).
    """
    out: dict[str, str] = {}
    sec = {k: str(v) for k, v in conf.items() if is_security_key(k)}
    if "security.protocol" in sec:
        out["kafka.security.protocol"] = sec.pop("security.protocol").upper()
    mechanism = (
        sec.pop("sasl.mechanisms", None)
        or sec.pop("sasl.mechanism", None)
        or ("PLAIN" if "sasl.username" in sec else None)
    )
    sec.pop("sasl.mechanism", None)
    if mechanism is not None:
        out["kafka.sasl.mechanism"] = mechanism.upper()
    user, password = sec.pop("sasl.username", None), sec.pop("sasl.password", None)
    if (user is None) != (password is None):
        raise ConfigError(
            "sasl.username and sasl.password go together; got only "
            f"{'sasl.username' if user is not None else 'sasl.password'}"
        )
    if user is not None and password is not None:
        module = _JAAS_MODULES.get((mechanism or "").upper())
        if module is None:
            raise ConfigError(
                f"sasl.mechanisms={mechanism!r}: only "
                f"{', '.join(_JAAS_MODULES)} map to a Spark JAAS config; pass "
                "kafka.sasl.jaas.config yourself"
            )
        out["kafka.sasl.jaas.config"] = (
            f"{module} required username={_jaas_quote(user)} password={_jaas_quote(password)};"
        )
    if "ssl.ca.location" in sec:
        out["kafka.ssl.truststore.type"] = "PEM"
        out["kafka.ssl.truststore.location"] = sec.pop("ssl.ca.location")
    elif "ssl.ca.pem" in sec:
        out["kafka.ssl.truststore.type"] = "PEM"
        out["kafka.ssl.truststore.certificates"] = sec.pop("ssl.ca.pem")
    for key in _SAME_NAME:
        if key in sec:
            value = sec.pop(key)
            # librdkafka says "none" where Java wants an empty string.
            out[f"kafka.{key}"] = "" if value == "none" else value
    if sec:
        raise ConfigError(
            f"Kafka setting(s) {sorted(sec)} have no Spark Kafka source "
            "equivalent here; pass the Java client's kafka.* option instead "
            "(e.g. --kafka-option kafka.ssl.keystore.location=...)"
        )
    return out


def cli_source_options(
    pairs: Iterable[tuple[str, str]], env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Source options from ``--kafka-option KEY=VALUE`` pairs: librdkafka-style security
    settings (as the coordinator takes them, also from ``RMQ_KAFKA_*`` env vars; a flag
    wins) are translated with :func:`spark_kafka_options`; everything else is a Spark
    source option and wins over the translation."""
    librdkafka = {k: v for k, v in kafka_env_conf(env).items() if is_security_key(k)}
    source: dict[str, str] = {}
    for key, value in pairs:
        if is_security_key(key):
            librdkafka[key] = value
        else:
            source[key] = value
    return {**spark_kafka_options(librdkafka), **source}
