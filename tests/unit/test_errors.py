"""The one error family: every product error lives in errors.py, derives RmqError, and each
exported class is raised where it applies."""

from __future__ import annotations

import ast
import socket
from pathlib import Path

import pytest

from rmq_semantics import errors
from rmq_semantics.errors import BrokerUnavailableError, IllegalStateError, KafkaOperationError
from rmq_semantics.topics import list_topics
from rmq_semantics.transaction import TransactionListener, TransactionProducer

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = [p for d in ("rmq_semantics", "coordinator", "spark") for p in (ROOT / d).rglob("*.py")]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again when the with block ends


def test_no_broker_at_bootstrap_raises_broker_unavailable_naming_the_servers():
    bootstrap = f"127.0.0.1:{_closed_port()}"
    with pytest.raises(BrokerUnavailableError, match=f"no broker answered at '{bootstrap}'") as e:
        list_topics({"bootstrap.servers": bootstrap}, timeout_s=1)
    assert isinstance(e.value, KafkaOperationError) and isinstance(e.value, ConnectionError)
    assert e.value.retriable


def test_sending_before_start_is_an_illegal_state():
    producer = TransactionProducer(
        {"bootstrap.servers": "127.0.0.1:1"}, producer_group="g", listener=TransactionListener()
    )
    with pytest.raises(IllegalStateError, match="not started"):
        producer.send_message_in_transaction(None)  # type: ignore[arg-type]


def test_every_product_error_class_lives_in_errors_py():
    outside = []
    for path in PRODUCT:
        if path.name == "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name.endswith(("Error", "Aborted")):
                outside.append(f"{path.relative_to(ROOT)}: {node.name}")
    assert outside == []


@pytest.mark.parametrize("name", errors.__all__)
def test_exported_error_derives_the_base_and_is_raised_somewhere(name):
    cls = getattr(errors, name)
    assert issubclass(cls, errors.RmqError)
    if name == "RmqError":
        return
    raised = {
        sub.id
        for path in PRODUCT
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Raise) and node.exc is not None
        for sub in ast.walk(node.exc)
        if isinstance(sub, ast.Name)
    }
    assert name in raised or any(
        issubclass(getattr(errors, other), cls) and other in raised
        for other in errors.__all__
        if other != name
    )
