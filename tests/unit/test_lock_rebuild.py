"""The lock table's read at a takeover (coordinator/lock_rebuild.py) ends only past every
transaction open at the takeover: a read_committed end before the previous owner's
committed grants (their markers not yet written) must not end it."""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import KafkaError

from coordinator.lock_rebuild import read_tables
from rmq_semantics.records.codec import encode
from rmq_semantics.records.locks import LockEntry, LockKey, LockState

TOPIC = "__rmq_lock"
KEY = LockKey("g", "orders", 0)


@dataclass
class _Msg:
    """A consumed record, or a partition end (``eof``) at ``offset``."""

    offset_: int
    entry: LockEntry | None = None

    def error(self) -> KafkaError | None:
        return None if self.entry else KafkaError(KafkaError._PARTITION_EOF)

    def topic(self) -> str:
        return TOPIC

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self.offset_

    def key(self) -> bytes:
        return KEY.record_key()

    def value(self) -> bytes | None:
        return encode(self.entry) if self.entry else None


class _Reader:
    """Polls ``script`` in order; the cached high watermark is ``high`` (as librdkafka's,
    set by the fetch that reported the first end)."""

    def __init__(self, script: list[_Msg], high: int) -> None:
        self.script, self.high = list(script), high

    def assign(self, _tps: object) -> None:
        pass

    def unassign(self) -> None:
        pass

    def poll(self, _timeout: float) -> _Msg | None:
        return self.script.pop(0) if self.script else None

    def get_watermark_offsets(self, _tp: object, cached: bool = False) -> tuple[int, int]:
        return (0, self.high)


def _held(client: str, epoch: int) -> LockEntry:
    return LockEntry(KEY, LockState.HELD, client, epoch, 60000, 1000, 61000, 1000)


def test_the_read_waits_past_an_end_before_a_transaction_open_at_the_takeover() -> None:
    # first's grant, then an end at 1 (the last stable offset) while the high watermark is
    # 3: second's takeover grant (offset 1) and its commit marker (2) come after it.
    reader = _Reader([_Msg(0, _held("first", 1)), _Msg(1), _Msg(1, _held("second", 2)), _Msg(3)], 3)
    counted: list[str] = []
    tables, loaded = read_tables(reader, TOPIC, [0], 60000, counted.append)  # type: ignore[arg-type]
    entry = tables[0].get(KEY)
    assert (entry.client_id, entry.epoch, loaded) == ("second", 2, 2)
    assert counted == ["takeover_waited"]


def test_the_read_ends_at_the_first_end_when_no_transaction_is_open() -> None:
    reader = _Reader([_Msg(0, _held("first", 1)), _Msg(1), _Msg(1, _held("second", 2))], 1)
    counted: list[str] = []
    tables, loaded = read_tables(reader, TOPIC, [0], 60000, counted.append)  # type: ignore[arg-type]
    assert (tables[0].get(KEY).epoch, loaded, counted) == (1, 1, [])
