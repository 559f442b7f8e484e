"""``make bench-timers-million``: the coordinator's memory with a million timer messages
scheduled (issue 35: within 100 MiB of its memory with 1,000 scheduled, also while they fire).

A coordinator process of its own (its own topic prefix) on an embedded broker (or
``--bootstrap``). ``--base`` messages are scheduled over the next ``--horizon-h`` hours and
its RSS (``VmRSS`` of ``/proc/<pid>/status``) sampled once the timer service took them; then
the rest up to ``--count``, sampled again; then ``--fire-rate`` more per second fall due for
``--fire-seconds`` (sent a few seconds ahead) and RSS is sampled while they fire, their
lateness noted by a read_committed consumer as the ``timers`` case does. The messages are
written as ``Producer.send`` writes them (:func:`rmq_semantics.records.timer.timer_headers`
in the id's timer partition) but by one asynchronous producer, so a million take seconds to
schedule rather than minutes. Figures go to ``timer_memory`` in ``--out``, merged.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

import confluent_kafka
from confluent_kafka import TopicPartition

from benchmarks.common import percentile
from benchmarks.machine import BUSY_FRACTION, load_sample
from benchmarks.timers import DUE_HEADER, LEAD_MS, _collect
from benchmarks.txn import coordinator_process
from coordinator.settings import CoordinatorSettings
from rmq_semantics.embedded import EmbeddedKafka, free_port
from rmq_semantics.errors import RmqError, RmqTimeoutError
from rmq_semantics.message import Message, produce_headers
from rmq_semantics.records.timer import timer_headers, timer_partition
from rmq_semantics.topics import (
    SystemTopics,
    ensure_topics,
    timer_topic_specs,
    topic_partition_count,
)

__all__ = ["main", "rss_mib", "spread_dues"]

# The timer service takes records from the intake in transactions of a few thousand; a
# million on a 2-core machine shared with the broker take minutes.
TAKEN_TIMEOUT_S = 3600.0
# After the last record was taken: the allocator settles, the lanes pause.
SETTLE_S = 5.0
SAMPLE_S, SAMPLE_EVERY_S = 3.0, 0.2
FIRST_DUE_MS = 3_600_000  # the scheduled messages are due from an hour on: none fires


def rss_mib(pid: int) -> float:
    """``VmRSS`` of process ``pid`` in MiB (from ``/proc/<pid>/status``)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RmqError(f"no VmRSS in /proc/{pid}/status")


def _rss_max(pid: int, seconds: float) -> float:
    end, high = time.monotonic() + seconds, 0.0
    while True:
        high = max(high, rss_mib(pid))
        if time.monotonic() >= end:
            return high
        time.sleep(SAMPLE_EVERY_S)


