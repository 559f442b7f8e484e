"""RocketMQ's own Python clients against ours (issue 37): every public name, method, property
and parameter of the real packages exists in ``rmq_semantics.compat`` with a compatible
signature, or is a documented difference (a row of the migration page naming it).

- The RocketMQ 5 client (``rocketmq-python-client`` 5.1.2, the dev extra) is imported and
  inspected.
- The 2.x client (``rocketmq-client-python`` 2.0.0) loads librocketmq when imported, so its
  sdist's sources are parsed instead (``ast``; tests/rocketmq_packages.py downloads it once).

Compatible: each of their positional parameters is ours at the same place with the same
name, each keyword one is ours, a default of theirs is ours too and equal; ours may add
parameters only with defaults. A property stays a property, a method a method."""

from __future__ import annotations

import ast
import enum
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import rocketmq  # rocketmq-python-client, the dev extra

from rmq_semantics.compat import rocketmq as ours5
from rmq_semantics.compat import rocketmq_client as ours2
from tests.rocketmq_packages import v2_source

MIGRATING = Path(__file__).resolve().parents[2] / "docs" / "guides" / "migrating.md"
P = inspect.Parameter


def documented(prefix: str) -> set[str]:
    """The names the migration page's tables give as differences (first cell, backticked,
    starting with ``prefix``); ``*`` stands for any class (``rocketmq.*.sign``)."""
    names = set()
    for line in MIGRATING.read_text().splitlines():
        if line.startswith("| `"):
            first_cell = line.split("|")[1]
            names |= {n for n in re.findall(r"`([^`]+)`", first_cell) if n.startswith(prefix)}
    return names


def is_documented(name: str, names: set[str]) -> bool:
    module, _, rest = name.rpartition(".")  # module.Class, member
    wildcard = f"{module.rpartition('.')[0]}.*.{rest}"
    return name in names or wildcard in names


# -- signatures -----------------------------------------------------------------------------


