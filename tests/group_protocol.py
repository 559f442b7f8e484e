"""The consumer group protocol of the user-facing consumers in a test session."""

from __future__ import annotations

import os

# The consumer group protocol the user-facing consumers run under in this session: classic
# (the default) or consumer (KIP-848, Kafka >= 4.0; `make test-group-protocol`).
GROUP_PROTOCOL = os.environ.get("RMQ_TEST_GROUP_PROTOCOL", "classic")
# librdkafka refuses these under group.protocol=consumer: the broker owns them there.
CLASSIC_ONLY = ("session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy")


def group_conf(conf: dict) -> dict:
    """A user consumer's ``conf`` under this session's group protocol."""
    if GROUP_PROTOCOL == "classic":
        return conf
    return {
        **{k: v for k, v in conf.items() if k not in CLASSIC_ONLY},
        "group.protocol": GROUP_PROTOCOL,
    }
