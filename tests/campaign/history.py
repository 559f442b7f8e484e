"""The campaign's recorded history: JSON lines, one event per line, one file per process.

Format (version 1)
------------------
Every line is one JSON object with these common fields, then the kind's own fields:

- ``kind``: one of :class:`Kind` (below);
- ``wall_ms``: ``time.time()`` in ms of the writing process (skewed under libfaketime);
- ``mono_s``: ``time.monotonic()`` of the writing process. CLOCK_MONOTONIC is one clock per
  host, shared by every process, and libfaketime leaves it alone
  (``FAKETIME_DONT_FAKE_MONOTONIC=1``), so ``mono_s`` orders events across processes;
- ``proc``: the writing process's name (``producer-1``, ``coordinator-2``, ``harness``);
- ``pid``; ``seq``: 0, 1, 2... per Recorder, so equal ``mono_s`` keep their write order.

Times *inside* an event are wall ms (``*_ms``) of the process that knows them: the lock
service's grant and lease times are the coordinator's clock, a batch's times the consumer's.
Only producer processes run with a skewed clock, so the checkers compare producer times by
``mono_s`` only. Unknown extra fields are kept and ignored (add fields freely; new kinds go
into :class:`Kind`).

Kinds and their fields (``?`` = may be null or left out):

producer side
  ``send``          txn_id, group, topics[], keys[], msg_ids[], intent (:class:`Intent`),
                    bodies[]?, api? ("sync" | "send_transaction" | "aio")
  ``send_failed``   txn_id?, group, error, msg_ids[]?
  ``local_committed`` / ``local_rolled_back``   txn_id, group, db, row
  ``check_answered``  txn_id, group, answer ("COMMIT" | "ROLLBACK" | "UNKNOW"), checks?
  ``group_state``   group, up (bool): the harness's view of a producer group (all its
                    processes stopped or paused = down); the liveness horizon pauses while down
  ``committed_row`` txn_id, msg_id, topic, key?, db: the ground truth, one per message row
                    read from the local databases at the end of the run
  ``timer_send``    msg_id, group, topic, key?, how ("at" | "after" | "level"), delay_ms,
                    level?, deliver_at_ms? ("at": the exact time asked), recall (bool:
                    planned), wall_before_ms: a timer message about to be sent (before
                    ``Producer.send``: a send killed midway is still known)
  ``timer_sent``    msg_id, ok (bool), message_id?, deliver_lo_ms?, deliver_hi_ms?,
                    clock_jump (bool)?, error?: what the send returned; [lo, hi] bounds
                    the ``rmq.deliver_at`` the producer wrote, in its own wall clock
                    (clock_jump: that clock moved by more than the monotonic one meanwhile)
  ``timer_recalled`` msg_id, ok (bool), message_id, error?: ``recall_message`` acknowledged
                    (the event's ``mono_s``) or failed
consumer side
  ``subscribe``     consumer ("orderly" | "push" | "spark" | "simple"), group, instance,
                    topics[], mode? ("partition" | "key", orderly only), pattern? (a regex
                    subscription: the group's topics are then every final-read topic it
                    matches, too), settings{}? (simple: max_attempts, invisible_ms,
                    commit_interval_ms)
  ``simple``        event ("received" | "ack_ok" | "ack_refused" | "changed" |
                    "change_refused"), group, instance (the worker process's name), topic,
                    partition, offset, msg_id, message_group?, attempt? (received: the
                    ``delivery_attempt``): one SimpleConsumer call on one message, written
                    after the call returned; one thread per instance, so its events are in
                    the order of its calls
  ``consumed``      consumer, group, instance, topic, partition, offset, key?, msg_id,
                    result? ("SUCCESS" default | "RECONSUME_LATER" | "SUSPEND"); key is the
                    ordering key (the rmq.message_group header, else the record key); a
                    push call's add reconsume_times, retry_topic? and start_mono_s (the
                    call's start; the event is recorded at its end)
  ``batch``         queue ("group/topic/partition"), instance, epoch, lease_granted_ms,
                    lease_valid_until_ms, start_ms, end_ms, offsets[], committed (bool),
                    commit_ms?
  ``lock_grant``    queue, consumer, epoch, granted_ms, valid_until_ms (renewals too)
  ``lock_release``  queue, consumer, epoch, released_ms
  ``push_retry``    group, msg_id, topic, partition, offset, reconsume_times, retry_topic?
  ``dlq``           consumer, group, msg_id, topic, partition, offset, reason?
  ``final_read``    topic, partition, offset, key?, msg_id?, txn_id?, headers{}: one record
                    read read_committed by Apache Kafka's Java client after the run; msg_id
                    is the workload's own id (its header, e.g. ``campaign.msg_id``), txn_id
                    the ``rmq.txn_id`` header, headers all of them as text
  ``spark_row``     msg_id, topic?, partition?, offset?: one row of the Spark job's output
faults, processes, cluster
  ``fault``         fault (kind of fault), target, start_ms, end_ms?, seed
  ``exit``          role ("coordinator" | "producer" | "consumer" | "broker"), process, code,
                    killed_by_nemesis (bool), stopped (bool: the harness asked it to stop)
  ``leader_change`` / ``lock_takeover`` / ``rebalance`` / ``fenced_producer``
                    count (default 1), detail?
  ``run``           phase ("start" | "settled" | "end"), seed?, params{}?
what the workload records besides (diagnostics; no checker needs them)
  ``worker``        state ("start" | "ready" | "drained" | "stopped"), role?, group?, api?:
                    a worker process's life; the runner waits on ready and drained
  ``topic_created`` topic, partitions?: a producer created a topic mid-run (used at once)
  ``sent``          txn_id, group, state, half?: what ``send_*`` returned (the local state)
  ``orderly_event`` event ("lock_granted" | "lock_lost" | "committed" | "commit_skipped" |
                    "dlq"), instance, group, topic?, partition?, offset?, epoch?, reason?:
                    the OrderlyConsumer's protocol events (its log records with rmq_event)
  ``status``        instance, queues[]? | counts{}?: a consumer's public status() each second
  ``note``          what, detail?: the harness's phases and remarks

Build events with the typed constructors of :mod:`tests.campaign.events` and append them with
``Recorder.emit``; ``Recorder.record(kind, **fields)`` is the untyped spelling.

Files: every process writes its own file (``<dir>/<proc>.jsonl``) with a :class:`Recorder`;
:func:`load` merges files and directories. A process killed mid-write leaves a torn last
line: it is counted (``History.torn``), not an error. Any other bad line is set aside in
``History.bad`` with ``file:line`` and a reason.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import IO, Any

__all__ = ["BadLine", "Draft", "Event", "History", "Intent", "Kind", "Recorder", "at", "load"]

FORMAT_VERSION = 1


class Kind(StrEnum):
    SEND = "send"
    SEND_FAILED = "send_failed"
    LOCAL_COMMITTED = "local_committed"
    LOCAL_ROLLED_BACK = "local_rolled_back"
    CHECK_ANSWERED = "check_answered"
    GROUP_STATE = "group_state"
    COMMITTED_ROW = "committed_row"
    TIMER_SEND = "timer_send"
    TIMER_SENT = "timer_sent"
    TIMER_RECALLED = "timer_recalled"
    SUBSCRIBE = "subscribe"
    CONSUMED = "consumed"
    BATCH = "batch"
    LOCK_GRANT = "lock_grant"
    LOCK_RELEASE = "lock_release"
    PUSH_RETRY = "push_retry"
    DLQ = "dlq"
    FINAL_READ = "final_read"
    SPARK_ROW = "spark_row"
    FAULT = "fault"
    EXIT = "exit"
    LEADER_CHANGE = "leader_change"
    LOCK_TAKEOVER = "lock_takeover"
    REBALANCE = "rebalance"
    FENCED_PRODUCER = "fenced_producer"
    RUN = "run"
    WORKER = "worker"
    TOPIC_CREATED = "topic_created"
    SENT = "sent"
    ORDERLY_EVENT = "orderly_event"
    SIMPLE = "simple"
    STATUS = "status"
    NOTE = "note"


class Intent(StrEnum):
    """What the workload meant a transaction to end as (the DB rows are the ground truth)."""

    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    UNKNOW_THEN_COMMIT = "UNKNOW_then_COMMIT"
    UNKNOW_THEN_ROLLBACK = "UNKNOW_then_ROLLBACK"
    SLOW_LOCAL_TXN = "slow_local_txn"


# Fields an event of each kind must carry (beyond the common ones); the rest are optional.
REQUIRED: dict[Kind, tuple[str, ...]] = {
    Kind.SEND: ("txn_id", "group", "topics", "msg_ids", "intent"),
    Kind.SEND_FAILED: ("group", "error"),
    Kind.LOCAL_COMMITTED: ("txn_id", "group"),
    Kind.LOCAL_ROLLED_BACK: ("txn_id", "group"),
    Kind.CHECK_ANSWERED: ("txn_id", "group", "answer"),
    Kind.GROUP_STATE: ("group", "up"),
    Kind.COMMITTED_ROW: ("txn_id", "msg_id", "topic"),
    Kind.TIMER_SEND: ("msg_id", "group", "topic", "how", "delay_ms", "recall"),
    Kind.TIMER_SENT: ("msg_id", "ok"),
    Kind.TIMER_RECALLED: ("msg_id", "ok", "message_id"),
    Kind.SUBSCRIBE: ("consumer", "group", "instance", "topics"),
    Kind.CONSUMED: ("consumer", "group", "instance", "topic", "partition", "offset", "msg_id"),
    Kind.BATCH: (
        "queue",
        "instance",
        "epoch",
        "lease_valid_until_ms",
        "start_ms",
        "end_ms",
        "committed",
    ),
    Kind.LOCK_GRANT: ("queue", "consumer", "epoch", "granted_ms", "valid_until_ms"),
    Kind.LOCK_RELEASE: ("queue", "consumer", "epoch", "released_ms"),
    Kind.PUSH_RETRY: ("group", "msg_id"),
    Kind.DLQ: ("group", "msg_id"),
    Kind.FINAL_READ: ("topic", "partition", "offset"),
    Kind.SPARK_ROW: ("msg_id",),
    Kind.FAULT: ("fault", "target", "start_ms"),
    Kind.EXIT: ("role", "process", "code", "killed_by_nemesis"),
    Kind.LEADER_CHANGE: (),
    Kind.LOCK_TAKEOVER: (),
    Kind.REBALANCE: (),
    Kind.FENCED_PRODUCER: (),
    Kind.RUN: ("phase",),
    Kind.WORKER: ("state",),
    Kind.TOPIC_CREATED: ("topic",),
    Kind.SENT: ("txn_id", "group", "state"),
    Kind.ORDERLY_EVENT: ("event", "instance", "group"),
    Kind.SIMPLE: ("event", "group", "instance", "topic", "partition", "offset", "msg_id"),
    Kind.STATUS: ("instance",),
    Kind.NOTE: ("what",),
}
COMMON = ("kind", "wall_ms", "mono_s", "proc", "pid", "seq")


@dataclass(frozen=True)
class Event:
    """One recorded event: the common fields, and the kind's own in ``data``."""

    kind: Kind
    mono_s: float
    wall_ms: int
    proc: str
    pid: int = 0
    seq: int = 0
    data: Mapping[str, Any] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Any:
        return self.data[name]

    def get(self, name: str, default: Any = None) -> Any:
        value = self.data.get(name, default)
        return default if value is None else value

    def to_json(self) -> str:
        return json.dumps(
            {
                "kind": self.kind.value,
                "wall_ms": self.wall_ms,
                "mono_s": self.mono_s,
                "proc": self.proc,
                "pid": self.pid,
                "seq": self.seq,
                **self.data,
            },
            separators=(",", ":"),
            sort_keys=False,
            default=str,
        )

    @property
    def where(self) -> str:
        """``topic[partition]@offset`` of a record-shaped event (consumed, final_read, dlq)."""
        return f"{self.data.get('topic')}[{self.data.get('partition')}]@{self.data.get('offset')}"


