"""A TCP proxy in front of one broker that holds requests of one Kafka API while armed: the
adversary for a broker that does not answer (a frozen transaction or group coordinator)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rmq_semantics.embedded import EmbeddedKafka, free_port

__all__ = ["END_TXN", "OFFSET_FETCH", "ProxiedKafka", "RequestHold", "proxied_kafka"]

# The Kafka protocol's api keys.
OFFSET_FETCH = 9
END_TXN = 26


class RequestHold:
    """Forwards every connection to the broker; while ``armed`` it holds each request of
    ``api_key`` it reads (and everything after it on that connection), then drops that
    connection once disarmed. With ``drop``, it loses each such request instead and goes on
    forwarding the rest: that request alone is never answered."""

    def __init__(self, upstream_port: int, api_key: int, *, drop: bool = False) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.api_key = api_key
        self.drop = drop
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
                threading.Thread(target=self._up, args=(client, upstream), daemon=True).start()
                threading.Thread(target=self._down, args=(upstream, client), daemon=True).start()

    def _up(self, client: socket.socket, upstream: socket.socket) -> None:
        try:
            while (size := _read(client, 4)) and (body := _read(client, int.from_bytes(size))):
                if int.from_bytes(body[:2]) == self.api_key and self.armed.is_set():
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
    def _down(upstream: socket.socket, client: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := upstream.recv(65536):
                client.sendall(data)
        for sock in (client, upstream):
            sock.close()


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
    where: Path, api_key: int, *, drop: bool = False
) -> Iterator[tuple[ProxiedKafka, RequestHold]]:
    """A broker of its own in ``where`` behind a :class:`RequestHold` of ``api_key``."""
    port = free_port()
    proxy = RequestHold(port, api_key, drop=drop)
    kafka = ProxiedKafka(where, port=port, proxy_port=proxy.port)
    try:
        kafka.start()
        yield kafka, proxy
    finally:
        proxy.close()
        kafka.stop()
