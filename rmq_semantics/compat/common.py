"""What both RocketMQ client APIs share: their address strings and credentials as a Kafka
conf, per-topic tag filters over one consumer, and a record's headers read as RocketMQ's
properties. Pure: no Kafka import."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rmq_semantics.errors import ConfigError
from rmq_semantics.records.headers import RESERVED_PREFIX, H
from rmq_semantics.tags import TagFilter

__all__ = [
    "KEY_SEPARATOR",
    "TopicFilters",
    "bootstrap_servers",
    "header_text",
    "kafka_conf",
    "split_keys",
    "user_properties",
]

#: RocketMQ's ``MessageConst.KEY_SEPARATOR``: several keys travel as one space-separated
#: ``rmq.keys`` header, as RocketMQ's ``KEYS`` property carries them.
KEY_SEPARATOR = " "


def bootstrap_servers(addresses: str) -> str:
    """RocketMQ's address list (``host:port;host:port``, each maybe ``http://``-prefixed) as
    Kafka's ``bootstrap.servers`` (``host:port,host:port``)."""
    if not isinstance(addresses, str):
        raise ConfigError(f"the address list must be a str, got {addresses!r}")
    hosts = []
    for part in addresses.replace(",", ";").split(";"):
        host = part.strip().removeprefix("http://").removeprefix("https://").rstrip("/")
        if host:
            hosts.append(host)
    if not hosts:
        raise ConfigError(
            f"the address list {addresses!r} names no broker: give the Kafka bootstrap "
            "servers, e.g. '127.0.0.1:9092' (several separated by ';')"
        )
    return ",".join(hosts)


def kafka_conf(
    addresses: str,
    *,
    username: str | None = None,
    password: str | None = None,
    tls: bool = False,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The confluent-kafka conf of a RocketMQ client: its addresses as the bootstrap list, an
    access key and secret as SASL/PLAIN user and password (over TLS with ``tls``), then
    ``extra`` (any librdkafka setting, e.g. ``sasl.mechanisms``), which wins."""
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap_servers(addresses)}
    if username:
        conf.update(
            {
                "security.protocol": "SASL_SSL" if tls else "SASL_PLAINTEXT",
                "sasl.mechanisms": "PLAIN",
                "sasl.username": username,
                "sasl.password": password or "",
            }
        )
    elif tls:
        conf["security.protocol"] = "SSL"
    conf.update(dict(extra or {}))
    return conf


def header_text(headers: Iterable[tuple[str, bytes | None]], name: str) -> str | None:
    """The last value of header ``name`` as text (None when absent)."""
    value = None
    for key, raw in headers:
        if key == name and raw is not None:
            value = raw
    return None if value is None else value.decode("utf-8", "replace")


def user_properties(headers: Iterable[tuple[str, bytes | None]]) -> dict[str, str]:
    """A record's own headers (the product's ``rmq.*`` left out) as RocketMQ's string
    properties."""
    return {
        k: (v or b"").decode("utf-8", "replace")
        for k, v in headers
        if not k.startswith(RESERVED_PREFIX)
    }


def split_keys(headers: Iterable[tuple[str, bytes | None]]) -> list[str]:
    """The message keys of a record (its ``rmq.keys``, space-separated)."""
    text = header_text(headers, H.KEYS)
    return [] if not text else [k for k in text.split(KEY_SEPARATOR) if k]


class TopicFilters:
    """One tag expression per topic, over a consumer that takes one for all its topics: the
    consumer is given the common expression when every topic has the same one, else all
    records, and :meth:`keeps` drops the rest (acknowledged, as RocketMQ's broker-side filter
    never delivers them)."""

    def __init__(self) -> None:
        self.filters: dict[str, TagFilter] = {}

    def add(self, topic: str, expression: str | None) -> None:
        if not isinstance(topic, str) or not topic:
            raise ConfigError(f"a subscription topic must be a non-empty str, got {topic!r}")
        self.filters[topic] = TagFilter(expression)

    def remove(self, topic: str) -> None:
        self.filters.pop(topic, None)

    @property
    def topics(self) -> list[str]:
        return sorted(self.filters)

    def common(self) -> str | None:
        """The one expression every topic has, or None (all records) when they differ."""
        expressions = {f.expression for f in self.filters.values()}
        return expressions.pop() if len(expressions) == 1 else None

    def keeps(self, topic: str, headers: Iterable[tuple[str, bytes | None]]) -> bool:
        found = self.filters.get(topic)
        return found is None or found.matches(headers)
