"""One half/Op partition pair and a coordinator over it, in memory, for the transaction
state machine (tests/unit/test_model_txn.py).

The coordinator is the real one minus Kafka: ``TransactionService._dispatch_guarded`` parses
and routes every record (marker authentication included) into the real ``PartitionState``;
a step asks it what is due and writes the batch as ``TransactionWriter`` does (the same
records: promotions, signed done and check markers, check requests, re-appended half
records), together with the offsets to commit, all or nothing. A restart is a new service
reading from the committed offsets, as a new owner or a replay after an abort does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field

from confluent_kafka import KafkaError

from coordinator.marker_auth import MarkerKey, MarkerVerifier
from coordinator.promote import _OUTCOME
from coordinator.settings import CoordinatorSettings
from coordinator.state import (
    Action,
    Discard,
    Finish,
    IssueCheck,
    LateCommit,
    PartitionState,
    Reappend,
    SaveCheckCounts,
    TxnState,
)
from coordinator.tenancy import Tenant, TenantGuard, resign
from coordinator.txn_service import TransactionService, new_partition_state
from rmq_semantics.errors import MalformedRecordError
from rmq_semantics.message import Message as UserMessage
from rmq_semantics.records.codec import SystemRecord, decode, encode
from rmq_semantics.records.group_auth import (
    GroupKey,
    derive_group_key,
    op_canonical,
    sign_half_headers,
)
from rmq_semantics.records.half import half_headers
from rmq_semantics.records.headers import H
from rmq_semantics.records.reappend import reappended_headers
from rmq_semantics.records.txn import (
    CheckMarker,
    CheckRequest,
    DoneEntry,
    DoneMarkers,
    EndRequest,
    EndRequests,
    Outcome,
)
from rmq_semantics.topics import SystemTopics
from tests.fuzz.generators import Raw
from tests.fuzz.sim import Message

PREFIX = "model"
TOPICS = SystemTopics(PREFIX)
REAL_TOPIC = "orders"
GROUP = "pg"  # the producers' group
OTHER_GROUP = "intruder"  # another tenant: its own key, its own topic
OWN = "<own>"
TENANT_KEY = b"the model coordinators' tenant key"
TENANTS = {
    GROUP: Tenant(GROUP, "User:pg", frozenset({REAL_TOPIC})),
    OTHER_GROUP: Tenant(OTHER_GROUP, "User:intruder", frozenset({"intruder-topic"})),
}
KEY = MarkerKey(b"the model coordinators' marker key")
T0 = 1_700_000_000_000
# Short timings (tests/integration/txn_helpers.FAST's shape): re-appends after 3 intervals.
SETTINGS = CoordinatorSettings(
    topic_prefix=PREFIX,
    half_partitions=1,
    check_partitions=1,
    transaction_timeout_ms=1000,
    check_interval_ms=1000,
    check_max=2,
)
FINAL = frozenset({Outcome.COMMITTED, Outcome.ROLLED_BACK, Outcome.DISCARDED})


def group_key(group: str) -> GroupKey:
    return derive_group_key(TENANT_KEY, group)


def half_record(txn: str, size: int, index: int, now: int) -> Raw:
    """A half record as ``TransactionProducer`` / ``send_transaction`` writes it."""
    msg = UserMessage(REAL_TOPIC, f"{txn}/{index}".encode(), key=b"k")
    headers = list(half_headers(msg, txn, GROUP.encode(), str(now).encode()))
    if size > 1:
        headers += [(H.TXN_SIZE, str(size).encode()), (H.TXN_INDEX, str(index).encode())]
    return Raw(msg.value, msg.key, headers, 0)


@dataclass
class Written:
    """What the coordinator wrote, as read back by the checks."""

    promoted: list[tuple[str, int]] = field(default_factory=list)  # (txn, member index)
    done: list[tuple[int, DoneEntry]] = field(default_factory=list)  # (op offset, entry)
    checks: list[CheckRequest] = field(default_factory=list)
    late_commits: list[str] = field(default_factory=list)


class Partition:
    """The half and Op partitions (index 0), a coordinator over them, and one clock. With
    ``tenancy``, the coordinator isolates the groups (coordinator/tenancy.py) and each
    producer signs what it writes with its group's key."""

    def __init__(self, tenancy: bool = False) -> None:
        self.tenancy = tenancy
        self.authentic: set[int] = set()  # Op offsets of end requests their group wrote
        self.now = T0
        self.half: list[tuple[Raw, int]] = []  # (record, append time)
        self.op: list[tuple[bytes | None, int]] = []
        self.member: dict[int, tuple[str, int]] = {}  # half offset -> (txn, member index)
        self.written = Written()
        self.committed = (0, 0)  # (half, op) offsets, committed with each batch
        self.restarts = 0
        self.start()

    # -- the coordinator -----------------------------------------------------------------------
    def start(self) -> None:
        """A coordinator taking the partitions over from the committed offsets."""
        self.service = TransactionService({"bootstrap.servers": "model:9092"}, SETTINGS)
        # What run() loads from the keys topic: no watermark, so only signed markers count.
        self.service._markers = MarkerVerifier(KEY, TOPICS.op, {})
        if self.tenancy:
            self.service.guard = TenantGuard(TENANTS, TENANT_KEY, TOPICS, {})
        self.state: PartitionState = new_partition_state(0, SETTINGS, None)
        self.state.start_at(*self.committed)
        self.service.states[0] = self.state
        self.position = list(self.committed)  # next half and op offsets it reads
        self.eof_due = {"half", "op"}
        self.batch: list[Action] = []  # decided, not written yet

    def restart(self) -> None:
        """The coordinator dies before writing its batch; another reads from the commits."""
        self.restarts += 1
        self.start()

    def read(self, which: str, most: int) -> None:
        log = self.half if which == "half" else self.op
        i = 0 if which == "half" else 1
        for _ in range(most):
            offset = self.position[i]
            if offset >= len(log):
                return
            raw, ts = log[offset]
            raw = raw if isinstance(raw, Raw) else Raw(raw)
            topic = TOPICS.half if which == "half" else TOPICS.op
            self.position[i] += 1
            self.eof_due.add(which)
            self.batch += self.service._dispatch_guarded(
                Message(topic, 0, offset, raw, ts), self.now
            )

    def at_end(self, which: str) -> bool:
        i, log = (0, self.half) if which == "half" else (1, self.op)
        return self.position[i] >= len(log)

    def eof(self, which: str) -> None:
        """The end of a partition, reported once per time the reader gets there."""
        if which in self.eof_due and self.at_end(which):
            self.eof_due.discard(which)
            topic = TOPICS.half if which == "half" else TOPICS.op
            err = KafkaError(KafkaError._PARTITION_EOF)
            self.batch += self.service._dispatch_guarded(
                Message(topic, 0, self.position[0 if which == "half" else 1], None, self.now, err),
                self.now,
            )

    def step(self) -> list[Action]:
        """What is due, then the batch and the offsets to commit in one transaction."""
        actions, self.batch = [*self.batch, *self.state.due(self.now)], []
        if self.state.wants_half_end(self.now):
            self.eof_due.add("half")  # the service seeks to its position: an end again
        self._write(actions, (self.state.half_commit, self.state.op_commit))
        return actions

    # -- the writer (coordinator/promote.py's records) ------------------------------------------
    def _write(self, actions: list[Action], offsets: tuple[int, int]) -> None:
        done: list[DoneEntry] = []
        for action in actions:
            if isinstance(action, LateCommit):
                self.written.late_commits.append(action.txn_id)
            elif isinstance(action, Finish | Discard):
                outcome = action.outcome if isinstance(action, Finish) else TxnState.DISCARDED
                for half in action.records:
                    if outcome is TxnState.COMMITTED:
                        self.written.promoted.append((half.txn_id, half.txn_index))
                    done.append(
                        DoneEntry(
                            half.offset, half.txn_id, _OUTCOME[outcome], action.checks_answered
                        )
                    )
            elif isinstance(action, IssueCheck | SaveCheckCounts):
                if isinstance(action, IssueCheck):
                    self.written.checks.append(
                        CheckRequest.of_half(action.half, action.check_seq, self.now)
                    )
                self._op(
                    CheckMarker(
                        action.half.offset,
                        action.half.txn_id,
                        action.checks_issued,
                        action.checks_answered,
                        action.answered_seq,
                        action.next_check_ts,
                        self.now,
                    )
                )
            elif isinstance(action, Reappend):
                for half in action.records:
                    carried = dataclasses.replace(action.carried, previous_offset=half.offset)
                    self.member[len(self.half)] = (half.txn_id, half.txn_index)
                    headers = resign(self.service.guard, half, reappended_headers(half, carried))
                    self.half.append((Raw(half.value, half.key, headers, 0), self.now))
                    done.append(
                        DoneEntry(
                            half.offset,
                            half.txn_id,
                            Outcome.REAPPENDED,
                            action.carried.checks_answered,
                        )
                    )
        if done:
            at = len(self.op)
            self._op(DoneMarkers(tuple(done), self.now))
            self.written.done += [(at, entry) for entry in done]
        self.committed = offsets

    def _op(self, record: SystemRecord) -> None:
        self.op.append((encode(KEY.sign(TOPICS.op, 0, record)), self.now))

    # -- producers and adversaries ----------------------------------------------------------------
    def append_half(self, raw: Raw, member: tuple[str, int] | None = None) -> int:
        """A half record; a ``member`` of a producer's transaction is signed by its group."""
        if member is not None:
            self.member[len(self.half)] = member
            if self.tenancy:
                raw = dataclasses.replace(
                    raw,
                    headers=sign_half_headers(group_key(GROUP), raw.headers, raw.key, raw.value),
                )
        self.half.append((raw, self.now))
        return len(self.half) - 1

    def append_op(self, value: bytes | SystemRecord | None, signer: str | None = OWN) -> int:
        """An Op record; with tenancy, an end request signed by the key of ``signer`` (OWN:
        the group it names, so authentic; None: unsigned)."""
        group = getattr(value, "producer_group", None)
        if value is not None and not isinstance(value, bytes):
            value = encode(value)
        signer = group if signer is OWN else signer
        if group is not None and (not self.tenancy or signer == group):
            self.authentic.add(len(self.op))
        if self.tenancy and signer in TENANTS:
            mac = group_key(signer).mac(op_canonical(TOPICS.op, 0, value))
            value = Raw(value, None, [(H.GROUP_MAC, mac)], 0)
        self.op.append((value, self.now))
        return len(self.op) - 1

    def requests(self) -> Iterator[tuple[int, EndRequest]]:
        """Every end request in the Op partition, in order, one per decision: (op offset,
        request); a batch's entries come as requests of its producer group."""
        for offset, (value, _) in enumerate(self.op):
            value = value.value if isinstance(value, Raw) else value
            try:
                record = decode(value)
            except MalformedRecordError:  # garbage is what some rules append
                continue
            if isinstance(record, EndRequest):
                yield offset, record
            elif isinstance(record, EndRequests):
                for e in record.entries:
                    yield (
                        offset,
                        EndRequest(
                            e.txn_id,
                            record.producer_group,
                            record.half_partition,
                            e.half_offset,
                            e.state,
                            False,
                            0,
                            record.ts,
                        ),
                    )
