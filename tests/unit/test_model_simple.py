"""The SimpleConsumer's lease engine as a state machine (Hypothesis), against a model of one
partition: its log (records with or without a message group, some the tag filter drops, gaps
between offsets), a consumer that commits before it hands a batch out (as the I/O layer
will), acks and changes invisibility with the receipts it got (current or stale), writes dead
letters, and dies (a new engine from the last commit; its uncommitted acks are lost).

Promises checked on every step: nothing acked is handed out again by the same engine, and
nothing acked before a commit ever again; a group's record goes out only once every earlier
record of its group is done, and one at a time; a delivery's attempt is exactly one more than
the last one a user saw of that record (commit before deliver), never over the maximum; a
receipt is honoured exactly while it is the record's current delivery and its deadline has
not passed; the committable offset never passes a record not done. After ``drain`` (time runs
on, everything is received and acked but poison records): every record the filter keeps was
acked or dead-lettered, none lost.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from rmq_semantics.errors import ReceiptError
from rmq_semantics.simple import engine as engine_module
from rmq_semantics.simple.engine import PartitionEngine, Receipt
from tests.model.broken import find_failure

T0 = 1_700_000_000_000
MAX_ATTEMPTS = 3
OWNER = "client-1:1"
GROUPS = ("a", "b", None)
# Plus MAX_ATTEMPTS per record: a group's poison records die one after the other.
DRAIN_ROUNDS = 20
POISON = 5  # drain never acks a record whose offset this divides: it goes to the DLQ


@dataclass(frozen=True)
class Rec:
    offset: int
    group: str | None
    keep: bool  # False: the tag filter drops it


def key_of(record: Rec) -> str | None:
    return record.group


class SimpleMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        self.log: list[Rec] = []
        self.committed: tuple[int, str] | None = None
        self.durable_done: set[int] = set()  # done when the last commit was made
        self.acked_ever: set[int] = set()
        self.dead_ever: set[int] = set()
        self.last_attempt: dict[int, int] = {}  # the last attempt a user saw, per offset
        self.stale: list[Receipt] = []  # receipts of dead engines
        self._engine(None)

    def _engine(self, commit: tuple[int, str] | None) -> None:
        """A new owner of the partition, from ``commit`` (None: from the log's start)."""
        if commit is None:
            self.engine = PartitionEngine(
                "t", 0, max_delivery_attempts=MAX_ATTEMPTS, max_leased=4, key_of=key_of
            )
            start = 0
        else:
            self.engine = PartitionEngine.restore(
                "t", 0, *commit, max_delivery_attempts=MAX_ATTEMPTS, max_leased=4, key_of=key_of
            )
            start = commit[0]
        self.position = next(
            (i for i, r in enumerate(self.log) if r.offset >= start), len(self.log)
        )
        self.done_now = set(self.durable_done)  # done as this engine knows it
        self.current: dict[int, tuple[Receipt, int]] = {}  # offset -> (receipt, deadline)
        self.owed: list[int] = []  # dead letters taken, not written yet

    # -- the partition -----------------------------------------------------------------------
    @rule(
        records=st.lists(
            st.tuples(st.sampled_from(GROUPS), st.sampled_from([True, True, True, False])),
            min_size=1,
            max_size=5,
        ),
        gap=st.sampled_from([1, 1, 2]),
    )
    def append(self, records: list[tuple[str | None, bool]], gap: int) -> None:
        offset = self.log[-1].offset + gap if self.log else 0
        for group, keep in records:
            self.log.append(Rec(offset, group, keep))
            offset += 1

    @precondition(lambda self: self.position < len(self.log))
    @rule(most=st.sampled_from([1, 3, 50]))
    def read(self, most: int) -> None:
        for record in self.log[self.position : self.position + most]:
            if record.keep:
                if not self.engine.offer(record.offset, record, self.now):
                    assert record.offset in self.durable_done
            else:
                self.engine.skip(record.offset)
                self.done_now.add(record.offset)
            self.position += 1

    @rule(ms=st.sampled_from([1, 500, 3000, 10_000, 25_000]))
    def tick(self, ms: int) -> None:
        self.now += ms

    # -- the consumer ------------------------------------------------------------------------
    def _receive(self, n: int, invisible_ms: int) -> None:
        deliveries = self.engine.receive(n, self.now, invisible_ms)
        self.commit()  # before the user sees the batch
        for d in deliveries:
            offset, attempt = d.receipt.offset, d.delivery_attempt
            record = d.record
            assert offset not in self.done_now, f"{offset} handed out again after its ack"
            assert offset not in self.durable_done
            assert attempt == self.last_attempt.get(offset, 0) + 1, (offset, attempt)
            assert attempt <= MAX_ATTEMPTS
            if record.group is not None:
                earlier = [
                    r.offset
                    for r in self.log
                    if r.group == record.group and r.keep and r.offset < offset
                ]
                assert set(earlier) <= self.done_now, f"{offset} overtook {earlier}"
                rivals = [
                    o
                    for o, (_, deadline) in self.current.items()
                    if o != offset and deadline > self.now and self._group(o) == record.group
                ]
                assert not rivals, f"{offset} of {record.group} out beside {rivals}"
            self.last_attempt[offset] = attempt
            self.current[offset] = (d.receipt, d.invisible_until_ms)

    @rule(n=st.sampled_from([1, 2, 32]), invisible_ms=st.sampled_from([1000, 5000, 20_000]))
    def receive(self, n: int, invisible_ms: int) -> None:
        self._receive(n, invisible_ms)

    def _group(self, offset: int) -> str | None:
        return next(r.group for r in self.log if r.offset == offset)

    def _valid(self, receipt: Receipt) -> bool:
        held = self.current.get(receipt.offset)
        return held is not None and held[0] == receipt and self.now < held[1]

    def _pick(self, index: int, stale: bool) -> Receipt | None:
        pool = self.stale if stale else [r for r, _ in self.current.values()]
        return pool[index % len(pool)] if pool else None

    @rule(index=st.integers(0, 50), stale=st.sampled_from([False, False, False, True]))
    def ack(self, index: int, stale: bool) -> None:
        receipt = self._pick(index, stale)
        if receipt is None:
            return
        if self._valid(receipt):
            self.engine.ack(receipt, self.now)
            del self.current[receipt.offset]
            self.done_now.add(receipt.offset)
            self.acked_ever.add(receipt.offset)
        else:
            with pytest.raises(ReceiptError):
                self.engine.ack(receipt, self.now)

    @rule(index=st.integers(0, 50), ms=st.sampled_from([0, 2000, 30_000]))
    def change_invisible_duration(self, index: int, ms: int) -> None:
        receipt = self._pick(index, False)
        if receipt is None:
            return
        if self._valid(receipt):
            until = self.engine.change_invisible_duration(receipt, ms, self.now)
            assert until == self.now + ms
            self.current[receipt.offset] = (receipt, until)
        else:
            with pytest.raises(ReceiptError):
                self.engine.change_invisible_duration(receipt, ms, self.now)

    @rule()
    def take_dead_letters(self) -> None:
        for letter in self.engine.take_dead_letters(self.now):
            assert letter.attempts == MAX_ATTEMPTS == self.last_attempt[letter.offset]
            assert letter.offset not in self.done_now
            self.current.pop(letter.offset, None)
            self.owed.append(letter.offset)

    @precondition(lambda self: self.owed)
    @rule()
    def dead_lettered(self) -> None:
        offset = self.owed.pop(0)
        self.engine.dead_lettered(offset)
        self.done_now.add(offset)
        self.dead_ever.add(offset)

    @rule()
    def commit(self) -> None:
        commit = self.engine.committable(self.now, OWNER)
        if commit is None:
            return
        offset = commit[0]
        read = [r.offset for r in self.log[: self.position]]
        behind = [o for o in read if o < offset and o not in self.done_now]
        assert not behind, f"commit {offset} passes {behind}"
        self.committed = commit
        self.durable_done = set(self.done_now)

    @rule()
    def crash(self) -> None:
        """The owner dies: its uncommitted acks are lost, its receipts go stale."""
        self.stale.extend(r for r, _ in self.current.values())
        self._engine(self.committed)

    # -- the end -----------------------------------------------------------------------------
    @rule()
    def drain(self) -> None:
        """Time runs on; every record is read and received; all are acked but the poison
        ones, which go to the DLQ (dead letters written)."""
        self.read(len(self.log))
        for _ in range(DRAIN_ROUNDS + MAX_ATTEMPTS * len(self.log)):
            self.now += 30_000
            self._receive(1000, 10_000)
            for receipt, _ in list(self.current.values()):
                if self._valid(receipt) and receipt.offset % POISON:
                    self.engine.ack(receipt, self.now)
                    del self.current[receipt.offset]
                    self.done_now.add(receipt.offset)
                    self.acked_ever.add(receipt.offset)
            self.take_dead_letters()
            while self.owed:
                self.dead_lettered()
            kept = {r.offset for r in self.log if r.keep}
            if kept <= self.done_now:
                break
        kept = {r.offset for r in self.log if r.keep}
        lost = kept - self.acked_ever - self.dead_ever
        assert not lost, f"never acked nor dead-lettered: {sorted(lost)}"
        assert self.engine.buffered == 0 and self.engine.leased == 0


TestSimpleMachine = SimpleMachine.TestCase


def test_a_consumer_that_ignores_message_groups_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted defect: the engine is given no ordering key (a consumer that did not see the
    records were FIFO). Hypothesis finds a group's record overtaking an earlier one."""
    monkeypatch.setattr(sys.modules[__name__], "key_of", lambda record: None)
    found = find_failure(SimpleMachine)
    assert isinstance(found.error, AssertionError)
    assert "overtook" in str(found.error) or "out beside" in str(found.error), found.report


def test_an_owner_that_forgets_the_leases_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted defect: a new owner ignores the lease field (attempts kept in memory only).
    Hypothesis finds a redelivery after a crash whose attempt starts again."""

    def unreadable(field: str, committed: int) -> dict:
        raise ValueError("planted")

    monkeypatch.setattr(engine_module, "decode_leases", unreadable)
    found = find_failure(SimpleMachine)
    assert isinstance(found.error, AssertionError), found.report
    assert "state.crash()" in found.steps, found.report
