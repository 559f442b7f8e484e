"""The house's import rules, read from the code: imports point down, pure cores import no Kafka.

- No module of the client library (``rmq_semantics/``) imports the sidecar (``coordinator``)
  or the Spark job (``spark``); only the CLI and ``rmq_semantics/tools/`` may, and only lazily
  (inside a function), so ``import rmq_semantics`` never loads them.
- Nothing shipped imports the bench (``benchmarks/``, left out of the wheel) but the CLI's
  ``bench`` subcommand, lazily; the bench may import the library and the sidecar.
- The protocol cores import no ``confluent_kafka``, not even through another module: they
  take records and a clock and return decisions, and are tested without a broker.
- No two product modules import each other, directly or round a loop (see :func:`import_graph`
  for what counts as an import).
"""

from __future__ import annotations

import ast
import io
import subprocess
import sys
import textwrap
import tokenize
from collections import deque
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "rmq_semantics"
UPPER = ("coordinator", "spark")
# The product's packages: the library, the sidecar, the Spark job and the bench.
PRODUCT = ("rmq_semantics", "coordinator", "spark", "benchmarks")
# May import the sidecar and the Spark job, lazily.
LAZY_ALLOWED = ("rmq_semantics/cli.py", "rmq_semantics/tools/")
PURE_CORES = [
    "rmq_semantics.records",
    "rmq_semantics.records.codec",
    "rmq_semantics.records.headers",
    "rmq_semantics.records.half",
    "rmq_semantics.records.txn",
    "rmq_semantics.records.locks",
    "rmq_semantics.records.timer",
    "coordinator.state",
    "coordinator.lock",
    "rmq_semantics.orderly.queue",
    "coordinator.horizon",
    "coordinator.timer_wheel",
    "rmq_semantics.records.reappend",
    "rmq_semantics.orderly.offsets",
    "rmq_semantics.orderly.keys",
    "rmq_semantics.simple.engine",
    "rmq_semantics.simple.record_state",
    "rmq_semantics.simple.leases",
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


# The bench's one way in from what is shipped: the CLI's ``bench``, inside a function.
BENCH = "benchmarks"
BENCH_LAZY_ALLOWED = ("rmq_semantics/cli.py",)


def test_nothing_shipped_imports_the_bench_but_the_cli_lazily():
    offenders = []
    for path in _product_files():
        rel = _rel(path)
        if rel.startswith(f"{BENCH}/"):
            continue
        for module, top_level in _imports(path):
            if module.split(".")[0] == BENCH and (top_level or rel not in BENCH_LAZY_ALLOWED):
                offenders.append(f"{rel} imports {module}")
    assert offenders == []


@pytest.mark.parametrize("module", ["rmq_semantics", "rmq_semantics.cli"])
def test_importing_the_library_loads_neither_sidecar_nor_spark_nor_bench(module):
    code = (
        f"import sys, {module}; print(sorted(m for m in sys.modules "
        "if m.split('.')[0] in {'coordinator', 'spark', 'benchmarks'}))"
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
_LAYOUT_TOKENS = {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}


def _wrapped_lines(text: str) -> set[int]:
    """The lines continuing a bracket opened on a line above: how a formatter wraps a call.

    The limits count lines as the code reads, not as ``ruff format`` wraps them (its one
    argument a line made the same code ~15 % longer), so they don't count these.
    """
    depth, last_line, wrapped = 0, 0, set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in _LAYOUT_TOKENS:
            continue
        if depth > 0:
            first = tok.start[0] if tok.start[0] != last_line else tok.start[0] + 1
            wrapped.update(range(first, tok.end[0] + 1))
        last_line = tok.end[0]
        if tok.type == tokenize.OP and tok.string in "([{":
            depth += 1
        elif tok.type == tokenize.OP and tok.string in ")]}":
            depth -= 1
    return wrapped


def _product_files() -> list[Path]:
    return sorted(p for d in PRODUCT for p in (ROOT / d).rglob("*.py"))


def test_no_product_file_or_class_is_too_large_without_saying_why():
    too_large = []
    for path in _product_files():
        text = path.read_text()
        tree = ast.parse(text)
        wrapped = _wrapped_lines(text)
        lines = text.count("\n") - len(wrapped)
        if lines > FILE_LIMIT and SIZE_REASON not in (ast.get_docstring(tree) or ""):
            too_large.append(f"{_rel(path)}: {lines} lines")
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                span = range(node.lineno, node.end_lineno + 1)
                size = len(span) - sum(1 for line in span if line in wrapped)
                if size > CLASS_LIMIT and SIZE_REASON not in (ast.get_docstring(node) or ""):
                    too_large.append(f"{_rel(path)}: class {node.name} has {size} lines")
    assert too_large == []


def test_the_size_limits_do_not_count_how_a_call_is_wrapped():
    compact = "x = f(a, b)\ny = [1,\n     2]\n"
    exploded = "x = f(\n    a,\n    b,\n)\ny = [\n    1,\n    2,\n]\n"
    assert compact.count("\n") - len(_wrapped_lines(compact)) == 2
    assert exploded.count("\n") - len(_wrapped_lines(exploded)) == 2


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    """The nodes under ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``)."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = getattr(test, "id", None) or getattr(test, "attr", None)
            if name == "TYPE_CHECKING":
                inside.update(id(sub) for stmt in node.body for sub in ast.walk(stmt))
    return inside


def import_graph(
    root: Path, packages: Iterable[str], *, type_checking: bool = True
) -> dict[str, set[str]]:
    """Module -> the modules of ``packages`` (under ``root``) it imports.

    Every import statement counts, at module level or inside a function: an import deferred
    into a function still makes the module use the other's names, it only hides the loop
    from Python. ``if TYPE_CHECKING:`` imports count too (``type_checking``): a module
    whose signatures name another module's types depends on that module as surely as one
    that calls it (the issue's state <-> horizon and keyed <-> keyfeed loops were such
    imports). ``from pkg import name`` points at ``pkg.name`` when that is a module, else at
    ``pkg``; the parent packages Python loads on the way are not counted, as every module
    would otherwise form a loop with the ``__init__`` that re-exports it.
    """
    files: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            files[".".join(parts)] = path
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        skipped = set() if type_checking else _type_checking_nodes(tree)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                for alias in node.names:
                    name = alias.name
                    while name and name not in files:
                        name = name.rpartition(".")[0]
                    if name:
                        targets.add(name)
            elif isinstance(node, ast.ImportFrom):
                source = node.module or ""
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    source = ".".join([*base, *([node.module] if node.module else [])])
                for alias in node.names:
                    if f"{source}.{alias.name}" in files:
                        targets.add(f"{source}.{alias.name}")
                    elif source in files:
                        targets.add(source)
        targets.discard(module)
        graph[module] = targets
    return graph


def _knots(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    knots: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            knot = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                knot.append(member)
                if member == node:
                    break
            if len(knot) > 1:
                knots.append(sorted(knot))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(knots)


def find_cycles(graph: dict[str, set[str]]) -> list[str]:
    """One line per knot of modules that import each other: its shortest loop through its
    first module, and the knot's other members when the loop does not pass them all."""
    lines = []
    for knot in _knots(graph):
        members, start = set(knot), knot[0]
        came_from: dict[str, str] = {}
        queue = deque([start])
        while queue:  # breadth first, within the knot, back to ``start``
            node = queue.popleft()
            if start in graph[node]:
                loop = [start]
                while node != start:
                    loop.append(node)
                    node = came_from[node]
                loop = [start, *reversed(loop[1:]), start]
                break
            for nxt in sorted(graph[node] & members):
                if nxt not in came_from and nxt != start:
                    came_from[nxt] = node
                    queue.append(nxt)
        others = sorted(members - set(loop))
        lines.append(
            " -> ".join(loop) + (f" (the knot also holds {', '.join(others)})" if others else "")
        )
    return lines


def _assert_no_cycles(graph: dict[str, set[str]]) -> None:
    cycles = find_cycles(graph)
    assert cycles == [], "import cycles among product modules:\n" + "\n".join(cycles)


def test_no_product_modules_import_each_other_round_a_loop():
    _assert_no_cycles(import_graph(ROOT, PRODUCT))


def test_the_cycle_finder_reports_a_planted_cycle(tmp_path):
    """A loop closed by a function-level (relative) import and one closed by a TYPE_CHECKING
    import are both reported, each with its modules in order, and fail the layering test."""
    files = {
        "pkg/__init__.py": "from pkg.a import A\n",
        "pkg/a.py": "from pkg.b import B\nclass A: ...\n",
        "pkg/b.py": "def f():\n    from . import c\nclass B: ...\n",
        "pkg/c.py": "import pkg.a\n",
        "pkg/d.py": textwrap.dedent(
            """\
            from typing import TYPE_CHECKING
            from pkg.e import E
            if TYPE_CHECKING:
                from pkg.d_types import D
            """
        ),
        "pkg/d_types.py": "from pkg.d import E\n",
        "pkg/e.py": "E = 1\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)

    assert find_cycles(import_graph(tmp_path, ["pkg"])) == [
        "pkg.a -> pkg.b -> pkg.c -> pkg.a",
        "pkg.d -> pkg.d_types -> pkg.d",
    ]
    assert find_cycles(import_graph(tmp_path, ["pkg"], type_checking=False)) == [
        "pkg.a -> pkg.b -> pkg.c -> pkg.a"
    ]
    with pytest.raises(AssertionError, match=r"pkg\.a -> pkg\.b -> pkg\.c -> pkg\.a"):
        _assert_no_cycles(import_graph(tmp_path, ["pkg"]))
