"""Where the marker key and the upgrade watermarks of coordinator/marker_auth.py come from.

The key is the ``marker_key`` setting (env ``RMQ_MARKER_KEY``) or the content of the file
``marker_key_file`` names. With Kafka security on and neither given, the coordinator refuses
to start. With security off and neither given, one is generated and stored.

``<prefix>_keys`` (one partition, compacted; coordinators only) holds small JSON records of
four kinds. Each writer uses a record key of its own, so compaction never removes one, and
for each kind (each Op partition, for watermarks) the FIRST record in the log wins: two
coordinators starting together both write, read back from the start and agree.

- ``key``: the generated key (security off, no key given).
- ``fingerprint``: a public name of the key in use; a coordinator given another key refuses
  to start rather than ignore every marker its peers write.
- ``watermark``: the offset below which an Op partition's unsigned markers were written by
  coordinators of a release before signing, and are trusted: the partition's end when the
  first signing coordinator started, if one of those ran before; else 0 (a fresh install,
  or a partition added since: a marker found there before any coordinator ran is forged).
- ``history``: whether coordinators ran on these topics before the first signing one
  (``earlier``), written once after that start's watermarks. Decided at that start from
  this topic or, when it holds nothing, from the one trace an older release left that a
  producer cannot write: committed offsets of the coordinators' group (the README's ACLs).
- ``tenancy``: the half and Op partitions' ends when tenant isolation was first turned on
  after coordinators ran without it (else 0: a fresh install); records below them were
  written before, unsigned by their groups, and are trusted as such (coordinator/tenancy.py).
  Since issue 44 also the timer topics' (``timer``, ``timer_cancel``, ``timer_<L>``; a
  record without them: none trusted unsigned there).
"""

from __future__ import annotations

import json
import logging
import secrets
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import confluent_kafka
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from coordinator.marker_auth import MarkerKey, MarkerVerifier
from coordinator.settings import CoordinatorSettings
from rmq_semantics.clientconf import client_conf, shared_conf
from rmq_semantics.errors import ConfigError, KafkaOperationError
from rmq_semantics.records.timer import max_level
from rmq_semantics.topics import ADMIN_TIMEOUT_S, SystemTopics, topic_partition_count

__all__ = [
    "configured_key",
    "keys_topic_spec",
    "load_verifier",
    "security_on",
    "tenancy_watermarks",
]

log = logging.getLogger(__name__)

RECORD_VERSION = 1
READ_TIMEOUT_S = 30.0
WRITE_TIMEOUT_S = 30.0
KEY, FINGERPRINT, WATERMARK, HISTORY = "key", "fingerprint", "watermark", "history"
TENANCY = "tenancy"
#: Every kind of record of the keys topic (the fuzzer has a generator for each).
KINDS = (KEY, FINGERPRINT, WATERMARK, HISTORY, TENANCY)


def security_on(conf: Mapping[str, Any]) -> bool:
    """Whether the Kafka clients authenticate (any security.protocol but PLAINTEXT)."""
    return str(conf.get("security.protocol", "plaintext")).lower() != "plaintext"


def configured_key(settings: CoordinatorSettings, conf: Mapping[str, Any]) -> MarkerKey | None:
    """The key the settings give, or None (only allowed with Kafka security off)."""
    if settings.marker_key:
        return MarkerKey(settings.marker_key.encode())
    if settings.marker_key_file:
        path = Path(settings.marker_key_file)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ConfigError(
                f"--marker-key-file {path}: cannot read it ({exc.strerror or exc})"
            ) from exc
        return MarkerKey(data.strip())
    if security_on(conf):
        raise ConfigError(
            f"Kafka security is on (security.protocol={conf['security.protocol']}) but no "
            "marker key is set: give every coordinator the same key in env RMQ_MARKER_KEY or "
            "a file named by --marker-key-file"
        )
    return None