def signature_problems(theirs: inspect.Signature, ours: inspect.Signature) -> list[str]:
    """Why code calling ``theirs`` would break on ``ours`` (nothing: compatible)."""
    their_params = [p for p in theirs.parameters.values() if p.name != "self"]
    our_params = [p for p in ours.parameters.values() if p.name != "self"]
    positional = [p for p in our_params if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
    by_name = {p.name: p for p in our_params}
    kinds = {p.kind for p in our_params}
    problems = []
    for index, param in enumerate(their_params):
        if param.kind in (P.VAR_POSITIONAL, P.VAR_KEYWORD):
            if param.kind not in kinds:
                problems.append(f"*{param.name} is not taken")
            continue
        mine = by_name.get(param.name)
        if param.kind == P.POSITIONAL_OR_KEYWORD and (
            index >= len(positional) or positional[index].name != param.name
        ):
            problems.append(f"{param.name!r} is not positional parameter {index + 1}")
            continue
        if mine is None:
            if P.VAR_KEYWORD not in kinds:
                problems.append(f"{param.name!r} is not taken")
            continue
        if param.default is not P.empty and (
            mine.default is P.empty or not _same(param.default, mine.default)
        ):
            problems.append(f"{param.name!r} defaults to {mine.default!r}, not {param.default!r}")
    theirs_names = {p.name for p in their_params}
    for extra in our_params:
        required = extra.default is P.empty and extra.kind not in (P.VAR_POSITIONAL, P.VAR_KEYWORD)
        if extra.name not in theirs_names and required:
            problems.append(f"ours requires {extra.name!r}")
    return problems


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:
        return False


def test_the_signature_check_catches_what_would_break_a_caller():
    def theirs(self, topic, body=None, *, tag="t"):
        pass

    def renamed(self, name, body=None, *, tag="t"):
        pass

    def default_changed(self, topic, body=1, *, tag="t"):
        pass

    def required_extra(self, topic, body=None, *, tag="t", group):
        pass

    def superset(self, topic, body=None, flag=False, *, tag="t", **more):
        pass

    sig = inspect.signature
    assert signature_problems(sig(theirs), sig(superset)) == []
    assert signature_problems(sig(theirs), sig(renamed)) == [
        "'topic' is not positional parameter 1",
        "ours requires 'name'",
    ]
    assert signature_problems(sig(theirs), sig(default_changed)) == [
        "'body' defaults to 1, not None"
    ]
    assert signature_problems(sig(theirs), sig(required_extra)) == ["ours requires 'group'"]


# -- the RocketMQ 5 client --------------------------------------------------------------------


def _public_members(cls: type) -> dict[str, Any]:
    out = {}
    for name in dir(cls):
        if name.startswith("_") and name != "__init__":
            continue
        out[name] = inspect.getattr_static(cls, name)
    return out


def _kind(member: Any) -> str:
    if isinstance(member, property):
        return "property"
    if isinstance(member, (staticmethod, classmethod)) or inspect.isfunction(member):
        return "method"
    return "value"


def v5_gaps() -> list[str]:
    names = documented("rocketmq.")
    gaps = []
    for public in rocketmq.__all__:
        theirs = getattr(rocketmq, public)
        mine = getattr(ours5, public, None)
        if mine is None or public not in ours5.__all__:
            if not is_documented(f"rocketmq.{public}", names):
                gaps.append(f"rocketmq.{public}: missing")
            continue
        if isinstance(theirs, type) and issubclass(theirs, enum.Enum):
            if [(m.name, m.value) for m in theirs] != [(m.name, m.value) for m in mine]:
                gaps.append(f"rocketmq.{public}: members differ")
            continue
        if not isinstance(theirs, type):  # TransactionResolution: protobuf's enum wrapper
            if list(theirs.items()) != list(mine.items()):
                gaps.append(f"rocketmq.{public}: members differ")
            continue
        for member, value in _public_members(theirs).items():
            name = f"rocketmq.{public}.{member}"
            if is_documented(name, names):
                continue
            if not hasattr(mine, member):
                gaps.append(f"{name}: missing")
                continue
            mine_value = inspect.getattr_static(mine, member)
            if _kind(value) != _kind(mine_value):
                gaps.append(f"{name}: a {_kind(mine_value)}, theirs is a {_kind(value)}")
            elif _kind(value) == "method":
                problems = signature_problems(
                    inspect.signature(getattr(theirs, member)),
                    inspect.signature(getattr(mine, member)),
                )
                gaps += [f"{name}: {p}" for p in problems]
            elif _kind(value) == "value" and not _same(value, mine_value):
                gaps.append(f"{name}: {mine_value!r}, theirs {value!r}")
    return gaps


def test_every_public_name_of_the_rocketmq_5_client_is_ours_or_a_documented_difference():
    assert v5_gaps() == []


def test_the_5x_examples_import_line_changes_and_nothing_else():
    # apache/rocketmq-clients python/example imports exactly these names from rocketmq.
    used = {
        "ClientConfiguration",
        "ConsumeResult",
        "Credentials",
        "FilterExpression",
        "Message",
        "MessageListener",
        "Producer",
        "PushConsumer",
        "SimpleConsumer",
        "TransactionChecker",
        "TransactionResolution",
    }
    assert used <= set(ours5.__all__)


# -- the 2.x client, from its sdist ---------------------------------------------------------


def _tree(member: str) -> ast.Module:
    return ast.parse(v2_source(member))


def _classes(tree: ast.Module) -> dict[str, ast.ClassDef]:
    return {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}


def _enum_members(cls: ast.ClassDef) -> list[tuple[str, Any]]:
    return [
        (stmt.targets[0].id, ast.literal_eval(stmt.value))
        for stmt in cls.body
        if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name)
    ]


