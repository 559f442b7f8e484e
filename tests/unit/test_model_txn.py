"""The coordinator's transaction state as a state machine (Hypothesis), against a reference
model of the semantics; the partition and the coordinator around it are
tests/model/txn_harness.py (the real dispatch, state and marker authentication; records as
the real writer writes them).

Rules: transactions of one or more members; end requests (COMMIT, ROLLBACK, UNKNOW) from
their producer group or another, repeated or conflicting, or for offsets not written yet;
check answers; forged markers (unsigned, v1, a bad MAC, a check marker) and malformed
records; reads of either partition in any interleaving, their ends; steps (what is due,
written with the offsets to commit); the clock; restarts from the committed offsets; and
``settle``: the producers answer every check with their final decision until nothing moves.

The model: a transaction's decision is the first COMMIT or ROLLBACK its own group sent (an
inline end request or a check answer, in Op order), unless check_max UNKNOW answers came
before it (then it is discarded). Promises checked after every write: each member promoted
at most once, all members or none, only with a COMMIT first and never with another final
outcome; a rollback or discard only as the model allows; the committed half offset never
passes a half record without its done marker. After ``settle``: everything decided as the
model says (nothing committed is lost) and the committed offsets at both ends.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from dataclasses import dataclass

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, precondition, rule

from coordinator.marker_auth import MarkerVerifier, Verdict
from coordinator.state import EndRequest as EndRequestIn
from coordinator.state import PartitionState
from rmq_semantics.records.headers import H
from rmq_semantics.records.txn import (
    CheckMarker,
    DoneEntry,
    DoneMarker,
    DoneMarkers,
    EndEntry,
    EndRequest,
    EndRequests,
    EndState,
    Outcome,
)
from tests.fuzz.generators import Raw
from tests.model.broken import find_failure
from tests.model.txn_harness import FINAL, GROUP, SETTINGS, Partition, half_record

OTHER_GROUP = "intruder"
SETTLE_ROUNDS = 40  # of one check interval each; settling takes about ten
states = st.sampled_from(list(EndState))
decisive = (EndState.COMMIT, EndState.ROLLBACK)
# What a producer answers for a transaction decided so (a discard: the UNKNOW it answered).
_ANSWER = {
    Outcome.COMMITTED: EndState.COMMIT,
    Outcome.ROLLED_BACK: EndState.ROLLBACK,
    Outcome.DISCARDED: EndState.UNKNOWN,
}


@dataclass
class Txn:
    id: str
    size: int
    origin: int  # its first member's half offset: where its producer addresses it
    final: EndState  # what its producer answers checks with when settling


class TxnMachine(RuleBasedStateMachine):
    txns = Bundle("txns")

    def __init__(self) -> None:
        super().__init__()
        self.p = Partition()
        self.txns_by_id: dict[str, Txn] = {}
        self.settled_checks = 0  # checks answered by settle()
        self.copies: dict[int, str] = {}  # half offset of a copy -> its transaction
        self.firsts: dict[str, int] = {}  # transaction -> its first half record's offset
        self.exempt: set[str] = set()  # transactions a copy may promote again (see restart)
        self.started_at = 0  # the committed half offset the coordinator last started from
        self.seen_checks = 0  # checks classified by _step()
        # Checks of a transaction already decided, by index: the outcome its producer answers.
        self.decided_checks: dict[int, EndState] = {}

    def _now(self) -> int:
        return self.p.now

    # -- producers -----------------------------------------------------------------------------
    @rule(target=txns, size=st.sampled_from([1, 1, 2, 3]), final=states)
    def begin(self, size: int, final: EndState) -> str:
        txn = f"t{len(self.txns_by_id)}"
        offsets = [
            self.p.append_half(half_record(txn, size, i, self._now()), (txn, i))
            for i in range(size)
        ]
        self.txns_by_id[txn] = Txn(txn, size, offsets[0], final)
        self.firsts[txn] = offsets[0]
        return txn

    @rule(txn=txns, state=states, own=st.booleans())
    def end(self, txn: str, state: EndState, own: bool) -> None:
        t = self.txns_by_id[txn]
        self.p.append_op(
            EndRequests(
                GROUP if own else OTHER_GROUP, 0, (EndEntry(txn, t.origin, state),), self._now()
            )
        )

    @precondition(lambda self: bool(self.p.written.checks))
    @rule(data=st.data(), state=states, own=st.booleans())
    def answer(self, data: st.DataObject, state: EndState, own: bool) -> None:
        index = data.draw(st.integers(0, len(self.p.written.checks) - 1), label="check")
        check = self.p.written.checks[index]
        if own:
            state = self.decided_checks.get(index, state)
        self.p.append_op(
            EndRequest(
                check.txn_id,
                GROUP if own else OTHER_GROUP,
                0,
                check.half_offset,
                state,
                True,
                check.check_seq,
                self._now(),
            )
        )

    @rule(txn=txns, addressed=st.booleans())
    def copy_half(self, txn: str, addressed: bool) -> None:
        """The broker appends a single-message transaction's half record again (an
        idempotent retry it did not recognise); ``addressed``: the producer was told the
        copy's offset, so its end requests name the copy."""
        t = self.txns_by_id[txn]
        if t.size != 1:
            return
        at = self.p.append_half(self.p.half[t.origin][0])
        self.copies[at] = txn
        if self.firsts[txn] < self.started_at:  # the coordinator started past the first
            self.exempt.add(txn)
        if addressed:
            t.origin = at

    # -- adversaries ---------------------------------------------------------------------------
    @rule(
        txn=txns,
        kind=st.sampled_from(["unsigned", "v1", "bad_mac", "check"]),
        outcome=st.sampled_from([Outcome.COMMITTED, Outcome.ROLLED_BACK, Outcome.DISCARDED]),
    )
    def forge_marker(self, txn: str, kind: str, outcome: Outcome) -> None:
        at, now = self.txns_by_id[txn].origin, self._now()
        if kind == "v1":
            record = DoneMarker(at, txn, outcome, 0, now)
        elif kind == "check":  # many answered checks, the next one far away
            record = CheckMarker(at, txn, 9, 9, 9, now + 10**9, now)
        else:
            record = DoneMarkers(
                (DoneEntry(at, txn, outcome, 0),),
                now,
                mac=None if kind == "unsigned" else bytes(32),
            )
        self.p.append_op(record)

    @rule(
        kind=st.sampled_from(
            ["end_ahead", "end_ahead_other", "op_garbage", "op_null", "half_headers", "half_size"]
        ),
        state=states,
    )
    def junk(self, kind: str, state: EndState) -> None:
        """An end request for a half offset not written yet (by no producer of it), or a
        malformed record on either partition."""
        if kind.startswith("end_ahead"):
            self.p.append_op(
                EndRequests(
                    OTHER_GROUP if kind.endswith("other") else GROUP,
                    0,
                    (EndEntry("nobody", len(self.p.half) + len(self.p.op) % 3, state),),
                    self._now(),
                )
            )
        elif kind == "op_garbage":
            self.p.append_op(b"\x00not a system record")
        elif kind == "op_null":
            self.p.append_op(None)
        elif kind == "half_headers":
            self.p.append_half(Raw(b"v", b"k", [(H.TXN_ID, b"no-topic")], 0))
        else:
            raw = half_record("bad-size", 1, 0, self._now())
            self.p.append_half(
                dataclasses.replace(
                    raw, headers=[*raw.headers, (H.TXN_SIZE, b"2"), (H.TXN_INDEX, b"7")]
                )
            )

    # -- the coordinator -------------------------------------------------------------------------
    @rule(which=st.sampled_from(["half", "op"]), most=st.sampled_from(["1", "2", "all", "end"]))
    def read(self, which: str, most: str) -> None:
        """Some records of one partition; ``end``: all of them and its end reported."""
        self.p.read(which, int(most) if most.isdigit() else 1 << 30)
        if most == "end":
            self.p.eof(which)

    @rule()
    def step(self) -> None:
        self._step()

    def _step(self) -> None:
        """A step, then the promises; a check of a transaction decided already is the
        documented exception (README, multi-message transactions): a member read only
        after a restart, its transaction decided before it, "is checked on its own, and
        the answer is the same" -- its producer answers from its local transaction, so
        the model's does too (answering anything else would decide it a second time)."""
        self.p.step()
        finals = self._finals()
        for index in range(self.seen_checks, len(self.p.written.checks)):
            check = self.p.written.checks[index]
            if outcomes := finals.get(check.txn_id):
                assert self.p.restarts, f"{check.txn_id} checked after it was decided"
                self.decided_checks[index] = _ANSWER[min(outcomes)]
        self.seen_checks = len(self.p.written.checks)
        self.check_written()

    @rule(ms=st.sampled_from([100, 1000, 2500, 5000]))
    def tick(self, ms: int) -> None:
        self.p.now += ms

    @rule()
    def restart(self) -> None:
        # The documented limit of coordinator/copies.py: a copy read after a takeover whose
        # first record lies below the committed half offset is a transaction of its own.
        committed = self.started_at = self.p.committed[0]
        self.exempt |= {
            txn for at, txn in self.copies.items() if at >= committed > self.firsts[txn]
        }
        self.p.restart()

    @rule()
    def settle(self) -> None:
        """The producers stay up answering checks with their final decision, the clock runs,
        the coordinator reads everything, until nothing moves; then all is decided."""
        p = self.p
        for _ in range(SETTLE_ROUNDS):
            before = (len(p.half), len(p.op))
            for which in ("half", "op"):
                p.read(which, 1 << 30)
                p.eof(which)
            for index, check in enumerate(
                p.written.checks[self.settled_checks :], self.settled_checks
            ):
                t = self.txns_by_id[check.txn_id]
                p.append_op(
                    EndRequest(
                        t.id,
                        GROUP,
                        0,
                        check.half_offset,
                        self.decided_checks.get(index, t.final),
                        True,
                        check.check_seq,
                        self._now(),
                    )
                )
            self.settled_checks = len(p.written.checks)
            self._step()
            if (len(p.half), len(p.op)) == before == p.committed:
                break
            p.now += SETTINGS.check_interval_ms
        assert p.committed == (len(p.half), len(p.op)), (
            f"committed {p.committed} of {(len(p.half), len(p.op))} after settling"
        )
        finals = self._finals()
        for t in self.txns_by_id.values():
            if t.id in self.exempt:
                continue
            assert finals.get(t.id), f"{t.id} never decided"
            if finals[t.id] == {Outcome.DISCARDED}:
                continue  # check_written() allowed it
            first = self._first(t)[0]
            want = Outcome.COMMITTED if first is EndState.COMMIT else Outcome.ROLLED_BACK
            assert finals[t.id] == {want}, f"{t.id}: first decision {first}, got {finals[t.id]}"

    # -- the model -------------------------------------------------------------------------------
    def _first(self, t: Txn) -> tuple[EndState | None, int]:
        """The first COMMIT or ROLLBACK of ``t``'s own group, and the distinct check seqs
        answered UNKNOW before it."""
        offsets = {o for o, (txn, _) in self.p.member.items() if txn == t.id} | {
            o for o, txn in self.copies.items() if txn == t.id
        }
        unknown: set[int] = set()
        for at, r in self.p.requests():
            if (
                r.txn_id != t.id
                or r.producer_group != GROUP
                or r.half_offset not in offsets
                or at not in self.p.authentic
            ):  # forged in the group's name (tenancy)
                continue
            if r.state in decisive:
                return r.state, len(unknown)
            if r.from_check:
                unknown.add(r.check_seq)
        return None, len(unknown)

    def _finals(self) -> dict[str, set[Outcome]]:
        out: dict[str, set[Outcome]] = defaultdict(set)
        for _, e in self.p.written.done:
            if e.outcome in FINAL and e.half_offset in self.p.member:
                out[e.txn_id].add(e.outcome)
        return out

    def check_written(self) -> None:
        """The promises over everything the coordinator has written so far."""
        written, member = self.p.written, self.p.member
        # A transaction whose copy met the documented limit (see restart) is two to the
        # coordinator: nothing is asserted of it.
        promoted = Counter(m for m in written.promoted if m[0] not in self.exempt)
        assert all(n == 1 for n in promoted.values()), f"promoted twice: {promoted}"
        decided = Counter(
            (member[e.half_offset], e.outcome)
            for _, e in written.done
            if e.outcome in FINAL and e.half_offset in member and e.txn_id not in self.exempt
        )
        assert all(n == 1 for n in decided.values()), f"a member decided twice: {decided}"
        for txn, outcomes in self._finals().items():
            if txn in self.exempt:
                continue
            t = self.txns_by_id[txn]
            assert len(outcomes) == 1, f"{txn} decided {outcomes}"
            first, unknown = self._first(t)
            [outcome] = outcomes
            if outcome is Outcome.COMMITTED:
                assert first is EndState.COMMIT, f"{txn} promoted, first decision {first}"
                assert {(txn, i) for i in range(t.size)} <= set(promoted), f"{txn} in part"
            elif outcome is Outcome.ROLLED_BACK:
                assert first is EndState.ROLLBACK, f"{txn} rolled back, first {first}"
            else:
                assert unknown >= SETTINGS.check_max, f"{txn} discarded, {unknown} UNKNOW"
        assert set(promoted) == {m for (m, o) in decided if o is Outcome.COMMITTED}
        resolved = {e.half_offset for _, e in written.done}
        passed = [o for o in range(self.p.committed[0]) if o not in resolved]
        assert not passed, f"committed half offset {self.p.committed[0]} passes {passed}"