def keys_topic_spec(settings: CoordinatorSettings) -> dict[str, tuple[int, dict[str, str]]]:
    # Compacted with a record key per writer: nothing is ever deleted.
    return {SystemTopics(settings.topic_prefix).keys: (1, {"cleanup.policy": "compact"})}


def load_verifier(
    conf: dict, settings: CoordinatorSettings, key: MarkerKey | None, instance_id: str
) -> MarkerVerifier:
    """The key (generated and stored if ``key`` is None) and every Op partition's upgrade
    watermark (recorded now if missing), agreed through the keys topic."""
    topics = SystemTopics(settings.topic_prefix)
    store = _KeysTopic(conf, topics.keys, instance_id)
    try:
        records = store.read()
        if key is None:
            key = _first_key(records)
        if key is None:
            store.write([(KEY, {"key": secrets.token_urlsafe(32)})])
            records = store.read()
            key = _first_key(records)
            if key is None:
                raise KafkaOperationError(
                    f"the marker key written to {topics.keys} was not read back"
                )
            log.info("no marker key given: generated one and stored it in %s", topics.keys)
        partitions = topic_partition_count(conf, topics.op) or 0
        missing = [p for p in range(partitions) if p not in _watermarks(records)]
        wanted: list[tuple[str, dict]] = []
        if _first(records, FINGERPRINT) is None:
            wanted.append((FINGERPRINT, {"fingerprint": key.fingerprint()}))
        history = _first(records, HISTORY)
        if history is None:
            # This start decides, once: records of ours (before history existed), or an
            # older release's committed progress, say coordinators ran here before.
            earlier = any(_watermarks(records).values()) or store.had_coordinator(
                topics.coordinator_group, {topics.half, topics.op}
            )
            ends = store.end_offsets(topics.op, missing) if earlier and missing else {}
            wanted += [
                (f"{WATERMARK}/{p}", {"partition": p, "offset": ends.get(p, 0)}) for p in missing
            ]
            wanted.append((HISTORY, {"earlier": earlier}))  # after them: they landed first
        else:
            # Added since the first signing coordinator: only signed markers belong there.
            wanted += [(f"{WATERMARK}/{p}", {"partition": p, "offset": 0}) for p in missing]
        if wanted:
            store.write(wanted)
            records = store.read()
    finally:
        store.close()
    stored = _first(records, FINGERPRINT)
    if stored is None or stored.get("fingerprint") != key.fingerprint():
        raise ConfigError(
            f"this coordinator's marker key differs from the one the coordinators of prefix "
            f"{topics.prefix} use (recorded in {topics.keys}); give every coordinator the "
            "same RMQ_MARKER_KEY or --marker-key-file"
        )
    watermarks = _watermarks(records)
    if missing:
        log.info(
            "upgrade watermarks of %s: %s (unsigned markers below them are trusted)",
            topics.op,
            {p: watermarks.get(p) for p in missing},
        )
    return MarkerVerifier(key, topics.op, watermarks)


