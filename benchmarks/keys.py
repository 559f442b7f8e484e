"""The ``keys`` case (issue 16): Parallel Consumer's published table on this consumer.

Every mode consumes the same ``keys_count`` records (10,000) of one partition with 16
workers, each call sleeping a seeded random 0-5 ms chosen per offset, so every mode waits
the same total; a mode is timed from its first listener call to its last completion (group
join and the first lock grant come before that). Modes: ``partition`` order, key order over
1, 5, 20 and 10,000 round-robin keys, Zipf(1.1) keys over 1,000 with their critical-path
bound, every record its own key (``unordered``), and 20 keys one of which always fails
(``failing_key``: the other keys' rate against ``key_20``'s, and its records in the DLQ).

The consumer runs in the bench process: the listener only sleeps (the GIL is free) and reads
the clock itself, nothing else runs here meanwhile, and a child process would add a pipe for
the timestamps on 2 cores already shared with the broker and the coordinator.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import random
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import confluent_kafka
from confluent_kafka import TopicPartition

from benchmarks.common import CASE_TIMEOUT_S, BenchSettings, fill
from rmq_semantics.consumed import offset_of
from rmq_semantics.records.headers import H
from rmq_semantics.topics import SystemTopics, ensure_topics

__all__ = ["KEY_MODES", "bench_keys", "critical_path_bound", "key_figures", "mode_keys", "waits"]

#: The modes of one run, in the order they are taken.
KEY_MODES = (
    "partition",
    "key_1",
    "key_5",
    "key_20",
    "key_10000",
    "zipf",
    "unordered",
    "failing_key",
)
KEY_WORKERS = 16
MAX_WAIT_S = 0.005
# Fixed seeds: every mode and every run sleeps the same per-record waits on the same keys.
WAIT_SEED, ZIPF_SEED = 16, 1611
ZIPF_S, ZIPF_KEYS = 1.1, 1000
# The failing key parks after FAILING_RECONSUME_TIMES retries, FAILING_SUSPEND_MS apart: short,
# so its 1/20 of the records reach the DLQ within seconds.
FAILING_KEYS, FAILING_RECONSUME_TIMES, FAILING_SUSPEND_MS = 20, 3, 5
# Reading the DLQ back after the failing run.
DLQ_READ_TIMEOUT_S = 30.0
# Where each mode reads: partition order and the failing run use the 20 keys' topic.
SOURCE = {"partition": "key_20", "failing_key": "key_20"}


def waits(count: int) -> list[float]:
    """The listener's sleep for the record at each offset: uniform 0-5 ms, seeded."""
    rng = random.Random(WAIT_SEED)
    return [rng.uniform(0.0, MAX_WAIT_S) for _ in range(count)]


def mode_keys(mode: str, count: int) -> list[str]:
    """The ordering key of each record of ``mode``'s topic (its key and message group)."""
    mode = SOURCE.get(mode, mode)
    if mode == "zipf":
        weights = list(itertools.accumulate(1 / k**ZIPF_S for k in range(1, ZIPF_KEYS + 1)))
        ranks = random.Random(ZIPF_SEED).choices(range(ZIPF_KEYS), cum_weights=weights, k=count)
        return [f"zipf-{r}" for r in ranks]
    if mode == "unordered":
        return [f"own-{i}" for i in range(count)]
    n = int(mode.removeprefix("key_"))
    return [f"{mode}-{i % n}" for i in range(count)]


def critical_path_bound(sleeps: list[float], keys: list[str], workers: int) -> float:
    """The least time any scheduler could take: the total wait spread over ``workers``, or
    the hottest key's waits one after another, whichever is longer."""
    per_key: dict[str, float] = defaultdict(float)
    for wait, key in zip(sleeps, keys, strict=True):
        per_key[key] += wait
    return max(sum(sleeps) / workers, max(per_key.values(), default=0.0))


