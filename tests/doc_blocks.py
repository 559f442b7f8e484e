"""The fenced Python blocks of the README and the docs, and the marker each one carries.

Every Python block is either an example that runs or says why it does not, in an HTML
comment on the last non-blank line before its fence (GitHub and the docs site show neither):

- ``<!-- example: examples/NAME.py -->``: the block is that file's text, exactly;
  tests/integration/test_examples.py runs the file against the test broker and checks what
  it did.
- ``<!-- not run: REASON -->``: a fragment, or a block that needs what the test broker lacks
  (a SASL_SSL cluster, a PostgreSQL server, a web framework); the reason says which.

``problems`` lists what breaks that rule; tests/unit/test_doc_blocks.py fails on any.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The test that runs every file under examples/ (it names each one as a string).
EXAMPLES_TEST = ROOT / "tests" / "integration" / "test_examples.py"
# The pages with code a reader may copy: the README, the docs, and the repository's own
# pages the site renders too (docs/_hooks/reference.py).
PAGES = ("README.md", "CONTRIBUTING.md", "CHANGELOG.md", "SECURITY.md", "tests/README.md")
PYTHON = {"python", "py", "python3", "pycon"}

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_MARKER = re.compile(r"^\s*<!--\s*(?P<kind>example|not run):\s*(?P<value>.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced Python block: where it opens (1-based line), its text, its marker."""

    path: Path
    line: int
    text: str
    kind: str | None  # "example", "not run" or None (unmarked)
    value: str  # the example's path, or the reason

    def where(self) -> str:
        shown = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        return f"{shown}:{self.line}"


def markdown_pages(root: Path = ROOT) -> list[Path]:
    """The README, the site's own pages from the repository root, and docs/**/*.md."""
    pages = [root / name for name in PAGES if (root / name).exists()]
    return pages + sorted((root / "docs").rglob("*.md"))


def _language(info: str) -> str:
    """The info string's language: ``python``, ``{.python title="x"}``, ``py title=...``."""
    words = info.strip().lstrip("{").split()
    return words[0].lstrip(".").lower() if words else ""


def python_blocks(path: Path) -> list[Block]:
    """The fenced Python blocks of one Markdown file (fences of other languages skipped)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        end = i + 1
        while end < len(lines) and not closing.match(lines[end]):
            end += 1
        if _language(opening["info"]) in PYTHON:
            body = [
                line[len(indent) :] if line.startswith(indent) else line
                for line in lines[i + 1 : end]
            ]
            before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            marker = _MARKER.match(before)
            blocks.append(
                Block(
                    path=path,
                    line=i + 1,
                    text="\n".join(body) + "\n",
                    kind=marker["kind"] if marker else None,
                    value=marker["value"] if marker else "",
                )
            )
        i = end + 1
    return blocks


def examples_run(test_file: Path = EXAMPLES_TEST) -> set[str]:
    """The ``examples/...`` paths the integration test names (string constants in it)."""
    tree = ast.parse(test_file.read_text(encoding="utf-8"))
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and re.fullmatch(r"examples/[\w/-]+\.py", node.value)
    }


def problems(pages: list[Path], root: Path = ROOT, run: set[str] | None = None) -> list[str]:
    """Each block neither run nor marked, each example block that differs from its file or
    names a file the integration test does not run, and each example file nobody runs."""
    run = examples_run() if run is None else run
    found: list[str] = []
    for page in pages:
        for block in python_blocks(page):
            if block.kind is None:
                found.append(
                    f"{block.where()}: a Python block neither run nor marked: put "
                    f"'<!-- example: examples/NAME.py -->' or '<!-- not run: REASON -->' on "
                    f"the line before its fence (tests/doc_blocks.py)"
                )
            elif block.kind == "not run" and not block.value:
                found.append(f"{block.where()}: 'not run' without a reason")
            elif block.kind == "example":
                found.extend(_example_problems(block, root, run))
    for path in sorted((root / "examples").glob("*.py")):
        name = path.relative_to(root).as_posix()
        if name not in run:
            found.append(f"{name}: not run by {EXAMPLES_TEST.relative_to(ROOT)}")
    return found


def _example_problems(block: Block, root: Path, run: set[str]) -> list[str]:
    source = root / block.value
    if not source.is_file():
        return [f"{block.where()}: names {block.value}, which does not exist"]
    if source.read_text(encoding="utf-8") != block.text:
        return [f"{block.where()}: differs from {block.value} (the block must be its text)"]
    if block.value not in run:
        return [f"{block.where()}: {block.value} is not run by {EXAMPLES_TEST.name}"]
    return []