def tenancy_watermarks(
    conf: dict, settings: CoordinatorSettings, instance_id: str
) -> dict[str, dict[int, int]]:
    """Per half, Op and timer partition (``{"half": {p: offset}, "op": ..., "timer": ...,
    "timer_cancel": ..., "timer_<L>": ...}``; the timer ones since issue 44), the offset below
    which records were written before tenant isolation was on, recorded at the first start
    with it (the first record wins): the partitions' ends if coordinators ran here without
    isolation, so pending transactions of before are resolved, not set aside as forged;
    else 0 (a fresh install: a record written before any coordinator ran is a tenant's, and
    trusted unsigned it could be a forgery). A partition added since has none."""
    topics = SystemTopics(settings.topic_prefix)
    store = _KeysTopic(conf, topics.keys, instance_id)
    try:
        records = store.read()
        record = _first(records, TENANCY)
        if record is None:
            # An isolated start writes this record before any other of its own, and commits
            # nothing before it: an earlier record or committed progress is a coordinator's
            # that ran without isolation (producers can write neither, docs/security.md).
            earlier = bool(records) or store.had_coordinator(
                topics.coordinator_group, {topics.half, topics.op}
            )
            ends = {
                name: store.end_offsets(topic, list(range(topic_partition_count(conf, topic) or 0)))
                for name, topic in (
                    ("half", topics.half),
                    ("op", topics.op),
                    *_timer_topics(topics, settings.max_delay_ms),
                )
            }
            marks = {
                t: {str(p): o if earlier else 0 for p, o in e.items()} for t, e in ends.items()
            }
            # A timer topic not made yet: no field (none of its records is trusted unsigned).
            marks = {t: e for t, e in marks.items() if e or t in ("half", "op")}
            store.write([(TENANCY, marks)])
            record = _first(store.read(), TENANCY)
            if record is None:
                raise KafkaOperationError(
                    f"the tenancy watermarks written to {topics.keys} were not read back"
                )
            if earlier:
                log.info("tenant isolation on: records below %s are trusted unsigned", record)
            else:
                log.info(
                    "tenant isolation on from the first coordinator start: no record is "
                    "trusted unsigned (%s)",
                    record,
                )
    finally:
        store.close()
    return {t: {int(p): o for p, o in m.items()} for t, m in _marks(record).items()}


def _timer_topics(topics: SystemTopics, max_delay_ms: int) -> list[tuple[str, str]]:
    """(name in the tenancy record, topic) of every timer topic: intake, cancel, levels."""
    levels = [topics.timer_level(level) for level in range(1, max_level(max_delay_ms) + 1)]
    return [
        (t.removeprefix(f"{topics.prefix}_"), t)
        for t in (topics.timer, topics.timer_cancel, *levels)
    ]


def _marks(record: dict) -> dict[str, dict]:
    """The watermarks of a tenancy record: half and Op always, timer topics when present."""
    return {t: v for t, v in record.items() if t in ("half", "op") or t.startswith("timer")}


# -- the records -------------------------------------------------------------------------
def _first(records: list[dict], kind: str) -> dict | None:
    return next((r for r in records if r["kind"] == kind), None)


def _first_key(records: list[dict]) -> MarkerKey | None:
    record = _first(records, KEY)
    return None if record is None else MarkerKey(str(record["key"]).encode())


def _watermarks(records: list[dict]) -> dict[int, int]:
    out: dict[int, int] = {}
    for record in records:
        if record["kind"] == WATERMARK:
            out.setdefault(record["partition"], record["offset"])
    return out


def _parse(value: bytes | None) -> dict | None:
    """A record of the keys topic, or None for anything that is not one of ours."""
    try:
        record = json.loads(value or b"")
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(record, dict) or record.get("v") != RECORD_VERSION:
        return None
    kind = record.get("kind")
    if kind == KEY:
        valid = isinstance(record.get("key"), str)
    elif kind == FINGERPRINT:
        valid = isinstance(record.get("fingerprint"), str)
    elif kind == HISTORY:
        valid = type(record.get("earlier")) is bool
    elif kind == TENANCY:
        valid = all(
            isinstance(record.get(t), dict)
            and all(
                isinstance(p, str) and p.isdigit() and type(o) is int for p, o in record[t].items()
            )
            for t in {"half", "op", *_marks(record)}
        )
    else:
        valid = (
            kind == WATERMARK
            and type(record.get("partition")) is int
            and type(record.get("offset")) is int
        )
    return record if valid else None