@dataclass(frozen=True)
class Draft:
    """An event's kind and fields before a Recorder stamps it (see events.py)."""

    kind: Kind
    fields: Mapping[str, Any]


@dataclass(frozen=True)
class BadLine:
    path: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}"


def _fields(kind: Kind, fields: Mapping[str, Any]) -> dict[str, Any]:
    """``fields`` without None values, checked against the kind's required fields."""
    data = {
        k: (v.value if isinstance(v, StrEnum) else v) for k, v in fields.items() if v is not None
    }
    missing = [name for name in REQUIRED[kind] if name not in data]
    if missing:
        raise ValueError(f"a {kind.value} event needs {', '.join(missing)}")
    clash = [name for name in data if name in COMMON]
    if clash:
        raise ValueError(f"a {kind.value} event may not set the common fields {clash}")
    return data


def at(
    draft: Draft, mono_s: float, *, proc: str = "test", wall_ms: int | None = None, seq: int = 0
) -> Event:
    """``draft`` as if recorded at ``mono_s`` (wall ms = mono_s * 1000 unless given): for
    planted histories in tests."""
    wall = int(mono_s * 1000) if wall_ms is None else wall_ms
    return Event(draft.kind, float(mono_s), wall, proc, 0, seq, _fields(draft.kind, draft.fields))


