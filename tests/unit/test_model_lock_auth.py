"""The lock service under tenant isolation as a state machine (Hypothesis): the records a
request topic holds (lock requests of schema v1, v2 and v3, signed or not) decided by the
service's own code (``coordinator/lock_requests.answer`` with its ``LockGuard``), against a
reference model of one consumer group's queue (``ca``) and an adversary of group ``cb``
that reads every reply: it names ``ca``'s clients and epochs, signs with its own group's
key, with a garbage MAC, for another partition, or not at all, and alters signed requests.

Promises checked on every step: under isolation a request without ``ca``'s valid MAC is
answered ``unauthenticated`` and changes nothing; ``ca``'s own signed requests get exactly
the model's answer; with isolation off every version is decided (a rolling upgrade).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from coordinator.lock import LeaseCeiling, LockTable, RequestPoison
from coordinator.lock_auth import LockGuard
from coordinator.lock_requests import Partitions, answer
from rmq_semantics.records.codec import encode
from rmq_semantics.records.group_auth import derive_consumer_group_key, sign_lock_request
from rmq_semantics.records.locks import LockKey, LockRequest, QueueRef, RequestKind
from tests.model.broken import find_failure

TENANT_KEY = b"the tenant key of the lock model, 32 bytes+"
TOPIC, PARTITIONS, LEASE = "__rmq_lock_request", 4, 3000
QUEUE = LockKey("ca", "orders", 0)
P = QUEUE.request_partition(PARTITIONS)
T0 = 1_700_000_000_000
A_KEY = derive_consumer_group_key(TENANT_KEY, "ca")
B_KEY = derive_consumer_group_key(TENANT_KEY, "cb")
# How the adversary's request for ca's queue is made.
FORGERIES = ("v1", "v2", "v3_unsigned", "b_key", "garbage", "other_partition", "altered")


@dataclass
class Record:
    """A consumed request record, as much of it as ``answer`` reads."""

    data: bytes
    off: int

    def value(self) -> bytes:
        return self.data

    def partition(self) -> int:
        return P

    def offset(self) -> int:
        return self.off

    def topic(self) -> str:
        return TOPIC

    def timestamp(self) -> tuple[int, int]:
        return (0, 0)


class LockAuthMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        self.offset = 0
        self.isolated = True
        self.tables: dict[int, LockTable] = {}
        self.guard = LockGuard(TENANT_KEY)
        # The model: ca's queue held by (client, epoch, expiry), and the last epoch.
        self.holder: tuple[str, int, int] | None = None
        self.epoch = 0

    def _live(self) -> tuple[str, int, int] | None:
        return self.holder if self.holder is not None and self.now < self.holder[2] else None

    def _request(self, kind: RequestKind, client: str, epoch: int | None) -> LockRequest:
        self.offset += 1
        return LockRequest(
            kind,
            f"r{self.offset}",
            client,
            "ca",
            0,
            (QueueRef(QUEUE.topic, QUEUE.partition, epoch),),
            LEASE,
            self.now,
            5000,
        )

    def _decide(self, data: bytes) -> tuple[bool, str, int]:
        counts: Counter[str] = Counter()
        out = answer(
            [Record(data, self.offset)],
            self.tables,
            Partitions(PARTITIONS, PARTITIONS),
            LeaseCeiling(60_000),
            RequestPoison(3),
            self.now,
            lambda event: counts.update([event]),
            self.guard if self.isolated else None,
        )
        for p, table in out.staged.items():
            self.tables[p].absorb(table)
        [(_, reply)] = out.replies
        [result] = reply.results
        return result.granted, result.reason, result.epoch

    def _expect(self, kind: RequestKind, client: str, epoch: int | None, got: tuple) -> None:
        """The model's answer to a request that is decided; the model follows it."""
        live = self._live()
        if kind is RequestKind.LOCK:
            if live is not None and live[0] != client:
                assert got == (False, "held_by_other", live[1]), got
                return
            if live is not None:
                assert got == (True, "renewed", live[1]), got
            else:
                self.epoch += 1
                reason = "taken_over" if self.holder is not None else "granted"
                assert got == (True, reason, self.epoch), got
            self.holder = (client, self.epoch, self.now + LEASE)
            return
        if live is None or live[0] != client:
            assert got[:2] == (False, "not_holder"), got
        elif epoch is not None and epoch != live[1]:
            assert got[:2] == (False, "stale_epoch"), got
        else:
            assert got == (True, "released", live[1]), got
            self.holder = None

    # -- ca's own consumers ------------------------------------------------------------------
    @rule(
        client=st.sampled_from(["ca@1", "ca@2"]),
        kind=st.sampled_from(list(RequestKind)),
        current=st.booleans(),
    )
    def signed(self, client: str, kind: RequestKind, current: bool) -> None:
        epoch = self.epoch if current or kind is RequestKind.LOCK else self.epoch - 1
        request = sign_lock_request(A_KEY, TOPIC, P, self._request(kind, client, epoch))
        self._expect(kind, client, request.queues[0].epoch, self._decide(encode(request)))

    # -- the adversary -----------------------------------------------------------------------
    @rule(
        client=st.sampled_from(["ca@1", "ca@2", "thief"]),
        kind=st.sampled_from(list(RequestKind)),
        how=st.sampled_from(FORGERIES),
    )
    def forged(self, client: str, kind: RequestKind, how: str) -> None:
        request = self._request(kind, client, self.epoch)  # the epoch B read in a reply
        if how == "v1":
            data = encode(request, 1)
        elif how == "v2":
            data = encode(request, 2)
        elif how == "v3_unsigned":
            data = encode(request)
        elif how == "b_key":
            data = encode(sign_lock_request(B_KEY, TOPIC, P, request))
        elif how == "garbage":
            data = encode(dataclasses.replace(request, mac=b"\x00" * 32))
        elif how == "other_partition":
            data = encode(sign_lock_request(A_KEY, TOPIC, P + 1, request))
        else:  # a signed request of A's with its client changed
            signed = sign_lock_request(A_KEY, TOPIC, P, self._request(kind, "ca@1", self.epoch))
            data = encode(dataclasses.replace(signed, client_id=client + "x"))
        got = self._decide(data)
        if self.isolated:
            assert got == (False, "unauthenticated", -1), (how, got)
        else:
            decided = client + "x" if how == "altered" else client
            self._expect(kind, decided, request.queues[0].epoch, got)

    @rule()
    def toggle_isolation(self) -> None:
        """A rolling upgrade: the coordinators restart with or without the tenants file."""
        self.isolated = not self.isolated

    @rule(ms=st.sampled_from([1, 1000, 2999, 3000, 10_000]))
    def tick(self, ms: int) -> None:
        self.now += ms

    @invariant()
    def the_table_agrees_with_the_model(self) -> None:
        entry = self.tables.get(P, LockTable()).get(QUEUE)
        live = self._live()
        assert entry.live(self.now) == (live is not None)
        if live is not None:
            assert (entry.client_id, entry.epoch) == live[:2]
        assert entry.epoch == self.epoch


TestLockAuthMachine = LockAuthMachine.TestCase


def test_a_guard_that_takes_any_mac_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted defect: the guard asks only that a MAC be present. Hypothesis finds the
    adversary's garbage or foreign MAC changing ca's lock under isolation."""
    monkeypatch.setattr(
        LockGuard, "refusal", lambda self, topic, partition, request: None if request.mac else "no"
    )
    found = find_failure(LockAuthMachine)
    assert isinstance(found.error, AssertionError) and "unauthenticated" in str(found.error)
    assert any(s.startswith("state.forged(") for s in found.steps), found.report
    assert len(found.steps) <= 4, found.report