def _default(node: ast.expr) -> Any:
    """A default as a value: a literal, or a name of ours (``MessageModel.CLUSTERING``)."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        value: Any = ours2
        for part in ast.unparse(node).split("."):
            value = getattr(value, part)
        return value


def _ast_signature(fn: ast.FunctionDef) -> inspect.Signature:
    args = fn.args
    positional = args.posonlyargs + args.args
    defaults = [P.empty] * (len(positional) - len(args.defaults)) + [
        _default(d) for d in args.defaults
    ]
    params = [
        P(a.arg, P.POSITIONAL_OR_KEYWORD, default=d)
        for a, d in zip(positional, defaults, strict=True)
    ]
    if args.vararg:
        params.append(P(args.vararg.arg, P.VAR_POSITIONAL))
    for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        params.append(P(a.arg, P.KEYWORD_ONLY, default=P.empty if d is None else _default(d)))
    if args.kwarg:
        params.append(P(args.kwarg.arg, P.VAR_KEYWORD))
    return inspect.Signature(params)


DUNDERS = {"__init__", "__enter__", "__exit__", "__getitem__", "__str__", "__bytes__"}


def _methods(cls: ast.ClassDef, classes: dict[str, ast.ClassDef]) -> dict[str, ast.FunctionDef]:
    """Public methods and properties, the base classes' first (overridden by the class's)."""
    out: dict[str, ast.FunctionDef] = {}
    for base in cls.bases:
        if isinstance(base, ast.Name) and base.id in classes:
            out.update(_methods(classes[base.id], classes))
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and (
            not node.name.startswith("_") or node.name in DUNDERS
        ):
            out[node.name] = node
    return out


def _is_property(fn: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "property" for d in fn.decorator_list)


def v2_gaps() -> list[str]:
    names = documented("rocketmq.client.")
    client = _tree("rocketmq/client.py")
    classes = _classes(client)
    enums = {
        **{n: c for n, c in classes.items() if any(ast.unparse(b) == "IntEnum" for b in c.bases)},
        "MessageModel": _classes(_tree("rocketmq/ffi.py"))["MessageModel"],
        "MessageProperty": _classes(_tree("rocketmq/consts.py"))["MessageProperty"],
    }
    exported = next(
        ast.literal_eval(n.value)
        for n in client.body
        if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "__all__"
    )
    gaps = []
    for public in [*exported, "SendResult", "MessageModel", "MessageProperty"]:
        name = f"rocketmq.client.{public}"
        mine = getattr(ours2, public, None)
        if mine is None or public not in ours2.__all__:
            if not is_documented(name, names):
                gaps.append(f"{name}: missing")
            continue
        if public in enums:
            theirs = _enum_members(enums[public])
            if theirs != [(m.name, m.value) for m in mine]:
                gaps.append(f"{name}: members differ")
            continue
        if public == "SendResult":
            if list(mine._fields) != ["status", "msg_id", "offset"]:
                gaps.append(f"{name}: fields differ")
            continue
        for member, fn in _methods(classes[public], classes).items():
            member_name = f"{name}.{member}"
            if is_documented(member_name, names):
                continue
            mine_value = inspect.getattr_static(mine, member, None)
            if mine_value is None:
                gaps.append(f"{member_name}: missing")
            elif _is_property(fn) != isinstance(mine_value, property):
                gaps.append(f"{member_name}: property and method differ")
            elif not _is_property(fn):
                problems = signature_problems(
                    _ast_signature(fn), inspect.signature(getattr(mine, member))
                )
                gaps += [f"{member_name}: {p}" for p in problems]
    return gaps


def test_every_public_name_of_the_rocketmq_2x_client_is_ours_or_a_documented_difference():
    assert v2_gaps() == []


@pytest.mark.parametrize("prefix, module", [("rocketmq.client.", None), ("rocketmq.", rocketmq)])
def test_every_documented_difference_names_something_their_client_has(prefix, module):
    """A row of the migration page's lists names a real name of theirs (no stale rows)."""
    for name in documented(prefix):
        if prefix == "rocketmq." and name.startswith("rocketmq.client."):
            continue
        parts = name.removeprefix(prefix).split(".")
        if module is None:
            source = v2_source("rocketmq/client.py")
            assert all(p == "*" or p in source for p in parts), name
            continue
        classes = [getattr(module, c) for c in module.__all__] if parts[0] == "*" else None
        if classes is not None:
            assert any(hasattr(c, parts[1]) for c in classes), name
        else:
            value: Any = module
            for part in parts:
                value = getattr(value, part)
