"""Authenticated Op markers: an HMAC-SHA256 the coordinators put on every done and check
marker they write, and the rule for trusting one read back.

Every producer principal may write ``__rmq_op`` (its end requests go there), so a marker's
presence there proves nothing. A marker is trusted when its ``mac`` verifies under the key
the coordinators share, or when it lies below its Op partition's watermark: the partition's
end when the coordinators first started with this key, so history written before (unsigned
by older versions, or signed with a previous key) is read as it always was. Everything else
is ignored by the caller.
The MAC covers the marker's body and where it is (Op topic and partition), so a signed
marker copied to another partition or prefix does not verify. Pure: no Kafka, no I/O; the
client library never imports it (it holds no key).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
from collections.abc import Mapping
from enum import StrEnum

from rmq_semantics.errors import ConfigError
from rmq_semantics.records.codec import SystemRecord
from rmq_semantics.records.txn import CheckMarker, DoneMarker, DoneMarkers

__all__ = ["MIN_KEY_BYTES", "MarkerKey", "MarkerVerifier", "Verdict", "canonical", "is_marker"]

# Shorter keys are passphrases, not keys: an offline guess from one signed marker is cheap.
MIN_KEY_BYTES = 16
# Separates these MACs from any other use of the same key; bump it if canonical() changes.
DOMAIN = "rmq.op-marker.v1"
_FINGERPRINT_LABEL = b"rmq.marker-key.fingerprint.v1"
#: Markers the coordinator writes with a ``mac`` (DoneMarker is only ever read: it is older).
SIGNED_TYPES = (DoneMarkers, CheckMarker)
_MARKER_TYPES = (*SIGNED_TYPES, DoneMarker)


def is_marker(record: SystemRecord) -> bool:
    """A done or check marker: a record only coordinators may write."""
    return isinstance(record, _MARKER_TYPES)


def canonical(op_topic: str, partition: int, record: SystemRecord) -> bytes:
    """The bytes a marker's MAC covers: its type, its Op partition and its body without the
    MAC, as JSON with sorted keys (independent of the Avro schema version it travels in)."""
    body = record.to_body()
    body.pop("mac", None)
    return json.dumps(
        [DOMAIN, type(record).__name__, op_topic, partition, body],
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    ).encode()


class MarkerKey:
    """The coordinators' shared secret. Its repr and str never show it."""

    __slots__ = ("_key",)

    def __init__(self, key: bytes) -> None:
        if not isinstance(key, bytes) or len(key) < MIN_KEY_BYTES:
            size = len(key) if isinstance(key, bytes) else type(key).__name__
            raise ConfigError(
                f"the marker key must be at least {MIN_KEY_BYTES} bytes, got "
                f"{size}; generate one with `openssl rand -base64 32`"
            )
        self._key = key

    def mac(self, op_topic: str, partition: int, record: SystemRecord) -> bytes:
        return hmac.new(self._key, canonical(op_topic, partition, record), hashlib.sha256).digest()

    def sign(self, op_topic: str, partition: int, record: SystemRecord) -> SystemRecord:
        """``record`` with its ``mac`` set, if it is a type the coordinator signs."""
        if not isinstance(record, SIGNED_TYPES):
            return record
        return dataclasses.replace(record, mac=self.mac(op_topic, partition, record))

    def fingerprint(self) -> str:
        """A public name of the key (an HMAC of a fixed label), to tell two keys apart."""
        return hmac.new(self._key, _FINGERPRINT_LABEL, hashlib.sha256).hexdigest()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MarkerKey) and hmac.compare_digest(self._key, other._key)

    def __hash__(self) -> int:
        return hash(self.fingerprint())

    def __repr__(self) -> str:
        return f"MarkerKey(fingerprint={self.fingerprint()[:12]})"

    __str__ = __repr__


class Verdict(StrEnum):
    """What the coordinator makes of a marker it reads back."""

    SIGNED = "signed"  # its MAC verifies
    LEGACY = "legacy"  # below the watermark: written before this version or this key
    UNSIGNED = "unsigned"  # no MAC at or above the watermark: forged
    BAD_MAC = "bad_mac"  # at or above the watermark, a MAC that does not verify: forged

    @property
    def accepted(self) -> bool:
        return self in (Verdict.SIGNED, Verdict.LEGACY)


class MarkerVerifier:
    """Judges markers read from ``op_topic``: ``watermarks`` maps each Op partition to the
    offset below which markers are trusted as written (a partition without one: none)."""

    def __init__(self, key: MarkerKey, op_topic: str, watermarks: Mapping[int, int]) -> None:
        self.key = key
        self.op_topic = op_topic
        self.watermarks = dict(watermarks)

    def verdict(self, partition: int, offset: int, record: SystemRecord) -> Verdict:
        if offset < self.watermarks.get(partition, 0):
            return Verdict.LEGACY
        mac = getattr(record, "mac", None)
        if mac is None:
            return Verdict.UNSIGNED
        expected = self.key.mac(self.op_topic, partition, record)
        return Verdict.SIGNED if hmac.compare_digest(mac, expected) else Verdict.BAD_MAC
