"""docs/promises.md binds each promise to the integration tests that reach it through the
public API: every test it names must exist, and every promise must name at least one."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "docs" / "promises.md"
NAMED = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def _rows() -> list[tuple[str, list[tuple[str, str]]]]:
    rows = []
    for line in TABLE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("promise", "") or set(cells[0]) <= {"-", " "}:
            continue
        rows.append((cells[0], NAMED.findall(cells[2])))
    return rows


def _test_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_")
    }


def test_every_promise_names_tests_and_every_named_test_exists():
    rows = _rows()
    assert len(rows) >= 10, "the promises table lost rows"
    missing, empty = [], [promise for promise, tests in rows if not tests]
    found: dict[str, set[str]] = {}
    for _promise, tests in rows:
        for file, name in tests:
            path = ROOT / file
            if file not in found:
                found[file] = _test_functions(path) if path.exists() else set()
            if name not in found[file]:
                missing.append(f"{file}::{name}")
    assert empty == [], f"promises without tests: {empty}"
    assert missing == [], f"docs/promises.md names tests that do not exist: {missing}"


def test_the_named_tests_are_integration_or_cluster_tests():
    """Unit tests reach no promise on their own: each named test runs against a broker."""
    for _promise, tests in _rows():
        for file, _name in tests:
            assert file.startswith(
                ("tests/integration/", "tests/cluster/", "tests/barrier/", "tests/campaign/")
            ), file