class _TimedListener:
    """Sleeps each record's wait; records the first call's start and the last success. A
    record of ``failing`` is suspended every time, until it is dead-lettered."""

    def __init__(
        self, sleeps: list[float], succeed: int, failing: bytes | None = None, fail: int = 0
    ) -> None:
        self.sleeps = sleeps
        self.succeed, self.fail = succeed, fail
        self.failing = failing
        self.lock = threading.Lock()
        self.first: float | None = None
        self.last_success = self.last_parked = 0.0
        self.succeeded = self.parked = 0
        self.finished = threading.Event()

    def __call__(self, msgs: list, context: Any) -> Any:
        from rmq_semantics.orderly import ConsumeOrderlyStatus

        with self.lock:
            if self.first is None:
                self.first = time.monotonic()
        if self.failing is not None and msgs[0].key == self.failing:  # a call is one key
            context.suspend_ms = FAILING_SUSPEND_MS
            if msgs[0].reconsume_times >= FAILING_RECONSUME_TIMES:  # the DLQ's next
                self._count(parked=len(msgs))
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        for msg in msgs:
            time.sleep(self.sleeps[msg.offset])
        self._count(succeeded=len(msgs))
        return ConsumeOrderlyStatus.SUCCESS

    def _count(self, succeeded: int = 0, parked: int = 0) -> None:
        with self.lock:
            now = time.monotonic()
            if succeeded:
                self.succeeded += succeeded
                self.last_success = now
            if parked:
                self.parked += parked
                self.last_parked = now
            if self.succeeded >= self.succeed and self.parked >= self.fail:
                self.finished.set()

    def seconds(self, until: float) -> float:
        return until - self.first if self.first is not None else math.nan


def _consume(
    conf: dict,
    prefix: str,
    topic: str,
    mode: str,
    listener: _TimedListener,
    log: Callable[[str], None],
) -> str:
    """Consume ``topic`` in ``mode`` until ``listener`` has seen every record; the group."""
    from rmq_semantics.orderly import OrderlyConsumer

    group = f"bench-keys-{mode}-{uuid.uuid4().hex[:8]}"
    extra: dict[str, Any] = (
        {"ordering": "partition"}
        if mode == "partition"
        else {"ordering": "key", "max_workers": KEY_WORKERS}
    )
    if mode == "failing_key":
        extra["max_reconsume_times"] = FAILING_RECONSUME_TIMES
    consumer = OrderlyConsumer(
        {**conf, "group.id": group, "auto.offset.reset": "earliest"},
        listener=listener,
        topic_prefix=prefix,
        **extra,
    )
    consumer.subscribe([topic])
    consumer.start()
    try:
        if not listener.finished.wait(CASE_TIMEOUT_S):
            log(
                f"keys {mode}: {listener.succeeded} records done and {listener.parked} parked "
                f"after {CASE_TIMEOUT_S:g} s; not measured"
            )
            listener.first = None
    finally:
        consumer.shutdown()
    return group


def _dead_lettered(conf: dict, dlq: str, topic: str, key: bytes) -> int:
    """How many records of ``key`` from ``topic`` the DLQ topic ``dlq`` holds."""
    consumer = confluent_kafka.Consumer(
        {**conf, "group.id": f"bench-dlq-{uuid.uuid4().hex}", "enable.auto.commit": False}
    )
    try:
        try:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(dlq, 0), timeout=DLQ_READ_TIMEOUT_S
            )
        except confluent_kafka.KafkaException:
            return 0  # never created: nothing was dead-lettered
        consumer.assign([TopicPartition(dlq, 0, low)])
        found, position = 0, low
        deadline = time.monotonic() + DLQ_READ_TIMEOUT_S
        while position < high and time.monotonic() < deadline:
            for msg in consumer.consume(500, 0.5):
                if msg.error() is not None:
                    continue
                position = offset_of(msg) + 1
                origin = dict(msg.headers() or []).get(H.DLQ_ORIGINAL_TOPIC)
                found += origin == topic.encode() and msg.key() == key
        return found
    finally:
        consumer.close()


def _group_headers(keys: list[str], i: int) -> list[tuple[str, bytes]]:
    return [(H.MESSAGE_GROUP, keys[i].encode())]


def _topics(conf: dict, s: BenchSettings, log: Callable[[str], None]) -> dict[str, str]:
    """One topic of one partition per key distribution, filled once for every run."""
    topics = {}
    for mode in dict.fromkeys(SOURCE.get(m, m) for m in KEY_MODES):
        topic = f"bench-keys-{mode.replace('_', '')}-{uuid.uuid4().hex[:8]}"
        ensure_topics(conf, {topic: (1, {})})
        keys = mode_keys(mode, s.keys_count)
        fill(
            conf,
            topic,
            s.keys_count,
            s.size,
            key=keys.__getitem__,
            headers=functools.partial(_group_headers, keys),
        )
        topics[mode] = topic
    log(f"keys: {len(topics)} topics of {s.keys_count:,} records filled")
    return {m: topics[SOURCE.get(m, m)] for m in KEY_MODES}


