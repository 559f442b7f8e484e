"""Command-line help as plain text: docstrings and settings help are written in
reStructuredText for the API docs, but a terminal shows ``--help`` as it is, so the help the
parsers derive from them goes through :func:`plain_text` first."""

from __future__ import annotations

import re

__all__ = ["docstring_summary", "plain_text"]

# :role:`target` or :role:`title <target>`; a leading ~ shows only the last dotted part.
_ROLE = re.compile(r":[\w.+-]+(?::[\w.+-]+)?:`~?([^`<]*?)\s*(?:<[^`>]*>)?`")
_LITERAL = re.compile(r"``(.+?)``")
_STRONG = re.compile(r"(?<![\w*])\*\*(\S(?:.*?\S)?)\*\*(?![\w*])")
_EMPHASIS = re.compile(r"(?<![\w*.])\*(\S(?:[^*]*?\S)?)\*(?![\w*])")
_INTERPRETED = re.compile(r"(?<![\w`])`([^`]+)`_{0,2}(?![\w`])")


def _role_text(match: re.Match[str]) -> str:
    text = match.group(1)
    # :meth:`~a.B.c` shows as c; :class:`a.B` stays a.B, as Sphinx shows it.
    return text.rsplit(".", 1)[-1] if match.group(0).split("`", 1)[1].startswith("~") else text


def plain_text(text: str) -> str:
    """``text`` without reStructuredText's inline markup: roles, literals, emphasis."""
    text = _ROLE.sub(_role_text, text)
    text = _LITERAL.sub(r"\1", text)
    text = _STRONG.sub(r"\1", text)
    text = _EMPHASIS.sub(r"\1", text)
    return _INTERPRETED.sub(r"\1", text)


def docstring_summary(doc: str | None) -> str:
    """A docstring's first paragraph as one plain line (a parser's description)."""
    first = (doc or "").strip().split("\n\n", 1)[0]
    return plain_text(" ".join(first.split()))