class _KeysTopic:
    """Reads the keys topic from its start (read_committed) and appends records to it."""

    def __init__(self, conf: dict, topic: str, instance_id: str) -> None:
        self.topic = topic
        self.conf = conf
        self.instance_id = f"{instance_id}-{uuid.uuid4().hex[:8]}"
        self.reader = confluent_kafka.Consumer(
            client_conf(
                conf,
                who="coordinator",
                internal=True,
                forced={
                    "group.id": f"{topic}-reader",  # assign() only: never joined nor committed
                    "enable.auto.commit": False,
                    "enable.partition.eof": True,
                    "isolation.level": "read_committed",
                    "auto.offset.reset": "earliest",
                },
            )
        )
        self.producer = confluent_kafka.Producer(
            client_conf(
                conf,
                who="coordinator",
                internal=True,
                forced={"enable.idempotence": True, "acks": "all", "linger.ms": 0},
            )
        )

    def read(self) -> list[dict]:
        """Every record of ours, in log order."""
        self.reader.assign([TopicPartition(self.topic, 0, confluent_kafka.OFFSET_BEGINNING)])
        records: list[dict] = []
        deadline = time.monotonic() + READ_TIMEOUT_S
        try:
            while True:
                if time.monotonic() > deadline:
                    raise KafkaOperationError(
                        f"reading {self.topic} did not reach its end within {READ_TIMEOUT_S:.0f} s"
                    )
                msg = self.reader.poll(0.1)
                if msg is None:
                    continue
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        return records
                    raise KafkaOperationError.wrap(f"reading {self.topic}", err)
                record = _parse(msg.value())
                if record is None:
                    log.warning(
                        "%s[%d]@%d skipped: not a keys record",
                        self.topic,
                        msg.partition(),
                        msg.offset(),
                    )
                else:
                    records.append(record)
        finally:
            self.reader.unassign()

    def write(self, records: list[tuple[str, dict]]) -> None:
        """Append ``(kind or kind/partition, fields)`` records, each under a record key of
        this writer's own, and wait until all are acknowledged."""
        failures: list[KafkaError] = []

        def delivered(err: KafkaError | None, _msg: object) -> None:
            if err is not None:
                failures.append(err)

        for name, fields in records:
            kind = name.split("/")[0]
            value = json.dumps({"v": RECORD_VERSION, "kind": kind, **fields}).encode()
            self.producer.produce(
                self.topic,
                value,
                key=f"{name}/{self.instance_id}".encode(),
                partition=0,
                on_delivery=delivered,
            )
        if self.producer.flush(WRITE_TIMEOUT_S) or failures:
            cause = failures[0] if failures else None
            if cause is not None:
                raise KafkaOperationError.wrap(f"writing to {self.topic}", cause)
            raise KafkaOperationError(
                f"writing to {self.topic} was not acknowledged within {WRITE_TIMEOUT_S:.0f} s"
            )

    def end_offsets(self, topic: str, partitions: list[int]) -> dict[int, int]:
        out = {}
        for p in partitions:
            try:
                _low, high = self.reader.get_watermark_offsets(
                    TopicPartition(topic, p), timeout=ADMIN_TIMEOUT_S
                )
            except KafkaException as exc:
                raise KafkaOperationError.wrap(
                    f"reading the end offset of {topic}[{p}]", exc.args[0]
                ) from exc
            out[p] = high
        return out

    def had_coordinator(self, group: str, topics: set[str]) -> bool:
        """Whether ``group`` committed an offset on any partition of ``topics``."""
        admin = AdminClient(shared_conf(self.conf))
        request = [ConsumerGroupTopicPartitions(group)]
        try:
            committed = admin.list_consumer_group_offsets(request, request_timeout=ADMIN_TIMEOUT_S)[
                group
            ].result(ADMIN_TIMEOUT_S)
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError.GROUP_ID_NOT_FOUND:
                return False
            raise KafkaOperationError.wrap(
                f"reading the committed offsets of {group}", exc.args[0]
            ) from exc
        return any(tp.topic in topics and tp.offset >= 0 for tp in committed.topic_partitions or ())

    def close(self) -> None:
        self.reader.close()
        self.producer.flush(WRITE_TIMEOUT_S)
