"""What ``--help`` prints is plain text: no reStructuredText markup from the docstrings and
settings help it is derived from, on every parser (``rmq-semantics``, each subcommand, nested
ones; ``python -m coordinator`` is ``rmq-semantics coordinator``)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

import pytest

from rmq_semantics.cli import build_parser
from rmq_semantics.helptext import docstring_summary, plain_text

MARKUP = {
    "double backticks": re.compile(r"``"),
    "a role": re.compile(r":[\w.+-]+:`"),
    "strong": re.compile(r"(?<![\w*])\*\*\S"),
    # *word* opened after a space or bracket (``sasl.*``, a glob, is not emphasis).
    "emphasis": re.compile(r"(?:^|[\s(\[\"'])\*[^\s*](?:[^*]*?[^\s*])?\*(?![\w*])"),
    "interpreted text": re.compile(r"(?<![\w`:])`[^`\s][^`]*`"),
}


def parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...]
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield " ".join(path), parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from parsers(sub, (*path, name))


def markup_in(text: str) -> list[str]:
    return [
        f"{kind}: {line.strip()}"
        for line in text.splitlines()
        for kind, pattern in MARKUP.items()
        if pattern.search(line)
    ]


def markup_in_help(root: argparse.ArgumentParser, prog: str) -> list[str]:
    return [
        f"{path} --help: {found}"
        for path, parser in parsers(root, (prog,))
        for found in markup_in(parser.format_help())
    ]


def test_every_parser_is_walked():
    paths = {path for path, _ in parsers(build_parser(), ("rmq-semantics",))}
    assert {
        "rmq-semantics",
        "rmq-semantics coordinator",
        "rmq-semantics kafka start",
        "rmq-semantics spark",
        "rmq-semantics tenant acls",
        "rmq-semantics txn pending",
        "rmq-semantics dlq list",
    } <= paths


def test_no_help_shows_restructuredtext_markup(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("COLUMNS", "100")  # the width the docs' CLI reference uses
    assert markup_in_help(build_parser(), "rmq-semantics") == []


def test_the_check_finds_markup_planted_in_a_help():
    root = argparse.ArgumentParser(prog="planted", description="plain")
    sub = root.add_subparsers().add_parser("nested", help="plain")
    sub.add_argument("--x", help="see :class:`TransactionProducer`, ``--y`` and *never*")
    found = markup_in_help(root, "planted")
    assert [f.split(":")[1].strip() for f in found] == ["double backticks", "a role", "emphasis"]
    assert all(f.startswith("planted nested --help") for f in found)


def test_globs_and_arithmetic_are_not_markup():
    assert markup_in("security settings (sasl.*, ssl.*) pass through; 2*3*4 and a * b") == []


@pytest.mark.parametrize(
    "rst, plain",
    [
        ("``rmq-semantics``: the command line", "rmq-semantics: the command line"),
        (":class:`~rmq_semantics.TransactionProducer`", "TransactionProducer"),
        (":meth:`TransactionProducer.send`", "TransactionProducer.send"),
        (":func:`load <rmq_semantics.settings.load>`", "load"),
        ("*never* twice, **always** once", "never twice, always once"),
        ("`interpreted`_ text", "interpreted text"),
        ("sasl.*, ssl.* and 2*3*4", "sasl.*, ssl.* and 2*3*4"),
    ],
)
def test_plain_text_drops_inline_markup(rst: str, plain: str):
    assert plain_text(rst) == plain
    assert markup_in(plain_text(rst)) == []


def test_a_docstrings_summary_is_its_first_paragraph_on_one_line():
    doc = """``tool``: does
    one thing.

    More on :func:`it`.
    """
    assert docstring_summary(doc) == "tool: does one thing."
