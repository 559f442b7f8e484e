"""The lease field: what a partition's delivered-and-unacked records owe, in the commit metadata.

A SimpleConsumer (and the FIFO consumers on the same engine) commits before it hands records
out, so the delivery attempts and the invisibility deadlines survive the instance: the
partition's next owner restores them from the commit and neither forgets an attempt nor shows a
record early. The field sits between the offset tracker's done field and the owner::

    metadata    = [done-field "|"] [lease-field "|"] owner
    lease-field = "rmqlease1." base "." ref "." codec payload "." crc32-hex

``base`` is the committed offset, ``ref`` the commit's wall-clock time (ms). The payload lists
the records with at least one delivery that are not done, in offset order, each as three
unsigned LEB128 varints: the offset minus the previous one (the first: minus ``base``), the
attempts, and ``max(0, visible_at - ref)`` (0: visible now). Codec ``b`` is the payload as is,
``z`` raw-deflated, base64url without padding (the shorter wins); ``crc32`` is over the raw
payload. The field is untrusted input: :func:`decode_leases` raises ValueError on anything it
cannot vouch for, and the caller ignores the field (losing counts, never deliveries).

Pure: no Kafka, no clock.
"""

from __future__ import annotations

import base64
import binascii
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

from rmq_semantics.orderly.offsets import DONE_FIELD_PREFIX

__all__ = [
    "LEASE_FIELD_PREFIX",
    "MAX_ENTRY_BYTES",
    "Lease",
    "compose_metadata",
    "decode_leases",
    "encode_leases",
    "split_metadata",
]

#: What starts the field; the digit lets a later encoding sit beside this one.
LEASE_FIELD_PREFIX = "rmqlease1."
#: The most one entry can take raw: offset gap (< 2^21 with the tracker's span), attempts
#: (< 2^14), deadline (< 2^28 ms, 74 h): 3 + 2 + 4.
MAX_ENTRY_BYTES = 9
_SEPARATOR = "|"
_CRC_CHARS = 8
_DEFLATE_LEVEL = 6
# A decoded field may name at most this many records: a forged one cannot make a new owner
# allocate without bound (the engine keeps far fewer, ``max_leased``).
_MAX_DECODED = 1 << 16
_MAX_ATTEMPTS = 1 << 14
_MAX_DEADLINE_MS = 1 << 28
_MAX_OFFSET = 1 << 62


@dataclass(frozen=True)
class Lease:
    """One record's deliveries so far (>= 1) and when it is visible again (epoch ms; at or
    before the commit's time: visible now)."""

    attempts: int
    visible_at_ms: int


def split_metadata(metadata: str | None) -> tuple[str, str, str]:
    """(done field or "", lease field or "", owner) of a commit's metadata."""
    rest = metadata or ""
    done = ""
    if rest.startswith(DONE_FIELD_PREFIX):
        done, _, rest = rest.partition(_SEPARATOR)
    lease = ""
    if rest.startswith(LEASE_FIELD_PREFIX):
        lease, _, rest = rest.partition(_SEPARATOR)
    return done, lease, rest


def compose_metadata(done_field: str, lease_field: str, owner: str) -> str:
    """The commit metadata carrying the fields (either may be empty) and ``owner``."""
    return _SEPARATOR.join([*(f for f in (done_field, lease_field) if f), owner])


def _varint(value: int, out: bytearray) -> None:
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(_DEFLATE_LEVEL, zlib.DEFLATED, -15)
    return packer.compress(data) + packer.flush()


def encode_leases(base: int, ref_ms: int, leases: Mapping[int, Lease]) -> str:
    """The field for ``leases`` (offset -> lease, every offset >= ``base``), "" for none."""
    if not leases:
        return ""
    payload = bytearray()
    previous = base
    for offset in sorted(leases):
        lease = leases[offset]
        if offset < previous or lease.attempts < 1:
            raise ValueError(f"lease of offset {offset} below {previous} or without attempts")
        _varint(offset - previous, payload)
        _varint(min(lease.attempts, _MAX_ATTEMPTS - 1), payload)
        _varint(min(max(0, lease.visible_at_ms - ref_ms), _MAX_DEADLINE_MS - 1), payload)
        previous = offset
    raw = bytes(payload)
    crc = format(zlib.crc32(raw), f"0{_CRC_CHARS}x")
    packed = _deflate(raw) if len(raw) > 16 else raw
    codec, body = ("z", packed) if len(packed) < len(raw) else ("b", raw)
    return f"{LEASE_FIELD_PREFIX}{base}.{ref_ms}.{codec}{_b64(body)}.{crc}"


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def decode_leases(field: str, committed: int) -> dict[int, Lease]:
    """The leases of a field written at ``committed``; ValueError says what is wrong."""
    if not field.startswith(LEASE_FIELD_PREFIX):
        raise ValueError("not a lease field")
    parts = field[len(LEASE_FIELD_PREFIX) :].split(".")
    if len(parts) != 4:
        raise ValueError("not base.ref.payload.crc")
    base_text, ref_text, body_text, crc_text = parts
    if not base_text.isdigit() or int(base_text) != committed:
        raise ValueError(f"written at offset {base_text[:24]!r}, the commit is at {committed}")
    if not ref_text.isdigit() or len(ref_text) > 16:
        raise ValueError("bad reference time")
    if len(crc_text) != _CRC_CHARS or not body_text:
        raise ValueError("truncated")
    ref = int(ref_text)
    try:
        body = base64.urlsafe_b64decode(body_text[1:] + "=" * (-len(body_text[1:]) % 4))
        if body_text[0] == "z":
            unpacker = zlib.decompressobj(-15)
            raw = unpacker.decompress(body, _MAX_DECODED * MAX_ENTRY_BYTES)
            if unpacker.unconsumed_tail:
                raise ValueError("too many entries")
        elif body_text[0] == "b":
            raw = body
        else:
            raise ValueError(f"unknown codec {body_text[0]!r}")
    except (binascii.Error, zlib.error) as exc:
        raise ValueError(f"undecodable payload ({exc})") from exc
    if format(zlib.crc32(raw), f"0{_CRC_CHARS}x") != crc_text:
        raise ValueError("checksum mismatch")
    leases: dict[int, Lease] = {}
    pos, offset = 0, committed
    while pos < len(raw):
        gap, pos = _read_varint(raw, pos)
        attempts, pos = _read_varint(raw, pos)
        wait, pos = _read_varint(raw, pos)
        if leases and gap == 0:
            raise ValueError(f"offset {offset} listed twice")
        offset += gap
        if offset >= _MAX_OFFSET or not 1 <= attempts < _MAX_ATTEMPTS or wait >= _MAX_DEADLINE_MS:
            raise ValueError(f"entry for offset {offset} out of range")
        leases[offset] = Lease(attempts, ref + wait)
        if len(leases) > _MAX_DECODED:
            raise ValueError("too many entries")
    if not leases:
        raise ValueError("no entries")
    return leases