def _failing_run(
    conf: dict, prefix: str, topic: str, sleeps: list[float], log: Callable[[str], None]
) -> dict:
    """The ``failing_key`` mode: the other keys' time, when the failing key's last record
    had its last call (the DLQ's next), and how many of its records the DLQ holds."""
    keys = mode_keys("failing_key", len(sleeps))
    failing_key = keys[0].encode()
    bad = sum(k.encode() == failing_key for k in keys)
    listener = _TimedListener(sleeps, len(sleeps) - bad, failing_key, bad)
    # Each parked record logs a warning: 1/20 of the records would scroll the progress away.
    dlq_log = logging.getLogger("rmq_semantics.orderly.dlq")
    level = dlq_log.level
    dlq_log.setLevel(logging.ERROR)
    try:
        group = _consume(conf, prefix, topic, "failing_key", listener, log)
    finally:
        dlq_log.setLevel(level)
    return {
        "seconds": listener.seconds(listener.last_success),
        "parked_s": listener.seconds(listener.last_parked),
        "records": bad,
        "dlq": float(_dead_lettered(conf, SystemTopics(prefix).dlq(group), topic, failing_key)),
    }


def key_figures(seconds: dict[str, float], failing: dict, count: int, bound: float) -> dict:
    """One run's figures from each mode's ``seconds`` (``failing_key``: the other keys'),
    the failing run's ``records`` / ``dlq`` / ``parked_s``, and the Zipf keys' bound."""
    partition_s = seconds["partition"]
    modes = {
        mode: {
            "seconds": t,
            "speedup": partition_s / t,
            "msgs_per_s": (count - failing["records"] if mode == "failing_key" else count) / t,
        }
        for mode, t in seconds.items()
    }
    return {
        "keys": {
            "modes": modes,
            "key20_speedup": partition_s / seconds["key_20"],
            "key1_vs_partition": seconds["key_1"] / partition_s,
            "zipf_bound_s": bound,
            "zipf_vs_bound": bound / seconds["zipf"],
            "failing_key_ratio": modes["failing_key"]["msgs_per_s"] / modes["key_20"]["msgs_per_s"],
            "failing_key_parked_s": failing["parked_s"],
            "failing_key_dlq_records": failing["dlq"],
            "failing_key_records": failing["records"],
            # Constants (ints and strings): a float would become a figure over the runs.
            "settings": {
                "messages": count,
                "partitions": 1,
                "workers": KEY_WORKERS,
                "max_wait_ms": round(MAX_WAIT_S * 1000),
                "zipf_s": str(ZIPF_S),
                "zipf_keys": ZIPF_KEYS,
                "failing_keys": FAILING_KEYS,
                "failing_max_reconsume_times": FAILING_RECONSUME_TIMES,
                "failing_suspend_ms": FAILING_SUSPEND_MS,
            },
        }
    }


def bench_keys(
    conf: dict, prefix: str, s: BenchSettings, state: dict, log: Callable[[str], None] = print
) -> dict:
    """One run of every mode; ``state`` keeps the topics (filled on the first run)."""
    if "topics" not in state:
        state["topics"] = _topics(conf, s, log)
        # Unmeasured: the first consumer's connections and the lock service's first grants.
        _consume(
            conf,
            prefix,
            state["topics"]["key_20"],
            "key_20",
            _TimedListener(waits(s.keys_count), s.keys_count),
            log,
        )
    topics, sleeps, count = state["topics"], waits(s.keys_count), s.keys_count
    seconds: dict[str, float] = {}
    for mode in KEY_MODES[:-1]:
        listener = _TimedListener(sleeps, count)
        _consume(conf, prefix, topics[mode], mode, listener, log)
        seconds[mode] = listener.seconds(listener.last_success)
    failing = _failing_run(conf, prefix, topics["failing_key"], sleeps, log)
    seconds["failing_key"] = failing["seconds"]
    return key_figures(
        seconds, failing, count, critical_path_bound(sleeps, mode_keys("zipf", count), KEY_WORKERS)
    )
