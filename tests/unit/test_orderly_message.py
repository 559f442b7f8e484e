"""The listener's message over a consumed confluent_kafka.Message (a lazy view), and the
queue buffering consumed messages as they came: both without a broker."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import threading

import pytest
from confluent_kafka import Message

from rmq_semantics.orderly import OrderlyMessage
from rmq_semantics.orderly.runtime import LiveQueue

TP = ("orders", 3)


def consumed(offset: int, *, headers: list | None = None) -> Message:
    return Message(
        topic=TP[0],
        partition=TP[1],
        offset=offset,
        key=b"k",
        value=f"v{offset}".encode(),
        headers=headers,
        timestamp=(1, 1700),
    )


def test_the_view_reads_every_field_of_the_consumed_message():
    view = OrderlyMessage.from_kafka(consumed(7, headers=[("a", b"1"), ("b", None)]))
    assert (
        view.topic,
        view.partition,
        view.offset,
        view.key,
        view.value,
        view.headers,
        view.timestamp,
        view.reconsume_times,
        view.where,
    ) == ("orders", 3, 7, b"k", b"v7", (("a", b"1"), ("b", b"")), 1700, 0, "orders[3]@7")
    assert OrderlyMessage.from_kafka(consumed(8)).headers == ()


def test_the_view_equals_hashes_and_prints_as_the_message_with_the_same_fields():
    view = OrderlyMessage.from_kafka(consumed(7))
    eager = OrderlyMessage("orders", 3, 7, b"k", b"v7", (), 1700)
    assert isinstance(view, OrderlyMessage) and dataclasses.is_dataclass(view)
    assert (view == eager, hash(view) == hash(eager), repr(view)) == (True, True, repr(eager))
    assert view != dataclasses.replace(eager, offset=8)


def test_the_view_is_frozen():
    view = OrderlyMessage.from_kafka(consumed(7))
    for name in ("value", "offset", "anything"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(view, name, 1)


def test_replace_pickle_and_copy_give_plain_messages_with_the_same_fields():
    view = OrderlyMessage.from_kafka(consumed(7))
    again = dataclasses.replace(view, reconsume_times=2)
    assert type(again) is OrderlyMessage
    assert (again.offset, again.value, again.reconsume_times) == (7, b"v7", 2)
    for twin in (pickle.loads(pickle.dumps(view)), copy.copy(view), copy.deepcopy(view)):
        assert type(twin) is OrderlyMessage and twin == view
    assert dataclasses.asdict(view)["value"] == b"v7"


def test_a_live_queue_buffers_consumed_messages_and_hands_over_views_in_order():
    q = LiveQueue(TP, threading.Lock()).state
    q.grant(5, 100.0)
    q.align(5, 10)
    assert q.add([consumed(o) for o in (8, 9, 10, 11)])  # below the committed offset: dropped
    assert q.add([consumed(o) for o in (12, 13)])
    batch = q.next_batch(3)
    assert [(type(m).__name__, m.offset) for m in batch] == [
        ("_KafkaMessageView", 10),
        ("_KafkaMessageView", 11),
        ("_KafkaMessageView", 12),
    ]
    q.suspend(0.0, retried=True)
    again = q.next_batch(3)  # the same batch again, counting the redelivery
    assert [(m.offset, m.reconsume_times) for m in again] == [(10, 1), (11, 1), (12, 1)]
    q.processed(13, 5)
    assert [m.offset for m in q.next_batch(3)] == [13]
