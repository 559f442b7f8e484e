"""RocketMQ's tag expressions: ``subscribe(topics, tags="TagA || TagB")`` keeps the records
whose ``rmq.tags`` header is one of the tags; ``"*"``, ``""`` or ``None`` keeps every record
(RocketMQ's ``SubscriptionData.SUB_ALL``). A record without the header matches only "all"."""

from __future__ import annotations

from collections.abc import Iterable

from rmq_semantics.errors import ConfigError
from rmq_semantics.records.headers import H

__all__ = ["ALL", "TagFilter"]

#: The expression that keeps every record.
ALL = "*"


class TagFilter:
    """A parsed tag expression; :meth:`matches` takes a record's headers."""

    __slots__ = ("expression", "tags")

    def __init__(self, expression: str | None = None) -> None:
        if expression is not None and not isinstance(expression, str):
            raise ConfigError(
                f"tags must be a str such as 'TagA || TagB' or '*', got {expression!r}"
            )
        text = (expression or "").strip()
        self.expression = text or ALL
        if self.expression == ALL:
            self.tags: frozenset[bytes] | None = None
            return
        tags = [t.strip() for t in text.split("||")]
        if any(not t for t in tags) or ALL in tags:
            raise ConfigError(f"tags {expression!r}: want tags separated by '||', or '*'")
        self.tags = frozenset(t.encode() for t in tags)

    @property
    def keeps_all(self) -> bool:
        return self.tags is None

    def matches(self, headers: Iterable[tuple[str, bytes | None]] | None) -> bool:
        """Whether a record with these headers is kept."""
        if self.tags is None:
            return True
        for name, value in headers or ():
            if name == H.TAGS:
                return value in self.tags
        return False

    def __repr__(self) -> str:
        return f"TagFilter({self.expression!r})"
