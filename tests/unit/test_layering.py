"""The house's import rules, read from the code: imports point down, pure cores import no Kafka.

- No module of the client library (``rmq_semantics/``) imports the sidecar (``coordinator``)
  or the Spark job (``spark``); only the CLI and ``rmq_semantics/tools/`` may, and only lazily
  (inside a function), so ``import rmq_semantics`` never loads them.
- The protocol cores import no ``confluent_kafka``, not even through another module: they
  take records and a clock and return decisions, and are tested without a broker.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "rmq_semantics"
UPPER = ("coordinator", "spark")
# May import the sidecar and the Spark job, lazily.
LAZY_ALLOWED = ("rmq_semantics/cli.py", "rmq_semantics/tools/")
PURE_CORES = [
    "rmq_semantics.records",
    "rmq_semantics.records.codec",
    "rmq_semantics.records.headers",
    "rmq_semantics.records.half",
    "rmq_semantics.records.txn",
    "rmq_semantics.records.locks",
    "coordinator.state",
    "coordinator.lock",
    "rmq_semantics.orderly.queue",
    "coordinator.horizon",
    "rmq_semantics.records.reappend",
    "rmq_semantics.orderly.offsets",
    "rmq_semantics.orderly.keys",
    "rmq_semantics.multi",
    "rmq_semantics.transaction_api",
]


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(module imported, at top level?) for every import statement of a file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    top_level = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) in top_level) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, id(node) in top_level))
    return found


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_the_client_library_never_imports_the_sidecar_or_the_spark_job():
    offenders = []
    for path in sorted(LIBRARY.rglob("*.py")):
        rel = _rel(path)
        lazy_ok = rel.startswith(LAZY_ALLOWED)
        for module, top_level in _imports(path):
            if module.split(".")[0] in UPPER and (top_level or not lazy_ok):
                offenders.append(
                    f"{rel} imports {module}" + (" at module level" if lazy_ok else "")
                )
    assert offenders == []


@pytest.mark.parametrize("module", ["rmq_semantics", "rmq_semantics.cli"])
def test_importing_the_library_loads_neither_sidecar_nor_spark(module):
    code = (
        f"import sys, {module}; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in {'coordinator', 'spark'}))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


def _module_file(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _kafka_path(module: str) -> list[str] | None:
    """The chain of module-level imports from ``module`` to confluent_kafka, if there is one.

    Only what a module imports itself counts (not its parent package's ``__init__``, which
    re-exports the whole public API); imports inside functions and TYPE_CHECKING blocks are
    not loaded when the module is.
    """
    seen: set[str] = set()
    stack = [(module, [module])]
    while stack:
        name, chain = stack.pop()
        if name.split(".")[0] == "confluent_kafka":
            return chain
        path = _module_file(name)
        if path is None or name in seen:
            continue
        seen.add(name)
        for imported, top_level in _imports(path):
            if top_level:
                stack.append((imported, [*chain, imported]))
    return None


@pytest.mark.parametrize("module", PURE_CORES)
def test_pure_core_imports_no_kafka_client_even_indirectly(module):
    assert _module_file(module) is not None, f"{module} is gone: update PURE_CORES"
    assert _kafka_path(module) is None, " -> ".join(_kafka_path(module) or [])


FILE_LIMIT, CLASS_LIMIT = 500, 300
# A file or class may be larger only when its opening docstring says why, in these words.
SIZE_REASON = "lines because"


def _product_files() -> list[Path]:
    return sorted(
        p for d in ("rmq_semantics", "coordinator", "spark") for p in (ROOT / d).rglob("*.py")
    )


def test_no_product_file_or_class_is_too_large_without_saying_why():
    too_large = []
    for path in _product_files():
        text = path.read_text()
        tree = ast.parse(text)
        lines = text.count("\n")
        if lines > FILE_LIMIT and SIZE_REASON not in (ast.get_docstring(tree) or ""):
            too_large.append(f"{_rel(path)}: {lines} lines")
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                size = node.end_lineno - node.lineno + 1
                if size > CLASS_LIMIT and SIZE_REASON not in (ast.get_docstring(node) or ""):
                    too_large.append(f"{_rel(path)}: class {node.name} has {size} lines")
    assert too_large == []