TestTxnMachine = TxnMachine.TestCase


def test_trusting_an_unsigned_marker_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted defect: a marker without a MAC is trusted (anyone may write the Op topic).
    Hypothesis finds a forged done marker deciding a transaction."""
    verdict = MarkerVerifier.verdict

    def lax(self: MarkerVerifier, partition: int, offset: int, record: object) -> Verdict:
        if getattr(record, "mac", None) is None:
            return Verdict.LEGACY
        return verdict(self, partition, offset, record)

    monkeypatch.setattr(MarkerVerifier, "verdict", lax)
    found = find_failure(TxnMachine)
    assert isinstance(found.error, AssertionError), found.report
    # Shrunk to: a transaction, a marker without a MAC for it, the coordinator reading both.
    assert len(found.steps) <= 4, found.report
    assert found.steps[0].startswith("state.begin("), found.report
    assert any(
        s.startswith("state.forge_marker(kind='unsigned'")
        or s.startswith("state.forge_marker(kind='v1'")
        for s in found.steps
    ), found.report


def test_dropping_the_producer_group_check_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted defect: an end request is applied whatever producer group sent it. Hypothesis
    finds another group deciding a transaction."""
    apply_end = PartitionState._apply_end

    def any_group(self: PartitionState, request: EndRequestIn, now_ms: int) -> list:
        anchor = self.assemblies.anchor(request.half_offset)
        entry = self.pending.get(request.half_offset if anchor is None else anchor)
        if entry is not None:
            request = dataclasses.replace(request, producer_group=entry.half.producer_group)
        return apply_end(self, request, now_ms)

    monkeypatch.setattr(PartitionState, "_apply_end", any_group)
    found = find_failure(TxnMachine)
    assert isinstance(found.error, AssertionError), found.report
    # Shrunk to: a transaction, another group's COMMIT for it, the coordinator reading both.
    assert len(found.steps) <= 4, found.report
    assert found.steps[0].startswith("state.begin("), found.report
    assert any(s.startswith("state.end(own=False, state=<EndState.COMMIT") for s in found.steps), (
        found.report
    )


def test_forgetting_copies_of_a_half_record_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted defect: a copy of a half record (the same transaction id at a later offset)
    is read as a transaction of its own. Hypothesis finds the message promoted twice."""
    monkeypatch.setattr(PartitionState, "_roll_back_copy", lambda self, *args: None)
    found = find_failure(TxnMachine)
    assert isinstance(found.error, AssertionError), found.report
    assert any(s.startswith("state.copy_half(") for s in found.steps), found.report
