"""A guard that proves, structurally, that nothing blocks an event loop: it wraps the
blocking librdkafka calls (flush, poll with a timeout, consume, a synchronous commit,
list_topics, close, the admin client's metadata) and every sqlite3 call, and records each
one made on the loop's thread while the guard is armed. A test arms it with the loop's
thread id inside the loop, disarms it before the loop ends, and asserts that it recorded
no offence and that the guarded calls did run (elsewhere), so it guarded something."""

from __future__ import annotations

import collections
import sqlite3
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager

import confluent_kafka
import confluent_kafka.admin
import pytest

import rmq_semantics.topics
from rmq_semantics.producer import DeliveryWaiter, SignalledWaiter


class LoopGuard:
    def __init__(self) -> None:
        self.loop_thread: int | None = None
        self.offences: list[str] = []
        self.calls_elsewhere: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def arm(self) -> None:
        """Called on the loop: from now on, a guarded call on this thread is an offence."""
        self.loop_thread = threading.get_ident()

    def disarm(self) -> None:
        self.loop_thread = None

    def blocking(self, what: str) -> None:
        with self._lock:
            if self.loop_thread is not None and threading.get_ident() == self.loop_thread:
                stack = "".join(traceback.format_stack(limit=8)[:-2])
                self.offences.append(f"{what} on the event loop's thread:\n{stack}")
            else:
                self.calls_elsewhere[what.split("(")[0]] += 1


def _timeout(args: tuple, kwargs: dict, index: int, name: str = "timeout") -> float:
    value = kwargs.get(name, args[index] if len(args) > index else -1)
    return -1.0 if value is None else float(value)


def _guarded_classes(guard: LoopGuard) -> dict[str, type]:
    class Producer(confluent_kafka.Producer):
        def flush(self, *args, **kwargs):
            guard.blocking("Producer.flush")
            return super().flush(*args, **kwargs)

        def poll(self, *args, **kwargs):
            if _timeout(args, kwargs, 0) != 0:
                guard.blocking("Producer.poll(timeout > 0)")
            return super().poll(*args, **kwargs)

        def list_topics(self, *args, **kwargs):
            guard.blocking("Producer.list_topics")
            return super().list_topics(*args, **kwargs)

    class Consumer(confluent_kafka.Consumer):
        def poll(self, *args, **kwargs):
            guard.blocking("Consumer.poll")
            return super().poll(*args, **kwargs)

        def consume(self, *args, **kwargs):
            guard.blocking("Consumer.consume")
            return super().consume(*args, **kwargs)

        def commit(self, *args, **kwargs):
            if not kwargs.get("asynchronous", True):
                guard.blocking("Consumer.commit(asynchronous=False)")
            return super().commit(*args, **kwargs)

        def list_topics(self, *args, **kwargs):
            guard.blocking("Consumer.list_topics")
            return super().list_topics(*args, **kwargs)

        def close(self, *args, **kwargs):
            guard.blocking("Consumer.close")
            return super().close(*args, **kwargs)

    class AdminClient(confluent_kafka.admin.AdminClient):
        def list_topics(self, *args, **kwargs):
            guard.blocking("AdminClient.list_topics")
            return super().list_topics(*args, **kwargs)

    return {"Producer": Producer, "Consumer": Consumer, "AdminClient": AdminClient}


def _guarded_sqlite(guard: LoopGuard, connect):
    class Cursor(sqlite3.Cursor):
        def execute(self, *args, **kwargs):
            guard.blocking("sqlite3 Cursor.execute")
            return super().execute(*args, **kwargs)

        def fetchone(self):
            guard.blocking("sqlite3 Cursor.fetchone")
            return super().fetchone()

        def fetchall(self):
            guard.blocking("sqlite3 Cursor.fetchall")
            return super().fetchall()

    class Connection(sqlite3.Connection):
        def cursor(self, factory=Cursor):
            return super().cursor(factory)

        def execute(self, *args, **kwargs):
            guard.blocking("sqlite3 Connection.execute")
            return self.cursor().execute(*args, **kwargs)

        def commit(self):
            guard.blocking("sqlite3 Connection.commit")
            return super().commit()

    def guarded_connect(*args, **kwargs):
        guard.blocking("sqlite3.connect")
        kwargs.setdefault("factory", Connection)
        return connect(*args, **kwargs)

    return guarded_connect


@contextmanager
def loop_guard(monkeypatch: pytest.MonkeyPatch) -> Iterator[LoopGuard]:
    """Install the guard on every client made while it is active (they are made through
    the module attributes ``confluent_kafka.Producer`` etc., looked up at call time)."""
    guard = LoopGuard()
    classes = _guarded_classes(guard)
    monkeypatch.setattr(confluent_kafka, "Producer", classes["Producer"])
    monkeypatch.setattr(confluent_kafka, "Consumer", classes["Consumer"])
    monkeypatch.setattr(rmq_semantics.topics, "AdminClient", classes["AdminClient"])
    monkeypatch.setattr(sqlite3, "connect", _guarded_sqlite(guard, sqlite3.connect))
    for waiter in (DeliveryWaiter, SignalledWaiter):  # a thread's way of waiting
        original = waiter.wait

        def wait(self, *args, _original=original, _name=waiter.__name__, **kwargs):
            guard.blocking(f"{_name}.wait")
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(waiter, "wait", wait)
    yield guard
