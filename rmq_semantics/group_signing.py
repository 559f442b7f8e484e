"""The producer side of tenant isolation: the group key from the settings, and a Kafka
producer that signs every half record and end request it writes with it (one place, so no
write path of ``TransactionProducer`` can forget to)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import confluent_kafka

from rmq_semantics.errors import ConfigError
from rmq_semantics.records.group_auth import (
    GroupKey,
    op_canonical,
    sign_half_headers,
)
from rmq_semantics.records.headers import H
from rmq_semantics.settings import OrderlyConsumerSettings, ProducerSettings
from rmq_semantics.topics import SystemTopics

__all__ = ["SignedProducer", "consumer_group_key_of", "group_key_of", "producer_factory"]


def group_key_of(settings: ProducerSettings) -> GroupKey | None:
    """The group key the settings give (``group_key`` or ``group_key_file``), or None."""
    return _key(settings.group_key, settings.group_key_file, "group_key_file")


def consumer_group_key_of(settings: OrderlyConsumerSettings) -> GroupKey | None:
    """The consumer group key the settings give (``consumer_group_key`` or its file)."""
    return _key(
        settings.consumer_group_key, settings.consumer_group_key_file, "consumer_group_key_file"
    )


def _key(key: str, key_file: str, file_setting: str) -> GroupKey | None:
    if key:
        return GroupKey(key.encode())
    if key_file:
        path = Path(key_file)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ConfigError(
                f"{file_setting}={str(path)!r}: cannot read it ({exc.strerror or exc})"
            ) from exc
        return GroupKey(data.strip())
    return None


class SignedProducer(confluent_kafka.Producer):
    """A ``confluent_kafka.Producer`` that adds ``rmq.group_mac`` to what it writes to the
    half and Op topics of ``topics``; every other record passes unchanged."""

    def __init__(self, conf: dict, *, key: GroupKey, topics: SystemTopics) -> None:
        super().__init__(conf)
        self._group_key = key
        self._half, self._op = topics.half, topics.op

    def produce(self, topic: str, value: Any = None, *args: Any, **kwargs: Any) -> None:
        super().produce(topic, value, *args, **self.signed(topic, value, kwargs))

    def signed(self, topic: str, value: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        """``produce``'s keyword arguments with the record's MAC among its headers."""
        kwargs = dict(kwargs)
        if topic == self._half:
            kwargs["headers"] = sign_half_headers(
                self._group_key, kwargs.get("headers") or [], kwargs.get("key"), value
            )
        elif topic == self._op:
            partition = kwargs.get("partition", -1)
            if partition is None or partition < 0:  # the MAC names the partition
                raise ConfigError("an end request must name its Op partition to be signed")
            headers = [(k, v) for k, v in kwargs.get("headers") or [] if k != H.GROUP_MAC]
            mac = self._group_key.mac(op_canonical(topic, partition, value))
            kwargs["headers"] = [*headers, (H.GROUP_MAC, mac)]
        return kwargs


def producer_factory(
    key: GroupKey | None, topics: SystemTopics
) -> Callable[[dict], confluent_kafka.Producer]:
    """How a transactional producer makes its Kafka producers: signing ones with a key."""
    if key is None:
        return confluent_kafka.Producer
    return lambda conf: SignedProducer(conf, key=key, topics=topics)
