"""The lock client against the lock service's request limits (issue 29): a call for more
queues than one request's reply may answer is split into several requests, each one the
service accepts; ids the service would refuse are refused at once with one clear error."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from coordinator.lock import lock_request_problem
from rmq_semantics.errors import ConfigError
from rmq_semantics.lock_client import LockClient
from rmq_semantics.records.codec import decode_as, encode
from rmq_semantics.records.locks import LockReply, LockRequest, QueueResult

NOWHERE = {"bootstrap.servers": "127.0.0.1:1"}
PARTITIONS = 2


class FakeLockService:
    """Answers, in memory, each request the real service would answer (granting every
    queue), and sets aside, unanswered, the ones it would refuse."""

    def __init__(self) -> None:
        self.requests: list[tuple[int, LockRequest]] = []
        self.refused: list[str] = []
        self._replies: list[SimpleNamespace] = []

    def produce(self, topic: str, value: bytes, *, key: bytes, partition: int) -> None:
        request = decode_as(LockRequest, value)
        self.requests.append((partition, request))
        if (problem := lock_request_problem(request)) is not None:
            self.refused.append(problem)
            return
        reply = LockReply(
            request.request_id,
            request.client_id,
            request.kind,
            tuple(
                QueueResult(
                    q.topic, q.partition, True, "granted", 1, request.lease_ms, 0, request.client_id
                )
                for q in request.queues
            ),
        )
        value = encode(reply)
        self._replies.append(
            SimpleNamespace(
                error=lambda: None,
                key=lambda: request.client_id.encode(),
                value=lambda: value,
                topic=lambda: topic,
                partition=lambda: 0,
                offset=lambda: len(self._replies),
            )
        )

    def flush(self, timeout: float) -> int:
        return 0

    def consume(self, n: int, timeout: float) -> list[SimpleNamespace]:
        out, self._replies = self._replies[:n], self._replies[n:]
        return out


def _client(service: FakeLockService, client_id: str = "c" * 255) -> LockClient:
    client = LockClient(NOWHERE, topic_prefix="app", client_id=client_id)
    client._producer, client._consumer = service, service
    client._request_partitions, client.reply_partition = PARTITIONS, 0
    return client


def test_a_call_for_more_queues_than_one_reply_may_hold_is_split_and_all_granted():
    service = FakeLockService()
    # 249 characters: the longest topic name Kafka allows, so the fewest queues per request.
    queues = [(f"{t}".rjust(249, "t"), p) for t in range(4) for p in range(1500)]
    grants = _client(service).lock("g" * 255, queues, 60000, timeout=30)
    assert service.refused == []
    assert all(g.granted for g in grants.values()) and len(grants) == len(queues)
    # Split (two or three requests a partition here), each one kept to its own partition.
    assert PARTITIONS < len(service.requests) <= 3 * PARTITIONS
    for partition, request in service.requests:
        assert {q.key(request.group).request_partition(PARTITIONS) for q in request.queues} == {
            partition
        }
    sent = [(q.topic, q.partition) for _, r in service.requests for q in r.queues]
    assert sorted(sent) == sorted(queues)
    assert len({r.request_id for _, r in service.requests}) == len(service.requests)
    released = _client(service).unlock("g" * 255, queues, timeout=30)
    assert service.refused == [] and all(released.values())


def test_ids_the_service_would_refuse_are_a_config_error_at_once():
    with pytest.raises(ConfigError, match="client_id of 256 characters"):
        LockClient(NOWHERE, client_id="c" * 256)
    service = FakeLockService()
    with pytest.raises(ConfigError, match="group of 256 characters"):
        _client(service).lock("g" * 256, [("t", 0)], 60000, timeout=0.5)
    assert service.requests == []
