"""RocketMQ's tag expressions against a record's rmq.tags header."""

from __future__ import annotations

import pytest

from rmq_semantics.errors import ConfigError
from rmq_semantics.records.headers import H
from rmq_semantics.tags import TagFilter


def tagged(tag: str | None) -> list:
    return [("user", b"x")] + ([(H.TAGS, tag.encode())] if tag is not None else [])


@pytest.mark.parametrize("expression", [None, "", "*", "  *  "])
def test_all_keeps_every_record_with_or_without_tags(expression):
    f = TagFilter(expression)
    assert f.keeps_all and f.matches(tagged("TagA")) and f.matches(tagged(None))
    assert f.matches(None)


def test_an_or_expression_keeps_exactly_its_tags():
    f = TagFilter("TagA || TagB")
    assert [f.matches(tagged(t)) for t in ("TagA", "TagB", "TagC", None)] == [
        True,
        True,
        False,
        False,
    ]
    assert f.matches([(H.TAGS, b"TagB")])
    assert not f.matches([(H.TAGS, None)])


@pytest.mark.parametrize("expression", ["TagA ||", "|| TagA", "TagA || * ", 5])
def test_a_malformed_expression_is_one_clear_error(expression):
    with pytest.raises(ConfigError, match="tags"):
        TagFilter(expression)
