"""Could a subscription regex reach a topic name that starts with a given text? Pure Python.

Spark's Kafka source matches ``subscribePattern`` with ``java.util.regex`` anywhere in a
topic name (``find``). This module reads the part of Java's regex syntax whose meaning is
plain (literals, ``.``, classes, groups, ``|``, quantifiers, ``^ $ \\A \\z \\Z \\b \\B``,
``\\d \\w \\s``, a leading ``(?i)``) into a small tree, and answers by walking it.
Anything else raises :class:`ConfigError`: a guard must not guess. :mod:`spark.subscription`
asks the JVM the same question again when the job starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn

from rmq_semantics.errors import ConfigError

__all__ = ["Anchor", "Chars", "Group", "Repeat", "TopicRegex", "parse"]

# Java's \d, \w, \s without UNICODE_CHARACTER_CLASS: ASCII only.
_DIGITS = frozenset("0123456789")
_WORD = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_") | _DIGITS
_SPACE = frozenset(" \t\n\x0b\f\r")
_CLASSES = {"d": _DIGITS, "w": _WORD, "s": _SPACE}
# What '.' does not match (no DOTALL): Java's line terminators.
_LINE_ENDS = frozenset("\n\r\u0085\u2028\u2029")
_CONTROL_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f", "a": "\a", "e": "\x1b"}
_ANCHOR_ESCAPES = {"A": "start", "z": "end", "Z": "end", "b": "boundary", "B": "boundary"}
# Characters with a meaning of their own outside a class; escape them to mean themselves.
_SPECIAL = frozenset("\\^$.|?*+()[]{}")


@dataclass(frozen=True)
class Chars:
    """One character out of a set: ``negated`` flips it, ``icase`` ignores ASCII case."""

    chars: frozenset[str]
    negated: bool = False
    icase: bool = False

    def matches(self, ch: str) -> bool:
        variants = {ch, ch.lower(), ch.upper()} if self.icase and ch.isascii() else {ch}
        return bool(variants & self.chars) != self.negated


@dataclass(frozen=True)
class Anchor:
    """A zero-width assertion: ``start`` (``^``, ``\\A``), ``end`` or a word ``boundary``."""

    kind: str


@dataclass(frozen=True)
class Group:
    """``(a|b)`` or ``(?:a|b)``: each alternative is a tuple of nodes."""

    alternatives: tuple[tuple[Node, ...], ...]


@dataclass(frozen=True)
class Repeat:
    """``node{low,high}``; ``high`` None is unbounded (lazy and possessive forms alike)."""

    node: Node
    low: int
    high: int | None


Node = Chars | Anchor | Group | Repeat


@dataclass(frozen=True)
class TopicRegex:
    """A parsed pattern: its top-level alternatives."""

    alternatives: tuple[tuple[Node, ...], ...]

    def is_anchored(self) -> bool:
        """Whether every match must begin at the start of the name."""
        return all(_anchored(alt) for alt in self.alternatives)

    def may_match_name_starting_with(self, start: str) -> bool:
        """Whether some topic name beginning with ``start`` could contain a match.

        Over-approximates (word boundaries are ignored, possessive quantifiers treated as
        greedy): a True may be cautious, a False is certain. Unanchored patterns answer True.
        """
        if not self.is_anchored():
            return True
        seen: set[tuple[tuple[Node, ...], int, bool]] = set()
        return any(_viable(alt, start, True, seen) for alt in self.alternatives)


def parse(pattern: str) -> TopicRegex:
    """Parse ``pattern``; :class:`ConfigError` names any construct outside the subset."""
    return TopicRegex(_Parser(pattern).parse())


def _anchored(items: tuple[Node, ...]) -> bool:
    for node in items:
        if isinstance(node, Anchor):
            if node.kind == "start":
                return True
            if node.kind == "end":
                return False
            continue  # a word boundary consumes nothing: look at what follows
        if isinstance(node, Group):
            return all(_anchored(alt) for alt in node.alternatives)
        if isinstance(node, Repeat) and node.low > 0:
            return _anchored((node.node,))
        return False
    return False


def _viable(
    items: tuple[Node, ...],
    rest: str,
    at_start: bool,
    seen: set[tuple[tuple[Node, ...], int, bool]],
) -> bool:
    """Whether ``items``, matched from here, fit a name whose next characters are ``rest``."""
    if not rest or not items:
        return True  # the start is used up, or a match ended inside it: find() succeeds
    key = (items, len(rest), at_start)
    if key in seen:
        return False  # a loop that consumed nothing opens no new way
    seen.add(key)
    head, tail = items[0], items[1:]
    if isinstance(head, Chars):
        return head.matches(rest[0]) and _viable(tail, rest[1:], False, seen)
    if isinstance(head, Anchor):
        if head.kind == "start":
            return at_start and _viable(tail, rest, at_start, seen)
        if head.kind == "end":
            return False  # the name goes on with ``rest``
        return _viable(tail, rest, at_start, seen)
    if isinstance(head, Group):
        return any(_viable(alt + tail, rest, at_start, seen) for alt in head.alternatives)
    # Counts beyond what ``rest`` can use change nothing but the recursion depth; raising
    # ``high`` to unbounded only widens the answer.
    low = min(head.low, len(rest) + 1)
    high = None if head.high is None or head.high > len(rest) + 1 else head.high
    if low > 0:
        again = Repeat(head.node, low - 1, None if high is None else high - 1)
        return _viable((head.node, again, *tail), rest, at_start, seen)
    if high == 0:
        return _viable(tail, rest, at_start, seen)
    again = Repeat(head.node, 0, None if high is None else high - 1)
    return _viable(tail, rest, at_start, seen) or _viable(
        (head.node, again, *tail), rest, at_start, seen
    )


class _Parser:
    """Recursive descent over the subset; positions in errors count from 0."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.icase = False

    def parse(self) -> tuple[tuple[Node, ...], ...]:
        if self.text.startswith("(?i)"):
            self.icase = True
            self.pos = 4
        alternatives = self.alternation()
        if self.pos < len(self.text):
            self.fail("unbalanced ')'")
        return alternatives

    def fail(self, what: str) -> NoReturn:
        raise ConfigError(f"{what} at position {self.pos}")

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def take(self) -> str:
        ch = self.peek()
        if not ch:
            self.fail("unexpected end")
        self.pos += 1
        return ch

    def alternation(self) -> tuple[tuple[Node, ...], ...]:
        alternatives = [self.sequence()]
        while self.peek() == "|":
            self.pos += 1
            alternatives.append(self.sequence())
        return tuple(alternatives)

    def sequence(self) -> tuple[Node, ...]:
        items: list[Node] = []
        while self.peek() not in ("", "|", ")"):
            items.append(self.quantified(self.atom()))
        return tuple(items)

    def atom(self) -> Node:
        ch = self.take()
        if ch == "(":
            if self.text.startswith("?:", self.pos):
                self.pos += 2
            elif self.peek() == "?":
                self.fail("group construct '(?'")
            alternatives = self.alternation()
            if self.take() != ")":
                self.fail("missing ')'")
            return Group(alternatives)
        if ch == "[":
            return self.char_class()
        if ch == ".":
            return Chars(_LINE_ENDS, negated=True)
        if ch == "^":
            return Anchor("start")
        if ch == "$":
            return Anchor("end")
        if ch == "\\":
            return self.escape()
        if ch in _SPECIAL or not ch.isascii() or not ch.isprintable():
            self.pos -= 1
            self.fail(f"{ch!r} (escape it to mean itself)")
        return self.literal(ch)

    def literal(self, ch: str) -> Chars:
        return Chars(frozenset(ch), icase=self.icase)

    def escape(self) -> Node:
        ch = self.take()
        if ch in _ANCHOR_ESCAPES:
            return Anchor(_ANCHOR_ESCAPES[ch])
        if ch.lower() in _CLASSES:
            return Chars(_CLASSES[ch.lower()], negated=ch.isupper())
        if ch in _CONTROL_ESCAPES:
            return self.literal(_CONTROL_ESCAPES[ch])
        if ch.isascii() and ch.isprintable() and not ch.isalnum():
            return self.literal(ch)  # Java: a backslash before a non-letter quotes it
        self.pos -= 2
        self.fail(f"escape '\\{ch}'")

    def char_class(self) -> Chars:
        negated = self.peek() == "^"
        if negated:
            self.pos += 1
        chars: set[str] = set()
        first = True
        while True:
            ch = self.take()
            if ch == "]" and not first:
                break
            if ch in "[]" or (ch == "&" and self.peek() == "&"):
                self.pos -= 1
                self.fail(f"{ch!r} inside a class (Java reads nested classes and '&&')")
            if ch == "\\":
                chars |= self.class_escape()
            elif ch == "-" and not first and self.peek() != "]":
                self.pos -= 1
                self.fail("'-' inside a class (put it first or last, or use a range)")
            elif self.peek() == "-" and self.text[self.pos + 1 : self.pos + 2] not in ("]", ""):
                self.pos += 1
                end = self.take()
                if end in "\\[]" or end < ch:
                    self.pos -= 1
                    self.fail(f"range {ch}-{end}")
                chars |= {chr(c) for c in range(ord(ch), ord(end) + 1)}
            else:
                chars.add(ch)
            first = False
        return Chars(frozenset(chars), negated=negated, icase=self.icase)

    def class_escape(self) -> frozenset[str]:
        ch = self.take()
        if ch.lower() in _CLASSES and ch.islower():
            return _CLASSES[ch]
        if ch in _CONTROL_ESCAPES:
            return frozenset(_CONTROL_ESCAPES[ch])
        if ch.isascii() and ch.isprintable() and not ch.isalnum():
            return frozenset(ch)
        self.pos -= 2
        self.fail(f"escape '\\{ch}' inside a class")

    def quantified(self, node: Node) -> Node:
        ch = self.peek()
        if ch not in ("*", "+", "?", "{"):
            return node
        if isinstance(node, Anchor):
            self.fail("a quantifier on an anchor")
        self.pos += 1
        if ch == "{":
            low, high = self.counts()
        else:
            low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[ch]
        if self.peek() in ("?", "+"):
            self.pos += 1  # lazy or possessive: the same names, or fewer
        return Repeat(node, low, high)

    def counts(self) -> tuple[int, int | None]:
        end = self.text.find("}", self.pos)
        body = self.text[self.pos : end] if end >= 0 else ""
        low_text, comma, high_text = body.partition(",")
        if not low_text.isdigit() or (high_text and not high_text.isdigit()):
            self.fail("'{' that is not a count {n}, {n,} or {n,m}")
        low = int(low_text)
        high = (int(high_text) if high_text else None) if comma else low
        if high is not None and high < low:
            self.fail(f"count {{{body}}}")
        self.pos = end + 1
        return low, high