class Recorder:
    """Appends events of one process to its own file; safe to share between threads.

    Each event is one ``write`` of a whole line under a lock and flushed at once (by
    default), so a SIGKILL loses at most the line being written, which :func:`load` counts
    as torn. Use as a context manager, or call :meth:`close`.
    """

    def __init__(
        self, path: str | os.PathLike[str], proc: str, *, flush_every: int = 1, fsync: bool = False
    ) -> None:
        if flush_every < 1:
            raise ValueError(f"flush_every must be >= 1, got {flush_every}")
        self.path = Path(path)
        self.proc = proc
        self._flush_every = flush_every
        self._fsync = fsync
        self._lock = threading.Lock()
        self._seq = 0
        self._unflushed = 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = open(self.path, "a", encoding="utf-8")  # noqa: SIM115

    def record(self, kind: Kind | str, **fields: Any) -> Event:
        """Stamp ``fields`` as a ``kind`` event now and append it; returns the event."""
        kind = Kind(kind)
        data = _fields(kind, fields)
        with self._lock:
            if self._file is None:
                raise ValueError(f"recorder {self.proc} ({self.path}) is closed")
            event = Event(
                kind,
                time.monotonic(),
                time.time_ns() // 1_000_000,
                self.proc,
                os.getpid(),
                self._seq,
                data,
            )
            self._seq += 1
            self._file.write(event.to_json() + "\n")
            self._unflushed += 1
            if self._unflushed >= self._flush_every:
                self._flush_locked()
        return event

    def emit(self, draft: Draft) -> Event:
        """Append an event built by a constructor of :mod:`tests.campaign.events`."""
        return self.record(draft.kind, **draft.fields)

    def flush(self) -> None:
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        if self._file is None:
            return
        self._file.flush()
        if self._fsync:
            os.fsync(self._file.fileno())
        self._unflushed = 0

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._flush_locked()
                self._file.close()
                self._file = None

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class History:
    """Events of every file, ordered by ``(mono_s, proc, seq)``; what could not be read."""

    events: list[Event]
    paths: list[str] = field(default_factory=list)
    bad: list[BadLine] = field(default_factory=list)
    torn: list[BadLine] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.events.sort(key=lambda e: (e.mono_s, e.proc, e.seq))
        self._by_kind: dict[Kind, list[Event]] = {}
        for event in self.events:
            self._by_kind.setdefault(event.kind, []).append(event)

    def of(self, *kinds: Kind) -> list[Event]:
        """Events of these kinds, in history order."""
        if len(kinds) == 1:
            return list(self._by_kind.get(kinds[0], ()))
        wanted = set(kinds)
        return [e for e in self.events if e.kind in wanted]

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)

    def __len__(self) -> int:
        return len(self.events)

    @property
    def seed(self) -> int | None:
        for event in self.of(Kind.RUN):
            if event.get("seed") is not None:
                return int(event["seed"])
        for event in self.of(Kind.FAULT):
            if event.get("seed") is not None:
                return int(event["seed"])
        return None


