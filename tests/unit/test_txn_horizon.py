"""The re-append horizon in the pure state machine: an abandoned transaction pins neither the
offsets to commit nor memory, and a late decision addressed to an old offset still resolves
its transaction exactly once, also after a restart."""

from __future__ import annotations

from collections import Counter

import pytest

from coordinator.horizon import MAX_REAPPENDS_PER_STEP
from coordinator.settings import CoordinatorSettings
from coordinator.state import (
    Discard,
    EndRequest,
    Finish,
    IssueCheck,
    PartitionState,
    Reappend,
    SaveCheckCounts,
    TxnState,
)
from rmq_semantics.cli import build_parser
from rmq_semantics.errors import ConfigError, MalformedRecordError
from rmq_semantics.records.half import HalfMessage, parse_half
from rmq_semantics.records.headers import REAPPEND_HEADERS, H
from rmq_semantics.records.reappend import Carried, reappended_headers, split_reappended
from rmq_semantics.settings import load

T0 = 1_000_000
HORIZON_MS = 20_000


def half(offset: int, ts: int = T0, txn: str | None = None) -> HalfMessage:
    txn = txn or f"t{offset}"
    headers = [
        ("app", b"1"),
        (H.TXN_ID, txn.encode()),
        (H.REAL_TOPIC, b"orders"),
        (H.PRODUCER_GROUP, b"pg"),
        (H.BORN_TS, str(ts).encode()),
    ]
    return parse_half(0, offset, ts, b"k", f"v{offset}".encode(), headers)


def end(op: int, offset: int, state: str, txn: str, *, seq: int = 0) -> EndRequest:
    return EndRequest(op, txn, "pg", offset, state, seq > 0, seq, T0)


class Log:
    """The half and Op partitions around one PartitionState, in memory: what the
    TransactionWriter would write is appended here and read back, as the coordinator does."""

    def __init__(self, state: PartitionState) -> None:
        self.state = state
        self.halves: list[HalfMessage] = []  # the half partition
        self.ops: list[tuple] = []  # the Op partition: ("done", half, outcome) | ("end", req)
        self.read = (0, 0)  # next half and op offsets the state reads
        self.promoted: Counter = Counter()  # txn id -> promotions
        self.actions: list = []

    def append_half(self, ts: int, txn: str | None = None) -> int:
        offset = len(self.halves)
        self.halves.append(half(offset, ts, txn))
        return offset

    def append_end(self, offset: int, state: str, txn: str, seq: int = 0) -> None:
        self.ops.append(("end", end(len(self.ops), offset, state, txn, seq=seq)))

    def write(self, actions: list, now: int) -> None:
        """One Kafka transaction of ``actions``."""
        self.actions += actions
        for action in actions:
            h = action.half
            if isinstance(action, Finish):
                if action.outcome is TxnState.COMMITTED:
                    self.promoted[h.txn_id] += 1
                self.ops.append(("done", h.offset, action.outcome))
            elif isinstance(action, Discard):
                self.ops.append(("done", h.offset, TxnState.DISCARDED))
            elif isinstance(action, IssueCheck | SaveCheckCounts):
                self.ops.append(
                    (
                        "marker",
                        h.offset,
                        action.checks_issued,
                        action.checks_answered,
                        action.answered_seq,
                        action.next_check_ts,
                    )
                )
            elif isinstance(action, Reappend):
                offset = len(self.halves)
                self.halves.append(
                    parse_half(
                        0, offset, now, h.key, h.value, reappended_headers(h, action.carried)
                    )
                )
                self.ops.append(("done", h.offset, TxnState.REAPPENDED))

    def step(self, now: int, *, due: bool = True) -> None:
        """Read everything new (half, then Op), write what it decides, and commit."""
        state, (h, o) = self.state, self.read
        actions = []
        for offset in range(h, len(self.halves)):
            actions += state.on_half(offset, self.halves[offset], now)
        for op in range(o, len(self.ops)):
            record = self.ops[op]
            if record[0] == "end":
                actions += state.on_end_request(record[1], now)
            elif record[0] == "done":
                state.on_done_marker(op, record[1], record[2])
            else:
                state.on_check_marker(op, *record[1:])
        self.read = (len(self.halves), len(self.ops))
        if state.recovering:
            actions += state.on_eof("half", now) + state.on_eof("op", now)
        if due:
            actions += state.due(now)
        self.write(actions, now)
        state.half_commit, state.op_commit  # noqa: B018 - what the service commits (and trims)

    def restart(self, now: int) -> PartitionState:
        """A new owner: replays from the committed offsets, as txn_service._on_assign does."""
        old = self.state
        new = PartitionState(
            0,
            old.transaction_timeout_ms,
            old.check_interval_ms,
            old.check_max,
            reappend_horizon_ms=old.reappend_horizon_ms,
        )
        new.start_at(old.half_commit, old.op_commit)
        self.state, self.read = new, (new.half_position, new.op_position)
        self.step(now)
        assert not new.recovering
        return new


