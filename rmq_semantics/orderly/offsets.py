"""Per-partition offset tracking for out-of-order completion (key-ordered consumption).

Records enter a partition's :class:`OffsetTracker` in offset order and complete in any
order. The committable offset is the lowest unfinished one; the offsets above it that are
already done travel in the commit metadata, so a takeover or a restart skips finished work
and redoes everything else. Pure: no Kafka, no clock, no threads (the caller locks).

Offsets never given to the tracker (compacted away, transaction markers, records the
consumer filtered out) are not work: they count as done. A run of them inside the span
costs a bit each until the lowest unfinished offset passes it.

Encoding of the done offsets, one field in front of the commit's owner (``client:epoch``)::

    metadata   = [done-field "|"] owner
    done-field = "rmqdone1." base "." codec payload "." crc32-hex

``base`` is the committed offset; the payload is a bitmap, bit ``i`` (little-endian in each
byte) for offset ``8 * (base // 8) + i``, 1 = done, written up to the highest done offset,
either as is (codec ``b``) or raw-deflated (codec ``z``), base64url without padding; the
shorter wins. A bitmap costs one bit per offset whatever the pattern (no worse than run
lengths on alternating patterns, which cost a byte per run), and deflate shrinks the long
runs of the typical case; both run in C. ``crc32`` of the bitmap catches a truncated or
altered string. The owner stays last, so ``rsplit(":", 1)`` still reads the epoch.

Bound: Kafka refuses metadata over ``offset.metadata.max.bytes`` (default 4096). The field
is kept within ``max_metadata_bytes`` (default 3000, leaving room for the owner); while the
state's encoding would exceed it, or its span exceeds ``max_span`` offsets (the bitmap's
memory and deflate time), :meth:`OffsetTracker.accepting` is False and the caller takes no
new records from the partition (back-pressure). Completing the lowest unfinished record
always shrinks the span; if completions above it outgrow the bound anyway, the commit
carries the longest bitmap prefix that fits (the rest is redone after a takeover: safe).

How large a gap (from the lowest unfinished to the highest done offset) the defaults hold
for each pattern of done offsets is measured in docs/design/measurements.md (the orderly
consumer's done-offset field); tests/unit/test_orderly_offsets.py checks the bounds.
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
import zlib
from dataclasses import dataclass

from rmq_semantics.errors import IllegalStateError

__all__ = [
    "DEFAULT_MAX_METADATA_BYTES",
    "DEFAULT_MAX_SPAN",
    "DONE_FIELD_PREFIX",
    "OffsetTracker",
    "TrackerStatus",
    "compose_metadata",
    "split_metadata",
]

log = logging.getLogger(__name__)

#: Well below Kafka's default ``offset.metadata.max.bytes`` (4096): the owner goes beside it.
DEFAULT_MAX_METADATA_BYTES = 3000
#: Offsets between the lowest unfinished and the highest done one: a 128 KiB bitmap, cheap
#: to deflate on every commit.
DEFAULT_MAX_SPAN = 1 << 20
#: What starts our field; the version digit lets a later encoding sit beside this one.
DONE_FIELD_PREFIX = "rmqdone1."
_SEPARATOR = "|"
_DEFLATE_LEVEL = 6  # level 9 costs far more time on sparse bitmaps for little less size
_CRC_CHARS = 8
_OWNER = re.compile(r".*:-?\d+")  # "client:epoch", what the partition-mode consumer writes
_COMPACT_BYTES = 4096  # drop the bitmap's finished head once it is this long


def compose_metadata(done_field: str, owner: str) -> str:
    """The commit metadata carrying ``done_field`` (may be empty) and ``owner``."""
    return f"{done_field}{_SEPARATOR}{owner}" if done_field else owner


def split_metadata(metadata: str | None) -> tuple[str, str]:
    """(done field or "", owner) of a commit's metadata; a string without our field is all
    owner (the field's alphabet has no ``|``, so the owner may contain one)."""
    metadata = metadata or ""
    if not metadata.startswith(DONE_FIELD_PREFIX):
        return "", metadata
    field, _, owner = metadata.partition(_SEPARATOR)
    return field, owner


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(_DEFLATE_LEVEL, zlib.DEFLATED, -15)
    return packer.compress(data) + packer.flush()


def _field(base: int, codec: str, payload: bytes, bitmap: bytes) -> str:
    crc = format(zlib.crc32(bitmap), f"0{_CRC_CHARS}x")
    return f"{DONE_FIELD_PREFIX}{base}.{codec}{_b64(payload)}.{crc}"


def _field_size(base: int, payload_bytes: int) -> int:
    """Length of a field whose payload has ``payload_bytes`` bytes (base64, no padding)."""
    return (
        len(DONE_FIELD_PREFIX) + len(str(base)) + 2 + (4 * payload_bytes + 2) // 3 + 1 + _CRC_CHARS
    )


def _decode_field(field: str, committed: int, max_bytes: int) -> bytes:
    """The bitmap of a done field written at ``committed``, at most ``max_bytes`` long;
    ValueError says what is wrong."""
    parts = field[len(DONE_FIELD_PREFIX) :].split(".")
    if len(parts) != 3:
        raise ValueError("not base.payload.crc")
    base_text, payload_text, crc_text = parts
    if not base_text.isdigit() or int(base_text) != committed:
        raise ValueError(f"written at offset {base_text!r}, the commit is at {committed}")
    if len(crc_text) != _CRC_CHARS or not payload_text:
        raise ValueError("truncated")
    try:
        payload = _unb64(payload_text[1:])
        if payload_text[0] == "z":
            unpacker = zlib.decompressobj(-15)
            bitmap = unpacker.decompress(payload, max_bytes)
            if unpacker.unconsumed_tail:
                raise ValueError(f"spans more than {8 * max_bytes} offsets")
        elif payload_text[0] == "b":
            bitmap = payload
        else:
            raise ValueError(f"unknown codec {payload_text[0]!r}")
        if len(bitmap) > max_bytes:
            raise ValueError(f"spans more than {8 * max_bytes} offsets")
    except (binascii.Error, zlib.error) as exc:
        raise ValueError(f"undecodable payload ({exc})") from exc
    if format(zlib.crc32(bitmap), f"0{_CRC_CHARS}x") != crc_text:
        raise ValueError("checksum mismatch")
    if not bitmap or bitmap[-1] == 0:
        raise ValueError("bitmap does not end with a done offset")
    if bitmap[0] & ((2 << (committed & 7)) - 1):
        raise ValueError("marks offsets at or below the committed one done")
    return bitmap


@dataclass(frozen=True)
class TrackerStatus:
    """What ``consumer.status()`` shows of one partition's offsets.

    ``in_flight``: records given and not done; ``gap``: offsets from the lowest unfinished
    to the highest done one (0: nothing done above the commit); ``back_pressure``: no new
    records are taken until the gap shrinks; ``metadata_bytes``: the done field's length.
    """

    in_flight: int
    gap: int
    back_pressure: bool
    metadata_bytes: int


class OffsetTracker:
    """One partition's unfinished and done offsets (see the module docstring).

    ``add(offset)`` (offset order) returns False for an offset a restored commit marked
    done: skip that record. ``done(offset)`` in any order. ``committable()`` gives the
    offset and metadata to commit. ``where`` names the partition in log lines.
    """

    def __init__(
        self,
        start: int | None = None,
        *,
        where: str = "",
        max_metadata_bytes: int = DEFAULT_MAX_METADATA_BYTES,
        max_span: int = DEFAULT_MAX_SPAN,
    ) -> None:
        self.where = where
        self.max_metadata_bytes = max_metadata_bytes
        self.max_span = max_span
        # _low: the lowest unfinished offset (the committable one), None until known.
        # Bit i of _bits is offset 8 * (_byte0 + i // 8) + i % 8; offsets below _low are done.
        self._low: int | None = start
        self._byte0 = 0 if start is None else start // 8
        self._bits = bytearray()
        self._last = -1 if start is None else start - 1  # the highest offset given
        self._top = -1  # the highest done offset
        self._in_flight = 0
        self._version = 0  # bumped on every change: the encoding is cached per version
        self._encoded: tuple[int, str, int] = (-1, "", 0)  # version, field, full size

    @classmethod
    def restore(
        cls,
        committed_offset: int,
        metadata: str | None,
        *,
        where: str = "",
        max_metadata_bytes: int = DEFAULT_MAX_METADATA_BYTES,
        max_span: int = DEFAULT_MAX_SPAN,
    ) -> OffsetTracker:
        """The tracker of a partition whose group committed ``committed_offset`` with
        ``metadata``: records from there on are processed except those the metadata marks
        done. Foreign, stale or damaged metadata marks nothing done (one warning line)."""
        tracker = cls(
            committed_offset if committed_offset >= 0 else None,
            where=where,
            max_metadata_bytes=max_metadata_bytes,
            max_span=max_span,
        )
        field, owner = split_metadata(metadata)
        if not field:
            if owner and not _OWNER.fullmatch(owner):
                tracker._ignore(committed_offset, "not written by this library")
            return tracker
        if committed_offset < 0:
            tracker._ignore(committed_offset, "no committed offset")
            return tracker
        try:
            bitmap = _decode_field(field, committed_offset, max_span // 8 + 1)
        except ValueError as exc:
            tracker._ignore(committed_offset, str(exc))
            return tracker
        tracker._bits = bytearray(bitmap)
        tracker._top = 8 * (tracker._byte0 + len(bitmap) - 1) + bitmap[-1].bit_length() - 1
        return tracker

    def _ignore(self, committed: int, reason: str) -> None:
        log.warning(
            "%s: ignoring the done offsets in the commit metadata (%s); every record "
            "from offset %d is processed again",
            self.where or "offsets",
            reason,
            committed,
        )

    # -- records ------------------------------------------------------------------------------
    def add(self, offset: int) -> bool:
        """A record at ``offset`` (above every one given before) is taken: True to process
        it, False when a restored commit says it is done already (skip it)."""
        if offset <= self._last:
            raise IllegalStateError(
                f"{self.where or 'offsets'}: offset {offset} given after "
                f"{self._last}; records enter in offset order"
            )
        if self._low is None:
            self._low, self._byte0 = offset, offset // 8
        start = max(self._last + 1, self._low)
        if start < offset:  # offsets never given are no work
            if start == self._low:
                self._set_low(offset)
            else:
                self._fill(start, offset)
        self._last = offset
        self._version += 1
        if self._is_done(offset):
            self._advance()
            return False
        self._in_flight += 1
        return True

    started = add

    def done(self, offset: int) -> bool:
        """The record at ``offset`` is finished; False if it already was (a repeat)."""
        if self._low is None or offset > self._last:
            raise IllegalStateError(
                f"{self.where or 'offsets'}: offset {offset} done but never given"
            )
        if self._is_done(offset):
            return False
        index = offset // 8 - self._byte0
        if index >= len(self._bits):
            self._bits.extend(bytes(index + 1 - len(self._bits)))
        self._bits[index] |= 1 << (offset & 7)
        self._in_flight -= 1
        self._top = max(self._top, offset)
        self._version += 1
        if offset == self._low:
            self._advance()
        return True

    def is_done(self, offset: int) -> bool:
        """Whether ``offset`` is done (or was never work); False for offsets not given yet
        unless a restored commit marked them done."""
        return self._low is not None and self._is_done(offset)

    def _is_done(self, offset: int) -> bool:
        if offset < self._low:  # type: ignore[operator]  # not None: is_done checked it
            return True
        index = offset // 8 - self._byte0
        return index < len(self._bits) and bool(self._bits[index] >> (offset & 7) & 1)

    def _fill(self, start: int, stop: int) -> None:
        """Mark offsets [start, stop) done: they were never given."""
        bits = self._bits
        last_index = (stop - 1) // 8 - self._byte0
        if last_index >= len(bits):
            bits.extend(bytes(last_index + 1 - len(bits)))
        first_full, end_full = -(-start // 8), stop // 8
        if first_full < end_full:
            bits[first_full - self._byte0 : end_full - self._byte0] = b"\xff" * (
                end_full - first_full
            )
            edges = [*range(start, first_full * 8), *range(end_full * 8, stop)]
        else:
            edges = list(range(start, stop))
        for offset in edges:
            bits[offset // 8 - self._byte0] |= 1 << (offset & 7)

    def _advance(self) -> None:
        """Move the lowest unfinished offset past every done one."""
        low, bits, byte0 = self._low, self._bits, self._byte0
        if low is None:
            return
        index = low // 8 - byte0
        while index < len(bits):
            byte = bits[index] | ((1 << (low & 7)) - 1)  # bits below low count as done
            if byte != 0xFF:
                low = 8 * (byte0 + index) + ((~byte) & (byte + 1)).bit_length() - 1
                break
            index += 1
            low = 8 * (byte0 + index)
        self._set_low(low)

    def _set_low(self, low: int) -> None:
        """``low`` is the lowest unfinished offset now: forget the bitmap's finished head
        (all of it when ``low`` is past its end, else once it is long)."""
        self._low = low
        finished = low // 8 - self._byte0
        if finished >= len(self._bits):
            self._bits.clear()
            self._byte0 = low // 8
        elif finished >= _COMPACT_BYTES and 2 * finished >= len(self._bits):
            del self._bits[:finished]
            self._byte0 += finished

    # -- commits --------------------------------------------------------------------------------
    def committable(self, owner: str = "") -> tuple[int, str] | None:
        """(offset, metadata) to commit: the lowest unfinished offset, and the done offsets
        above it beside ``owner`` (e.g. ``client:epoch``). None before any offset is known."""
        if self._low is None:
            return None
        return self._low, compose_metadata(self._encode()[0], owner)

    def _encode(self) -> tuple[str, int]:
        """(field within the bound, size of the untruncated field), cached per version."""
        version, field, size = self._encoded
        if version == self._version:
            return field, size
        field, size = self._build_field()
        self._encoded = (self._version, field, size)
        return field, size

    def _build_field(self) -> tuple[str, int]:
        low, top = self._low, self._top
        if low is None or top <= low:
            return "", 0
        # From low's byte to top's; the bits below low are cleared (not part of the field).
        window = bytearray(self._bits[low // 8 - self._byte0 : top // 8 - self._byte0 + 1])
        window[0] &= (0xFF << (low & 7)) & 0xFF
        bitmap = bytes(window)
        raw = _field(low, "b", bitmap, bitmap)
        packed = _field(low, "z", _deflate(bitmap), bitmap) if len(bitmap) > 16 else raw
        best = min(raw, packed, key=len)
        if len(best) <= self.max_metadata_bytes:
            return best, len(best)
        # Over the bound: the longest raw prefix that fits; the done offsets above it are
        # redone after a takeover (safe), and back-pressure is already on.
        room = self.max_metadata_bytes - _field_size(low, 0)
        prefix = bitmap[: max(0, room * 3 // 4)].rstrip(b"\x00")
        return (_field(low, "b", prefix, prefix) if prefix else ""), len(best)

    # -- back-pressure and status -----------------------------------------------------------
    @property
    def gap(self) -> int:
        """Offsets from the lowest unfinished to the highest done one (0: none done above)."""
        if self._low is None or self._top <= self._low:
            return 0
        return self._top - self._low + 1

    @property
    def in_flight(self) -> int:
        """Records given and not done yet."""
        return self._in_flight

    @property
    def next_offset(self) -> int | None:
        """The offset after the highest one given (where reading goes on); None before any
        offset is known."""
        return None if self._low is None else self._last + 1

    @property
    def lowest_unfinished(self) -> int | None:
        """The offset a commit now would carry (None before any offset is known)."""
        return self._low

    def accepting(self) -> bool:
        """Whether the partition may take new records: the done offsets' encoding fits
        ``max_metadata_bytes`` and the gap ``max_span`` (else: back-pressure), or nothing is
        in flight (waiting could not shrink it: only taking the next records can)."""
        low = self._low
        if low is None or not self._in_flight:
            return True
        if max(self._last, self._top) - low + 1 > self.max_span:
            return False
        if self._top <= low:
            return True
        if _field_size(low, self._top // 8 - low // 8 + 1) <= self.max_metadata_bytes:
            return True  # the raw bitmap fits: no need to deflate
        return self._encode()[1] <= self.max_metadata_bytes

    @property
    def full(self) -> bool:
        """Back-pressure: take no new records from this partition now."""
        return not self.accepting()

    def status(self) -> TrackerStatus:
        """In-flight count, gap and back-pressure, for ``consumer.status()``."""
        return TrackerStatus(self._in_flight, self.gap, self.full, len(self._encode()[0]))
