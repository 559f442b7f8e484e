"""The SimpleConsumer case (issue 36): ``receive(32)`` then an ``ack`` of each message, until
every record of a pre-filled topic is acked, against the plain consumer of the orderly case
(batches of 32, offsets stored after the listener, auto commit) on the same topic, in msgs/s;
once on records without a message group and once on records of 100 message groups (FIFO: one
message of a group in flight at a time). Also the time of one ``receive(32)``, which carries
the synchronous offset commit made before every batch is handed out."""

from __future__ import annotations

import time
import uuid

from benchmarks.common import CASE_TIMEOUT_S, BenchSettings, fill
from benchmarks.orderly import ORDERLY_BATCH, _CountingListener
from benchmarks.orderly import _plain_rate as plain_rate
from rmq_semantics.records.headers import H
from rmq_semantics.topics import ensure_topics

__all__ = [
    "SIMPLE_BATCH",
    "SIMPLE_GROUPS",
    "SIMPLE_MAX_COUNT",
    "SIMPLE_VARIANTS",
    "bench_simple",
    "prepare_simple",
]

SIMPLE_BATCH = ORDERLY_BATCH  # receive(32), the plain side's batch too
SIMPLE_GROUPS = 100  # message groups of the FIFO variant's records
# About 10 s a run on 2 shared cores (the SimpleConsumer side is the slow one); the plain
# side reads at about a million a second, so fewer records would time it over a few ms.
SIMPLE_MAX_COUNT = 100000
# Long enough that no message comes back during a run: every delivery is a first one.
INVISIBLE_S = 60.0
# A receive returns after this long without a message (the run's end, a rebalance).
AWAIT_S = 1.0
BENCH_PREFIX = "__rmqbench"
SIMPLE_VARIANTS = ("unordered", "fifo")


def _key(i: int) -> str:
    # The FIFO records are keyed by their group, so a group lives in one partition (what
    # placement by message group will do); the unordered ones alike, for the same spread.
    return f"group-{i % SIMPLE_GROUPS}"


def _group_headers(i: int) -> list[tuple[str, bytes]]:
    return [(H.MESSAGE_GROUP, _key(i).encode())]


def prepare_simple(conf: dict, s: BenchSettings) -> dict[str, str]:
    """One topic per variant, each filled with ``count`` records; their names by variant."""
    count = min(s.count, SIMPLE_MAX_COUNT)
    topics = {v: f"bench-simple-{v}-{uuid.uuid4().hex[:8]}" for v in SIMPLE_VARIANTS}
    ensure_topics(conf, {t: (s.partitions, {}) for t in topics.values()})
    fill(conf, topics["unordered"], count, s.size, key=_key)
    fill(conf, topics["fifo"], count, s.size, key=_key, headers=_group_headers)
    return topics


def _simple_rate(conf: dict, topic: str, count: int) -> dict:
    """A SimpleConsumer of a new group: ``receive(32)``, ack each, until ``count`` acked.
    Its rate (10th to 90th percent, as the plain side), the milliseconds of every receive
    that returned messages after the first (the first one waits for the group join), the
    microseconds of one ack (a batch's mean, per batch), and how many deliveries were not
    first ones."""
    from rmq_semantics.simple.consumer import SimpleConsumer

    listener = _CountingListener(count)
    receive_ms: list[float] = []
    ack_us: list[float] = []
    again = 0
    consumer = SimpleConsumer(
        {**conf, "auto.offset.reset": "earliest"},
        f"bench-simple-{uuid.uuid4().hex[:12]}",
        {topic: None},
        topic_prefix=BENCH_PREFIX,
        await_duration=AWAIT_S,
    )
    deadline = time.monotonic() + CASE_TIMEOUT_S
    first = True
    with consumer:
        while listener.seen < count and time.monotonic() < deadline:
            started = time.perf_counter()
            batch = consumer.receive(SIMPLE_BATCH, INVISIBLE_S)
            took = (time.perf_counter() - started) * 1000
            if not batch:
                continue
            if not first:
                receive_ms.append(took)
            first = False
            started = time.perf_counter()
            for message in batch:
                consumer.ack(message)
            ack_us.append((time.perf_counter() - started) * 1e6 / len(batch))
            again += sum(m.delivery_attempt > 1 for m in batch)
            listener.add(len(batch))
    return {
        "simple_msgs_per_s": listener.rate(),
        "receive_ms": {"samples": receive_ms},
        "ack_us": {"samples": ack_us},
        "redelivered": float(again),
    }


def bench_simple(conf: dict, s: BenchSettings, topics: dict[str, str]) -> dict:
    """One run: per variant the plain consumer then the SimpleConsumer on the same topic,
    msgs/s of each, their ratio and the receive(32) times."""
    count = min(s.count, SIMPLE_MAX_COUNT)
    run: dict = {"simple_messages": count, "simple_batch": SIMPLE_BATCH}
    for variant in SIMPLE_VARIANTS:
        plain = plain_rate(conf, topics[variant], count, SIMPLE_BATCH)
        simple = _simple_rate(conf, topics[variant], count)
        rate = simple["simple_msgs_per_s"]
        run[f"simple_{variant}"] = {
            "plain_msgs_per_s": plain,
            **simple,
            "ratio": rate / plain if plain else float("nan"),
        }
    run["simple_fifo"]["groups"] = SIMPLE_GROUPS
    return run
