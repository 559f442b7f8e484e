"""The subscription guard: the Spark job never subscribes to a system topic.

:func:`guard_subscription` decides without Spark (names, and regexes read by
:mod:`spark.topic_regex`), so bad input is refused before a JVM starts. Spark matches a
``subscribePattern`` with ``java.util.regex``; :func:`confirm_with_java` asks that engine
the same questions through the session's py4j gateway when the job starts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rmq_semantics.errors import ConfigError, SystemTopicError
from rmq_semantics.topics import (
    DEFAULT_TOPIC_PREFIX,
    SystemTopics,
    is_readable_system_topic,
    is_system_topic,
)
from spark import topic_regex

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "Subscription",
    "confirm_with_java",
    "guard_subscription",
    "pattern_risk",
    "system_name_starts",
]

# Characters Kafka allows in a topic name, plus the comma of a name list: anything else
# makes the string a regex for ``subscribePattern``.
_NAME_LIST = re.compile(r"[A-Za-z0-9._\-,\s]+")
_SUBSET = (
    "literals, '.', [classes], groups, '|', quantifiers, ^ $ \\A \\z, \\d \\w \\s "
    "and a leading (?i)"
)


@dataclass(frozen=True)
class Subscription:
    """How the Kafka source subscribes: ``option`` is ``subscribe`` or ``subscribePattern``."""

    option: str
    value: str

    @property
    def is_pattern(self) -> bool:
        return self.option == "subscribePattern"


def guard_subscription(
    topics: str | list[str] | tuple[str, ...], topic_prefix: str = DEFAULT_TOPIC_PREFIX
) -> Subscription:
    """Refuse any subscription that could reach a system topic; return how to subscribe.

    ``topics`` is a topic name, a comma-separated list of names, a list of names, or one
    regex (a string that starts with ``^`` or holds characters a topic name cannot).
    Names under ``<topic_prefix>_`` or ``__rmq_`` raise :class:`SystemTopicError`. A regex
    is used with ``subscribePattern``, which Spark matches *anywhere* in a topic name
    (``findFirstIn``); it is refused unless it is anchored with ``^`` and can match no name
    starting with ``__``, ``<prefix>_`` or ``__rmq_`` (which covers every system topic).
    """
    prefix = SystemTopics(topic_prefix).prefix  # validates it
    items = [topics] if isinstance(topics, str) else list(topics)
    if not items or not all(isinstance(t, str) and t.strip() for t in items):
        raise ConfigError(f"topics={topics!r}: give a topic name, a list of names or a regex")
    patterns = [t for t in items if _is_pattern(t)]
    if patterns:
        if len(items) > 1:
            raise ConfigError(
                f"topics={topics!r}: give either one regex or a list of names, not both"
            )
        _refuse_if_risky(patterns[0], prefix, pattern_risk(patterns[0], prefix))
        return Subscription("subscribePattern", patterns[0])
    names = [n for item in items for n in re.split(r"[,\s]+", item) if n]
    for name in names:
        if is_system_topic(name, prefix) and not is_readable_system_topic(name, prefix):
            raise SystemTopicError(
                f"topic {name!r} is a system topic of rmq_semantics; the "
                "Spark job reads only promoted (business) topics, and "
                "DLQ or retry topics named explicitly"
            )
    return Subscription("subscribe", ",".join(dict.fromkeys(names)))


def system_name_starts(prefix: str) -> tuple[str, ...]:
    """How every system topic name begins: Kafka's own, this deployment's, the default's."""
    return tuple(dict.fromkeys(("__", f"{prefix}_", f"{DEFAULT_TOPIC_PREFIX}_")))


def pattern_risk(pattern: str, prefix: str) -> str | None:
    """Why ``pattern`` could match a system topic, or None when it cannot (pure Python)."""
    try:
        parsed = topic_regex.parse(pattern)
    except ConfigError as exc:
        return f"it cannot be checked ({exc}); write it with {_SUBSET}"
    if not parsed.is_anchored():
        return "it is not anchored with '^', and Spark matches it anywhere in a name"
    try:
        for start in system_name_starts(prefix):
            if parsed.may_match_name_starting_with(start):
                return f"it could match a topic name starting with {start!r}"
    except RecursionError:
        return f"it cannot be checked (too deeply nested); write it with {_SUBSET}"
    return None


def confirm_with_java(
    spark: SparkSession, subscription: Subscription, topic_prefix: str = DEFAULT_TOPIC_PREFIX
) -> None:
    """Ask ``java.util.regex``, the engine Spark subscribes with, whether the guarded
    pattern could reach a system topic; raise :class:`SystemTopicError` if so.

    ``Matcher.hitEnd()`` after a failed ``find()`` on a system-name start says whether
    more characters could have produced a match, i.e. whether a longer name could.
    """
    if not subscription.is_pattern:
        return
    prefix = SystemTopics(topic_prefix).prefix
    pattern = subscription.value
    _refuse_if_risky(pattern, prefix, _java_risk(spark, pattern, prefix))


def _java_risk(spark: SparkSession, pattern: str, prefix: str) -> str | None:
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import IllegalArgumentException

    # The py4j gateway of a classic session (the job's kind): Spark's own JVM, same Java.
    jvm = spark.sparkContext._jvm  # noqa: SLF001 (py4j's gateway)
    java_pattern = jvm.java.util.regex.Pattern  # type: ignore[union-attr]  # a classic session's
    try:
        compiled = java_pattern.compile(pattern)
    except (IllegalArgumentException, Py4JJavaError) as exc:  # PatternSyntaxException
        return f"Java cannot compile it ({str(exc).strip().splitlines()[0]})"
    for probe in _probe_names(prefix):
        if compiled.matcher(probe).find():
            return f"Java's regex engine matches {probe!r}"
    for start in system_name_starts(prefix):
        matcher = compiled.matcher(start)
        if matcher.find() or matcher.hitEnd():
            return f"Java's regex engine could match a topic name starting with {start!r}"
    return None


def _probe_names(prefix: str) -> list[str]:
    names = []
    for p in dict.fromkeys((prefix, DEFAULT_TOPIC_PREFIX)):
        t = SystemTopics(p)
        names += [
            t.half,
            t.op,
            t.check,
            t.discard,
            t.lock,
            t.lock_request,
            t.lock_reply,
            t.timer,
            t.timer_level(1),
            t.timer_cancel,
            t.dlq("x"),
        ]
    return [*names, "__consumer_offsets", "__transaction_state"]


def _refuse_if_risky(pattern: str, prefix: str, reason: str | None) -> None:
    if reason:
        raise SystemTopicError(
            f"topic pattern {pattern!r} is refused: {reason}; the Spark job reads only "
            f"promoted topics, never {prefix}_* system topics (anchor it, e.g. '^orders-.*')"
        )


def _is_pattern(topics: str) -> bool:
    return topics.startswith("^") or not _NAME_LIST.fullmatch(topics)
