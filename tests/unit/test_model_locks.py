"""The queue-lock table as a state machine (Hypothesis), against a reference model of the
lease rules: clients lock, renew and unlock two queues while the clock moves; a batch's
decisions are staged in an overlay and absorbed only when its Kafka transaction commits
(aborted batches are lost with their replies); a restart rebuilds the table from the
records written to the lock topic (compacted or not), as a new owner does.

Promises checked on every decision: the model's exact answer (grant, renew, deny, release,
expire, with its epoch and expiry); at most one client believes it holds a queue at a time;
epochs per queue strictly increase across holders and restarts; a renew after the lease
went to someone else fails.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from coordinator.lock import LockDecision, LockKey, LockTable
from rmq_semantics.records.codec import decode_lock_state, encode
from tests.model.broken import find_failure

CLIENTS = ("a", "b", "c")
QUEUES = (LockKey("g", "orders", 0), LockKey("g/x", "orders", 1))
LEASES = (1000, 3000)
T0 = 1_700_000_000_000

clients = st.sampled_from(CLIENTS)
queues = st.sampled_from(QUEUES)


@dataclass
class Holder:
    """The model's entry of a held queue: who, which epoch, until when (the table's view,
    which a restart may extend beyond what the client was told)."""

    client: str
    epoch: int
    lease_ms: int
    expires_at_ms: int


class LockMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        self.table = LockTable()
        self.topic: list[tuple[bytes, bytes]] = []  # the lock topic, as written
        self.holder: dict[LockKey, Holder | None] = dict.fromkeys(QUEUES)
        self.max_epoch: dict[LockKey, int] = dict.fromkeys(QUEUES, 0)
        # What each client was told it holds: (epoch, lease end) per queue.
        self.told: dict[tuple[str, LockKey], tuple[int, int]] = {}

    def _live(self, queue: LockKey) -> Holder | None:
        holder = self.holder[queue]
        return holder if holder is not None and self.now < holder.expires_at_ms else None

    def _batch(self, decide: Callable[[LockTable], LockDecision], commit: bool) -> LockDecision:
        """One decision in an overlay; written and absorbed only if the batch commits."""
        staged = self.table.overlay()
        decision = decide(staged)
        if commit:
            if decision.entry is not None:
                self.topic.append((decision.key.record_key(), encode(decision.entry)))
            self.table.absorb(staged)
        return decision

    # -- requests ----------------------------------------------------------------------------
    @rule(client=clients, queue=queues, lease=st.sampled_from(LEASES), commit=st.booleans())
    def lock(self, client: str, queue: LockKey, lease: int, commit: bool) -> None:
        d = self._batch(lambda t: t.lock(queue, client, lease, self.now), commit)
        live = self._live(queue)
        if live is not None and live.client == client:
            assert (d.granted, d.reason, d.epoch) == (True, "renewed", live.epoch), d
            # The lease came from this client's own grant, which nobody took over since.
            assert self.told[(client, queue)][0] == d.epoch
        elif live is not None:
            assert (d.granted, d.reason, d.client_id) == (False, "held_by_other", live.client), d
            return
        else:
            held = self.holder[queue] is not None
            assert (d.granted, d.reason) == (True, "taken_over" if held else "granted"), d
            assert d.epoch > self.max_epoch[queue], f"epoch {d.epoch} after {self.max_epoch}"
            assert d.epoch == self.max_epoch[queue] + 1
            others = [
                (c, e)
                for (c, q), (e, end) in self.told.items()
                if q == queue and c != client and end > self.now
            ]
            assert not others, f"{client} granted {queue} while {others} hold it"
        assert d.expires_at_ms == self.now + lease
        if commit:
            self.holder[queue] = Holder(client, d.epoch, lease, d.expires_at_ms)
            self.max_epoch[queue] = d.epoch
            self.told[(client, queue)] = (d.epoch, d.expires_at_ms)

    @rule(client=clients, queue=queues, stale=st.booleans(), commit=st.booleans())
    def unlock(self, client: str, queue: LockKey, stale: bool, commit: bool) -> None:
        epoch = self.told.get((client, queue), (0, 0))[0] - (1 if stale else 0)
        d = self._batch(lambda t: t.unlock(queue, client, self.now, epoch), commit)
        live = self._live(queue)
        if live is None or live.client != client:
            assert (d.granted, d.reason) == (False, "not_holder"), d
        elif epoch != live.epoch:
            assert (d.granted, d.reason) == (False, "stale_epoch"), d
        else:
            assert (d.granted, d.reason, d.epoch) == (True, "released", live.epoch), d
            if commit:
                self.holder[queue] = None
                self.told[(client, queue)] = (d.epoch, self.now)

    @rule(queue=queues, commit=st.booleans())
    def expire(self, queue: LockKey, commit: bool) -> None:
        d = self._batch(lambda t: t.expire(queue, self.now), commit)
        lapsed = self.holder[queue] is not None and self._live(queue) is None
        assert (d.granted, d.reason) == ((True, "expired") if lapsed else (False, "not_lapsed"))
        if lapsed and commit:
            self.holder[queue] = None

    @rule(ms=st.sampled_from([1, 500, 999, 1000, 2999, 3000, 10_000]))
    def tick(self, ms: int) -> None:
        self.now += ms

    @rule(compacted=st.booleans())
    def restart(self, compacted: bool) -> None:
        """A new owner reads the lock topic (a compacted one keeps each key's last record)
        into a fresh table; held leases run at least a full lease from now."""
        records = list({k: v for k, v in self.topic}.items()) if compacted else self.topic
        self.table = LockTable()
        for key, value in records:
            entry = decode_lock_state(key, value)
            self.table.restore(entry, self.now, entry.lease_ms)
        for holder in self.holder.values():
            if holder is not None:
                holder.expires_at_ms = max(holder.expires_at_ms, self.now + holder.lease_ms)

    # -- promises ----------------------------------------------------------------------------
    @invariant()
    def the_table_agrees_with_the_model(self) -> None:
        for queue in QUEUES:
            entry, live = self.table.get(queue), self._live(queue)
            assert entry.live(self.now) == (live is not None)
            if live is not None:
                assert (entry.client_id, entry.epoch) == (live.client, live.epoch)
            assert entry.epoch == self.max_epoch[queue]


TestLockMachine = LockMachine.TestCase


def test_a_takeover_that_keeps_the_epoch_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted defect: a lapsed lease is taken over without a new epoch, so the old holder's
    late writes would pass the fence. Hypothesis finds it and shrinks it to two locks."""
    lock = LockTable.lock

    def same_epoch(
        self: LockTable, key: LockKey, client_id: str, lease_ms: int, now_ms: int
    ) -> LockDecision:
        d = lock(self, key, client_id, lease_ms, now_ms)
        if d.reason == "taken_over":
            entry = replace(d.entry, epoch=d.entry.epoch - 1)
            self._put(entry)
            d = replace(d, epoch=entry.epoch, entry=entry)
        return d

    monkeypatch.setattr(LockTable, "lock", same_epoch)
    found = find_failure(LockMachine)
    assert isinstance(found.error, AssertionError) and "epoch" in str(found.error)
    # Shrunk to two locks with the clock moved past the lease between them.
    locks = [step for step in found.steps if not step.startswith("state.tick(")]
    assert len(locks) == 2 and all(s.startswith("state.lock(") for s in locks), found.report
    assert len(found.steps) <= 8, found.report