def new_log(horizon_ms: int | None = HORIZON_MS, check_max: int = 1000) -> Log:
    state = PartitionState(0, 6000, 60_000, check_max, reappend_horizon_ms=horizon_ms)
    state.on_eof("half", T0)
    state.on_eof("op", T0)
    return Log(state)


def _sizes(st: PartitionState) -> dict[str, int]:
    return {
        "tracked": st.tracked,
        "decided": len(st.decided),
        "outcomes": len(st.outcomes),
        "pending_heap": len(st._pending_heap),
        "decided_heap": len(st._decided_heap),
        "done_ops": len(st._done_ops),
        "marker_ops": len(st._marker_ops),
        "schedule": len(st._schedule),
        "horizon": len(st.horizon._due),
    }


def test_one_abandoned_transaction_and_200000_commits_stay_within_one_horizon():
    """The issue's measurement: 1 pending + 200,000 later commits kept every entry and left
    half_commit at 0. One record a millisecond: a horizon is 20,000 records."""
    log = new_log()
    abandoned = log.append_half(T0)
    batch, now, largest = 100, T0, Counter()
    while len(log.halves) <= 200_000:
        for _ in range(batch):
            now += 1
            offset = log.append_half(now)
            log.append_end(offset, "COMMIT", f"t{offset}")
        log.step(now)
        for name, size in _sizes(log.state).items():
            largest[name] = max(largest[name], size)
    log.step(now, due=False)  # read back what the last step wrote
    st = log.state
    traffic = HORIZON_MS + 2 * batch  # records in one horizon, and a batch either side
    assert largest["tracked"] <= traffic, largest
    # Each heap holds at most two entries per record of the last horizon.
    assert max(largest.values()) <= 2 * traffic, largest
    # The abandoned transaction is still pending, at an offset of the last horizon, and the
    # offsets to commit are no older.
    [(offset, entry)] = st.pending.items()
    assert entry.half.txn_id == f"t{abandoned}" and offset > len(log.halves) - traffic
    assert st.half_commit == offset
    assert st.op_commit > len(log.ops) - 2 * traffic
    assert sum(log.promoted.values()) == 200_000 and max(log.promoted.values()) == 1
    # Its checks went on across the re-appends: one every check interval, never restarted.
    checks = [a for a in log.actions if isinstance(a, IssueCheck)]
    assert [c.check_seq for c in checks] == list(range(1, len(checks) + 1))
    assert len(checks) == (now - T0 - 6000) // 60_000 + 1


def test_without_a_horizon_the_abandoned_transaction_pins_everything():
    """Today's behaviour when the horizon is off: what the setting fixes."""
    log = new_log(horizon_ms=None)
    log.append_half(T0)
    for i in range(1, 2001):
        log.append_end(log.append_half(T0 + i), "COMMIT", f"t{i}")
    log.step(T0 + 2000)
    assert log.state.half_commit == 0 and log.state.tracked == 2001


def _reappended_once(log: Log) -> tuple[int, int, int]:
    """An UNKNOWN transaction past the horizon, re-appended: (old offset, op offset of its
    REAPPENDED marker, now)."""
    old = log.append_half(T0)
    log.append_end(old, "UNKNOWN", f"t{old}")
    log.step(T0)
    now = T0 + HORIZON_MS
    log.step(now)
    [reappend] = [a for a in log.actions if isinstance(a, Reappend)]
    assert reappend.carried.origin_offset == old
    assert old not in log.state.pending
    return old, len(log.ops) - 1, now


def test_a_late_commit_to_the_old_offset_promotes_once_after_the_record_is_read_back():
    log = new_log()
    old, _, now = _reappended_once(log)
    log.step(now)  # reads the re-appended record back
    [new] = log.state.pending
    assert new > old and log.state.half_commit == new
    log.append_end(old, "COMMIT", f"t{old}")
    log.append_end(old, "COMMIT", f"t{old}")  # sent twice
    log.step(now)
    finishes = [a for a in log.actions if isinstance(a, Finish)]
    assert [(f.half.offset, f.half.txn_id, f.outcome) for f in finishes] == [
        (new, f"t{old}", TxnState.COMMITTED)
    ]
    assert log.promoted == Counter({f"t{old}": 1})
    assert log.state.counters["duplicate_decisions"] == 1
    # The promoted record is the producer's: no re-append header left on it.
    assert not {k for k, _ in finishes[0].half.promoted_headers()} & set(REAPPEND_HEADERS)