def _parse_line(text: str) -> Event:
    obj = json.loads(text)
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    try:
        kind = Kind(obj.get("kind"))
    except ValueError:
        raise ValueError(f"unknown kind {obj.get('kind')!r}") from None
    for name, typ in (("wall_ms", (int, float)), ("mono_s", (int, float)), ("proc", str)):
        if not isinstance(obj.get(name), typ) or isinstance(obj.get(name), bool):
            raise ValueError(f"{name} missing or of the wrong type: {obj.get(name)!r}")
    data = {k: v for k, v in obj.items() if k not in COMMON}
    missing = [name for name in REQUIRED[kind] if data.get(name) is None]
    if missing:
        raise ValueError(f"{kind.value} without {', '.join(missing)}")
    return Event(
        kind,
        float(obj["mono_s"]),
        int(obj["wall_ms"]),
        obj["proc"],
        int(obj.get("pid") or 0),
        int(obj.get("seq") or 0),
        data,
    )


def _files(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        out.extend(sorted(p.glob("*.jsonl")) if p.is_dir() else [p])
    return out


def load(paths: Iterable[str | os.PathLike[str]] | str | os.PathLike[str]) -> History:
    """Merge the history files (or directories of ``*.jsonl``) into one :class:`History`."""
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    events: list[Event] = []
    bad: list[BadLine] = []
    torn: list[BadLine] = []
    files = _files(paths)
    for path in files:
        raw = path.read_bytes().decode("utf-8", errors="replace")
        lines = raw.split("\n")
        ends_clean = raw.endswith("\n") or raw == ""
        for number, text in enumerate(lines, 1):
            if not text.strip():
                continue
            try:
                events.append(_parse_line(text))
            except ValueError as exc:  # JSONDecodeError is a ValueError
                where = BadLine(str(path), number, str(exc))
                # Only the unterminated last line is a torn write; anything else is bad.
                (torn if number == len(lines) and not ends_clean else bad).append(where)
    return History(events, [str(f) for f in files], bad, torn)
