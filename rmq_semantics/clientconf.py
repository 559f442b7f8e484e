"""Kafka client confs: the one builder behind every client the product creates.

A user's conf reaches two kinds of client. Clients that stand in for the user's own
(``Producer``, ``Consumer``, the orderly consumer's consumer) get the whole dict plus our
defaults. Internal clients (admin, lock client, DLQ producer, check consumer, the
coordinator's own) get only what connecting needs: bootstrap, client id and every security
setting, so the user's tuning (``linger.ms``, ``group.id``...) never leaks into them.
Either way librdkafka's log lines go to Python logging: the library never writes to stderr.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from confluent_kafka import KafkaException

from rmq_semantics.errors import ConfigError

__all__ = [
    "LIBRDKAFKA_LOGGER",
    "SECURITY_KEYS",
    "client_conf",
    "new_client",
    "self_committing_conf",
    "shared_conf",
]

LIBRDKAFKA_LOGGER = "rmq_semantics.librdkafka"
#: Security settings without the ``sasl.``/``ssl.`` prefix that every client must also get.
SECURITY_KEYS = (
    "security.protocol",
    "enable.ssl.certificate.verification",
    "enable.sasl.oauthbearer.unsecure.jwt",
    "oauth_cb",
    "https.ca.location",
    "https.ca.pem",
)
_SHARED_KEYS = frozenset(("bootstrap.servers", "client.id", *SECURITY_KEYS))
_SHARED_PREFIXES = ("sasl.", "ssl.")

Client = TypeVar("Client")


def _checked(conf: object, who: str) -> Mapping[str, Any]:
    if not isinstance(conf, Mapping) or not conf.get("bootstrap.servers"):
        raise ConfigError(
            f"{who} conf must be a dict with 'bootstrap.servers', got {type(conf).__name__}"
        )
    return conf


def shared_conf(conf: Mapping[str, Any], *, who: str = "client") -> dict[str, Any]:
    """What an internal client takes from a user's conf: bootstrap, client id and all security
    settings (``security.protocol``, ``sasl.*``, ``ssl.*``, ``oauth_cb``...), untouched."""
    out = {
        k: v
        for k, v in _checked(conf, who).items()
        if k in _SHARED_KEYS or k.startswith(_SHARED_PREFIXES)
    }
    out["logger"] = logging.getLogger(LIBRDKAFKA_LOGGER)
    return out


def client_conf(
    conf: Mapping[str, Any],
    *,
    who: str = "client",
    internal: bool = False,
    defaults: Mapping[str, Any] | None = None,
    forced: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A copy of ``conf`` for one client (the caller's dict is never mutated).

    ``internal`` keeps only :func:`shared_conf`'s keys; ``defaults`` apply where the caller
    set nothing; ``forced`` always win (what the client's protocol depends on).
    """
    out = shared_conf(conf, who=who) if internal else dict(_checked(conf, who))
    out.setdefault("logger", logging.getLogger(LIBRDKAFKA_LOGGER))
    for key, value in (defaults or {}).items():
        out.setdefault(key, value)
    out.update(forced or {})
    return out


def self_committing_conf(
    conf: Mapping[str, Any],
    *,
    who: str,
    why: str,
    defaults: Mapping[str, Any] | None = None,
    forced: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The conf of a consumer that commits its own offsets (``why`` says how): auto commit
    must stay off, ``group.id`` is required, and the classic protocol assigns incrementally
    (cooperative-sticky) unless the caller chose a strategy."""
    if isinstance(conf, Mapping) and str(conf.get("enable.auto.commit", "false")).lower() not in (
        "false",
        "0",
    ):
        raise ConfigError(f"enable.auto.commit must be false: {why}")
    out = client_conf(
        conf,
        who=who,
        defaults=defaults,
        forced={"enable.auto.commit": False, "enable.auto.offset.store": False, **(forced or {})},
    )
    if not out.get("group.id"):
        raise ConfigError(f"conf needs 'group.id': the {who} group")
    if out.get("group.protocol", "classic") == "classic":
        out.setdefault("partition.assignment.strategy", "cooperative-sticky")
    return out


def new_client(
    factory: Callable[[dict[str, Any]], Client], conf: dict[str, Any], what: str
) -> Client:
    """``factory(conf)``, with librdkafka's refusal of a setting as one ConfigError."""
    try:
        return factory(conf)
    except KafkaException as exc:
        raise ConfigError(f"invalid {what} conf: {exc.args[0].str()}") from exc