def test_a_late_commit_while_the_reappend_is_in_flight_waits_and_holds_its_op_offset():
    log = new_log()
    old, _, now = _reappended_once(log)
    st = log.state
    # The end request is read before the re-appended record (op and half side by side).
    log.ops.append(("end", end(len(log.ops), old, "COMMIT", f"t{old}")))
    waiting_op = len(log.ops) - 1
    assert st.on_end_request(log.ops[-1][1], now) == []
    assert st.op_commit <= waiting_op  # not committed past: a restart would read it again
    assert st.tracked == 1
    actions = st.on_half(len(log.halves) - 1, log.halves[-1], now)
    assert [(type(a), a.half.offset) for a in actions] == [(Finish, len(log.halves) - 1)]
    assert st.op_commit == waiting_op + 1 and not st.pending


def test_a_new_owner_resolves_the_old_offset_from_what_it_reads_back():
    log = new_log()
    old, _, now = _reappended_once(log)
    log.step(now)  # the re-appended record read back, offsets committed past the old one
    assert log.state.half_commit > old
    st = log.restart(now + 1)
    assert list(st.pending) == [len(log.halves) - 1]
    log.append_end(old, "COMMIT", f"t{old}")
    log.step(now + 1)
    log.append_end(old, "COMMIT", f"t{old}")
    log.restart(now + 2)  # replays the decision: never a second promotion
    log.step(now + 2)
    assert log.promoted == Counter({f"t{old}": 1})


def test_a_restart_in_the_middle_of_a_chain_of_reappends_keeps_the_origin():
    log = new_log()
    old, _, now = _reappended_once(log)
    log.step(now)
    for _ in range(2):  # two more re-appends, with other traffic and a restart
        other = log.append_half(now)
        log.append_end(other, "COMMIT", f"t{other}")
        now += HORIZON_MS
        log.step(now)
        log.step(now)
        log.restart(now)
    st = log.state
    [(current, entry)] = st.pending.items()
    assert entry.half.txn_id == f"t{old}" and current == len(log.halves) - 1
    # An answer to a check of an intermediate offset counts; the producer's COMMIT to the
    # first offset promotes.
    [intermediate] = [a.half.offset for a in log.actions if isinstance(a, Reappend)][1:2]
    log.append_end(intermediate, "UNKNOWN", f"t{old}", seq=entry.checks_issued)
    log.append_end(old, "COMMIT", f"t{old}")
    log.step(now)
    assert log.promoted[f"t{old}"] == 1
    assert [a for a in log.actions if isinstance(a, SaveCheckCounts)][-1].checks_answered == 1


def test_a_rollback_or_a_forged_request_to_the_old_offset_is_checked_against_the_record():
    log = new_log()
    old, _, now = _reappended_once(log)
    log.step(now)
    log.append_end(old, "COMMIT", "someone-else")  # not this transaction: not followed
    log.ops.append(
        ("end", EndRequest(len(log.ops), f"t{old}", "evil", old, "COMMIT", False, 0, T0))
    )
    log.step(now)
    assert not log.promoted and log.state.counters["rejected_mismatch"] == 1
    log.append_end(old, "ROLLBACK", f"t{old}")
    log.step(now)
    assert not log.state.pending and not log.promoted


def test_an_aborted_reappend_leaves_the_transaction_at_its_old_offset():
    log = new_log()
    old = log.append_half(T0)
    log.step(T0)
    actions = log.state.due(T0 + HORIZON_MS)
    assert [type(a) for a in actions] == [Reappend]
    # The Kafka transaction aborts: nothing was written; a replay rebuilds the state.
    log.state.half_commit, log.state.op_commit  # noqa: B018
    st = PartitionState(0, 6000, 60_000, 1000, reappend_horizon_ms=HORIZON_MS)
    st.start_at(0, 0)
    log.state, log.read = st, (0, 0)
    log.step(T0 + HORIZON_MS, due=False)
    assert list(st.pending) == [old]
    log.append_end(old, "COMMIT", f"t{old}")
    log.step(T0 + HORIZON_MS)
    assert log.promoted == Counter({f"t{old}": 1})


