"""A TCP proxy in front of one broker that holds requests of one Kafka API while armed: the
adversary for a broker that does not answer (a frozen transaction or group coordinator), or,
for OffsetFetch, one that answers with an error (a group coordinator still loading), or for
OffsetCommit, one that refuses every partition of a commit (librdkafka retries a commit
whose connection dropped, so only an error answer makes it fail)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rmq_semantics.embedded import EmbeddedKafka, free_port

__all__ = [
    "COORDINATOR_LOAD_IN_PROGRESS",
    "END_TXN",
    "OFFSET_COMMIT",
    "OFFSET_FETCH",
    "OFFSET_METADATA_TOO_LARGE",
    "ProxiedKafka",
    "RequestHold",
    "proxied_kafka",
]

# The Kafka protocol's api keys.
OFFSET_COMMIT = 8
OFFSET_FETCH = 9
END_TXN = 26
# The Kafka protocol's error codes: a commit's metadata over offset.metadata.max.bytes; a
# group coordinator still loading __consumer_offsets.
OFFSET_METADATA_TOO_LARGE = 12
COORDINATOR_LOAD_IN_PROGRESS = 14


class RequestHold:
    """Forwards every connection to the broker; while ``armed`` it holds each request of
    ``api_key`` it reads (and everything after it on that connection), then drops that
    connection once disarmed. With ``drop``, it loses each such request instead and goes on
    forwarding the rest: that request alone is never answered. With ``error_code`` (an
    OffsetFetch hold only), it answers each such request itself with that group-level error
    and goes on forwarding the rest; an OffsetCommit hold answers each partition with it."""

    def __init__(
        self,
        upstream_port: int,
        api_key: int,
        *,
        drop: bool = False,
        error_code: int | None = None,
    ) -> None:
        if error_code is not None and api_key not in _ERROR_ANSWERS:
            raise ValueError("only an OffsetFetch or OffsetCommit is answered with an error here")
        self.upstream = ("127.0.0.1", upstream_port)
        self.api_key = api_key
        self.drop = drop
        self.error_code = error_code
        self.versions: set[int] = set()  # of the requests held (or answered)
        self.port = free_port()
        self.armed = threading.Event()
        self.disarmed = threading.Event()
        self.held = 0
        self._server = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self) -> None:
        self.disarmed.clear()
        self.armed.set()

    def disarm(self) -> None:
        self.armed.clear()
        self.disarmed.set()

    def close(self) -> None:
        self.disarm()
        self._server.close()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self._server.accept()
                try:
                    upstream = socket.create_connection(self.upstream)
                except OSError:  # the broker is down: so is the connection through us
                    client.close()
                    continue
                # Answers of ours and the broker's go out whole, one at a time.
                sending = threading.Lock()
                threading.Thread(
                    target=self._up, args=(client, upstream, sending), daemon=True
                ).start()
                threading.Thread(
                    target=self._down, args=(upstream, client, sending), daemon=True
                ).start()

    def _up(self, client: socket.socket, upstream: socket.socket, sending: threading.Lock) -> None:
        try:
            while (size := _read(client, 4)) and (body := _read(client, int.from_bytes(size))):
                if int.from_bytes(body[:2]) == self.api_key and self.armed.is_set():
                    self.versions.add(int.from_bytes(body[2:4]))
                    if self.error_code is not None:
                        answer = _ERROR_ANSWERS[self.api_key](body, self.error_code)
                        with sending:
                            client.sendall(len(answer).to_bytes(4) + answer)
                        self.held += 1
                        continue
                    self.held += 1
                    if self.drop:
                        continue
                    self.disarmed.wait()  # no answer, then the connection is gone
                    return
                upstream.sendall(size + body)
        except OSError:
            pass
        finally:
            for sock in (client, upstream):
                sock.close()

    @staticmethod
    def _down(upstream: socket.socket, client: socket.socket, sending: threading.Lock) -> None:
        with contextlib.suppress(OSError):
            while (size := _read(upstream, 4)) and (body := _read(upstream, int.from_bytes(size))):
                with sending:
                    client.sendall(size + body)
        for sock in (client, upstream):
            sock.close()


def _offset_fetch_error(request: bytes, error_code: int) -> bytes:
    """An OffsetFetch response to ``request`` (its header and body) with ``error_code`` for
    the whole request (v2-v7) or its one group (v8+), and no partitions."""
    version, correlation = int.from_bytes(request[2:4]), request[4:8]
    code = error_code.to_bytes(2)
    throttle = bytes(4) if version >= 3 else b""
    if version < 2:
        raise ValueError(f"OffsetFetch v{version} has no request-level error code")
    if version < 6:
        return correlation + throttle + bytes(4) + code  # no topics
    if version < 8:  # flexible: tagged fields after the header, each struct and the body
        return correlation + b"\0" + throttle + b"\1" + code + b"\0"
    # The header: client id (int16 length), tagged fields; then the body's groups array.
    at = 10 + max(0, int.from_bytes(request[8:10], signed=True))
    at = _skip_tags(request, at)
    groups, at = _uvarint(request, at)
    if groups != 2:  # one group, as librdkafka asks
        raise ValueError(f"an OffsetFetch of {groups - 1} groups")
    length, at = _uvarint(request, at)
    group = request[at : at + length - 1]
    group_field = (len(group) + 1).to_bytes(1) + group if len(group) < 127 else b""
    if not group_field:
        raise ValueError("a group id too long for this proxy")
    return correlation + b"\0" + throttle + b"\2" + group_field + b"\1" + code + b"\0\0"


def _offset_commit_error(request: bytes, error_code: int) -> bytes:
    """An OffsetCommit response (v8+, flexible) to ``request`` with ``error_code`` for each
    partition it names."""
    version, correlation = int.from_bytes(request[2:4]), request[4:8]
    if version < 8:
        raise ValueError(f"OffsetCommit v{version}: only the flexible versions (8+) here")
    at = _skip_tags(request, 10 + max(0, int.from_bytes(request[8:10], signed=True)))
    at = _skip_string(request, at)  # group id
    at += 4  # generation
    at = _skip_string(request, at)  # member id
    at = _skip_string(request, at)  # group instance id
    topics, at = _uvarint(request, at)
    out = correlation + b"\0" + bytes(4) + _uvarint_bytes(topics)
    for _ in range(topics - 1):
        length, at = _uvarint(request, at)
        name, at = request[at : at + length - 1], at + length - 1
        partitions, at = _uvarint(request, at)
        out += _uvarint_bytes(length) + name + _uvarint_bytes(partitions)
        for _ in range(partitions - 1):
            out += request[at : at + 4] + error_code.to_bytes(2) + b"\0"
            at += 4 + 8 + 4  # index, offset, leader epoch
            at = _skip_tags(request, _skip_string(request, at))  # metadata
        out += b"\0"
        at = _skip_tags(request, at)
    return out + b"\0"


def _skip_string(data: bytes, at: int) -> int:
    """Past a compact (nullable) string."""
    length, at = _uvarint(data, at)
    return at + max(0, length - 1)


def _uvarint_bytes(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_ERROR_ANSWERS = {OFFSET_FETCH: _offset_fetch_error, OFFSET_COMMIT: _offset_commit_error}


def _uvarint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def _skip_tags(data: bytes, at: int) -> int:
    count, at = _uvarint(data, at)
    for _ in range(count):
        _tag, at = _uvarint(data, at)
        size, at = _uvarint(data, at)
        at += size
    return at


def _read(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            return b""
        out += chunk
    return out


@dataclass
class ProxiedKafka(EmbeddedKafka):
    """A broker that advertises the proxy's port: every client connection goes through it."""

    proxy_port: int = 0

    def _properties(self, controller_port: int) -> dict[str, str]:
        lines = super()._properties(controller_port)
        lines["advertised.listeners"] = f"PLAINTEXT://127.0.0.1:{self.proxy_port}"
        return lines


@contextlib.contextmanager
def proxied_kafka(
    where: Path, api_key: int, *, drop: bool = False, error_code: int | None = None
) -> Iterator[tuple[ProxiedKafka, RequestHold]]:
    """A broker of its own in ``where`` behind a :class:`RequestHold` of ``api_key``."""
    port = free_port()
    proxy = RequestHold(port, api_key, drop=drop, error_code=error_code)
    kafka = ProxiedKafka(where, port=port, proxy_port=proxy.port)
    try:
        kafka.start()
        yield kafka, proxy
    finally:
        proxy.close()
        kafka.stop()