def spread_dues(now_ms: int, count: int, first_ms: int, horizon_ms: int) -> Iterable[int]:
    """``count`` due times spread evenly over ``[now + first, now + horizon)``."""
    span = max(1, horizon_ms - first_ms)
    return (now_ms + first_ms + (i * span) // max(1, count) for i in range(count))


def _schedule(
    conf: dict, prefix: str, topic: str, dues: Iterable[int], value: bytes, tag: bool = False
) -> int:
    """Write a timer record for each due time, as ``Producer.send`` would; how many."""
    topics = SystemTopics(prefix)
    partitions = topic_partition_count(conf, topics.timer)
    if partitions is None:
        raise RmqError(f"{topics.timer} does not exist: is the coordinator's timer service on?")
    producer = confluent_kafka.Producer(
        {**conf, "linger.ms": 20, "enable.idempotence": True, "acks": "all"}
    )
    n = 0
    born = int(time.time() * 1000)
    for n, due in enumerate(dues, 1):
        timer_id = uuid.uuid4().hex
        headers = [(DUE_HEADER, str(due).encode())] if tag else []
        msg = Message(topic, value, key=str(n % 1000), headers=headers)
        while True:
            try:
                producer.produce(
                    topics.timer,
                    value,
                    key=msg.key,
                    partition=timer_partition(timer_id, partitions),
                    headers=produce_headers(timer_headers(msg, timer_id, due, born)),
                )
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    if producer.flush(120) != 0:
        raise RmqTimeoutError("scheduling: records still unsent after 120 s")
    return n


def _intake_backlog(consumer: confluent_kafka.Consumer, topics: SystemTopics, parts: int) -> int:
    """Records of the intake topic the timer group has not committed past yet."""
    tps = [TopicPartition(topics.timer, p) for p in range(parts)]
    committed = consumer.committed(tps, timeout=30)
    backlog = 0
    for tp in committed:
        high = consumer.get_watermark_offsets(TopicPartition(tp.topic, tp.partition), timeout=30)[1]
        backlog += high - max(tp.offset, 0)
    return backlog


def _wait_taken(conf: dict, prefix: str, alive: Callable[[], None], log: Callable) -> float:
    """Block until the timer service committed past every intake record; seconds taken."""
    topics = SystemTopics(prefix)
    parts = topic_partition_count(conf, topics.timer) or 0
    consumer = confluent_kafka.Consumer({**conf, "group.id": topics.timer_group})
    started = time.monotonic()
    try:
        while (backlog := _intake_backlog(consumer, topics, parts)) > 0:
            alive()
            if time.monotonic() - started > TAKEN_TIMEOUT_S:
                raise RmqTimeoutError(f"{backlog} records not taken after {TAKEN_TIMEOUT_S:.0f} s")
            log(f"  {backlog:,} intake records not taken yet")
            time.sleep(5)
    finally:
        consumer.close()
    return time.monotonic() - started


def measure(conf: dict, bootstrap: str, args: argparse.Namespace, log: Callable) -> dict:
    prefix = f"__rmqtm{uuid.uuid4().hex[:6]}"
    topic = f"bench-timer-mem-{uuid.uuid4().hex[:8]}"
    ensure_topics(conf, {topic: (args.partitions, {})})
    value = os.urandom(args.size)
    now = int(time.time() * 1000)
    horizon = int(args.horizon_h * 3_600_000)
    before = load_sample(1.0)
    with coordinator_process(bootstrap, prefix) as coordinator:
        pid = coordinator.pid or 0
        alive = coordinator.require_running
        log(f"coordinator pid {pid}, prefix {prefix}")
        _wait_for_topics(conf, prefix)
        _schedule(conf, prefix, topic, spread_dues(now, args.base, FIRST_DUE_MS, horizon), value)
        _wait_taken(conf, prefix, alive, log)
        time.sleep(SETTLE_S)
        base = _rss_max(pid, SAMPLE_S)
        log(f"{args.base:,} scheduled: RSS {base:.0f} MiB")
        rest = args.count - args.base
        started = time.monotonic()
        _schedule(conf, prefix, topic, spread_dues(now, rest, FIRST_DUE_MS, horizon), value)
        schedule_s = time.monotonic() - started
        log(f"{rest:,} more written in {schedule_s:.0f} s; waiting for the timer service")
        taken_s = _wait_taken(conf, prefix, alive, log)
        time.sleep(SETTLE_S)
        full = _rss_max(pid, SAMPLE_S)
        log(f"{args.count:,} scheduled: RSS {full:.0f} MiB (taken in {taken_s:.0f} s)")
        firing, late = _fire(conf, prefix, topic, args, value, pid, alive)
        log(f"while {len(late):,} fired: RSS up to {firing:.0f} MiB")
    busy = (before.get("cpu_busy") or 0) > BUSY_FRACTION
    return {
        "base_count": args.base,
        "count": args.count,
        "horizon_h": args.horizon_h,
        "fire_count": int(args.fire_rate * args.fire_seconds),
        "fire_rate": args.fire_rate,
        "rss_mib_base": round(base, 1),
        "rss_mib_full": round(full, 1),
        "rss_mib_firing": round(firing, 1),
        "schedule_s": round(schedule_s, 1),
        "taken_s": round(taken_s, 1),
        "fire_lateness_ms": {
            k: round(percentile(late, q), 1) if late else None
            for k, q in (("p50", 50), ("p99", 99), ("max", 100))
        },
        "fired": len(late),
        "busy": busy,
        "smoke": bool(args.smoke or busy),
        "taken_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _wait_for_topics(conf: dict, prefix: str) -> None:
    """The intake and cancel topics made as a producer's first timer send makes them (the
    coordinator's timer service waits for the intake), then the level topics awaited."""
    topics = SystemTopics(prefix)
    defaults = CoordinatorSettings()
    ensure_topics(
        conf,
        timer_topic_specs(topics, defaults.timer_partitions, defaults.max_delay_ms, levels=False),
    )
    deadline = time.monotonic() + 120
    while topic_partition_count(conf, topics.timer_level(1)) is None:
        if time.monotonic() > deadline:
            raise RmqTimeoutError("the coordinator did not create the timer topics in 120 s")
        time.sleep(0.5)


def _fire(
    conf: dict,
    prefix: str,
    topic: str,
    args: argparse.Namespace,
    value: bytes,
    pid: int,
    alive: Callable[[], None],
) -> tuple[float, list[float]]:
    """``fire_rate`` messages due per second for ``fire_seconds`` from a few seconds on; the
    highest RSS while they fire, and their lateness (ms)."""
    count = int(args.fire_rate * args.fire_seconds)
    ctx = multiprocessing.get_context("spawn")  # never fork a process with librdkafka
    results, child_end = ctx.Pipe(duplex=False)
    warmed = ctx.Event()  # unused here (no warm-up), but kept alive until the child has it
    collector = ctx.Process(
        target=_collect,
        daemon=True,
        args=(conf, topic, args.partitions, count, warmed, child_end),
    )
    collector.start()
    start = int(time.time() * 1000) + 2 * LEAD_MS
    dues = (start + (i * 1000) // args.fire_rate for i in range(count))
    _schedule(conf, prefix, topic, dues, value, tag=True)
    high = 0.0
    late: list[float] = []
    deadline = time.monotonic() + 2 * LEAD_MS / 1000 + args.fire_seconds + 120
    while time.monotonic() < deadline:
        alive()
        high = max(high, rss_mib(pid))
        if results.poll(0.5):
            late = results.recv()
            break
    collector.join(10)
    if collector.is_alive():
        collector.kill()
    return high, late


def _write(out: Path, figures: dict) -> None:
    from benchmarks.runner import _merge_into

    results = _merge_into(out, {"timer_memory": figures})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.timer_memory",
        description=(
            "The coordinator's RSS with --base, then --count timer messages scheduled, then "
            "while a stream fires; merged into --out as timer_memory."
        ),
    )
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--base", type=int, default=1000)
    parser.add_argument("--horizon-h", type=float, default=24.0)
    parser.add_argument("--fire-rate", type=int, default=1000)
    parser.add_argument("--fire-seconds", type=float, default=30.0)
    parser.add_argument("--size", type=int, default=256, help="value size in bytes")
    parser.add_argument("--partitions", type=int, default=4, help="of the real topic")
    parser.add_argument("--bootstrap", help="an existing broker instead of an embedded one")
    parser.add_argument("--out", default="bench/results.json")
    parser.add_argument(
        "--smoke", action="store_true", help="mark the figures as taken on a shared machine"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not 0 < args.base < args.count:
        print(f"{parser.prog}: error: want 0 < --base < --count", file=sys.stderr)
        return 2

    def log(line: str) -> None:
        print(line, flush=True)

    work = Path(tempfile.mkdtemp(prefix="rmq-bench-timers-"))
    broker = None if args.bootstrap else EmbeddedKafka(work / "kafka", port=free_port())
    try:
        bootstrap = args.bootstrap or broker.start()  # type: ignore[union-attr]  # one is set
        figures = measure({"bootstrap.servers": bootstrap}, bootstrap, args, log)
    except RmqError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if broker is not None:
            broker.stop()
    _write(Path(args.out), figures)
    log(f"timer_memory written to {args.out}: {json.dumps(figures)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