def test_reappended_counts_still_end_in_check_max_and_retention_counts_from_the_origin():
    log = new_log(check_max=2)
    log.state.reappend_horizon_ms = 50_000
    old = log.append_half(T0)
    log.step(T0)
    log.step(T0 + 6000)  # check 1
    log.append_end(old, "UNKNOWN", f"t{old}", seq=1)
    log.step(T0 + 6000)  # answered: counts
    log.step(T0 + 50_000)  # re-appended
    log.step(T0 + 50_000)  # and read back
    [(new, entry)] = log.state.pending.items()
    assert new != old and (entry.checks_issued, entry.checks_answered) == (1, 1)
    assert entry.half.timestamp_ms == T0  # what the retention discard counts from
    log.step(T0 + 66_000)  # check 2, on the new offset
    log.append_end(new, "UNKNOWN", f"t{old}", seq=2)
    log.step(T0 + 66_000)
    [discard] = [a for a in log.actions if isinstance(a, Discard)]
    assert discard.half.offset == new and discard.checks_answered == 2
    assert not {k for k, _ in discard.half.headers} & set(REAPPEND_HEADERS)


# -- the re-append headers (rmq_semantics.records.reappend) -------------------------------
def test_reappend_headers_round_trip_and_replace_an_earlier_reappends():
    original = half(3, T0, "x")
    carried = Carried(3, 1, T0 - 5, 4, 2, 3, T0 + 60_000)
    again = parse_half(0, 9, T0 + 100, b"k", b"v", reappended_headers(original, carried))
    producer_record, found = split_reappended(again)
    assert found == carried
    assert producer_record.headers == original.headers
    assert producer_record.timestamp_ms == T0 - 5 and producer_record.offset == 9
    twice = reappended_headers(again, Carried(9, 1, T0 - 5, 5, 2, 3, T0))
    assert len(twice) == len(original.headers) + len(REAPPEND_HEADERS)
    assert split_reappended(original) == (original, None)


@pytest.mark.parametrize(
    "change",
    [
        {H.CHECKS_ISSUED: None},  # incomplete
        {H.CHECKS_ISSUED: b"x"},
        {H.ORIGIN_OFFSET: b"12"},  # after its own offset
        {H.REAPPEND_OF: b"9"},  # not before this record
        {H.CHECKS_ANSWERED: b"-1"},
    ],
)
def test_reappend_headers_a_coordinator_did_not_write_are_malformed(change):
    carried = Carried(3, 1, T0, 4, 2, 3, T0)
    headers = [
        (k, change.get(k, v))
        for k, v in reappended_headers(half(3), carried)
        if not (k in change and change[k] is None)
    ]
    forged = parse_half(0, 9, T0, b"k", b"v", headers)
    with pytest.raises(MalformedRecordError):
        split_reappended(forged)
    st = new_log().state
    assert st.on_half(9, forged, T0) == [] and not st.pending
    assert st.counters["malformed_reappend"] == 1


def test_a_backlog_of_old_pending_records_is_reappended_a_thousand_per_step():
    log = new_log()
    for _ in range(2500):
        log.append_half(T0)
    log.step(T0)
    counts = []
    for _ in range(3):
        log.step(T0 + HORIZON_MS)
        counts.append(sum(isinstance(a, Reappend) for a in log.actions) - sum(counts))
    assert counts == [MAX_REAPPENDS_PER_STEP, MAX_REAPPENDS_PER_STEP, 500]


# -- the setting (coordinator.settings) ---------------------------------------------------
def test_the_horizon_defaults_to_three_check_intervals_and_comes_from_kwargs_env_or_flag():
    assert load(CoordinatorSettings, {}, env={}).reappend_after_ms == 180_000
    assert load(CoordinatorSettings, {"check_interval_ms": 1000}, env={}).reappend_after_ms == 3000
    assert (
        load(CoordinatorSettings, {}, env={"RMQ_REAPPEND_HORIZON_MS": "5000"}).reappend_after_ms
        == 5000
    )
    args = build_parser().parse_args(
        ["coordinator", "--bootstrap-servers", "b:9092", "--reappend-horizon-ms", "7000"]
    )
    assert load(CoordinatorSettings, args, env={}).reappend_after_ms == 7000


@pytest.mark.parametrize("bad", [0, -1, True, "x"])
def test_a_bad_horizon_names_the_setting(bad):
    with pytest.raises(ConfigError, match="reappend_horizon_ms"):
        load(CoordinatorSettings, {"reappend_horizon_ms": bad}, env={})
