"""Where a back-check request goes: the check-topic partition it is written to.

RocketMQ sends a check to any producer of the group, and users report it landing on the
wrong one (RocketMQ #9791). Here a half record may name the producer instance that sent it
(``rmq.check_affinity``). While that instance is a live member of its group's check consumer
group, its transactions' checks are written to a check partition it holds, so they reach it
first. Otherwise (no affinity, the instance gone, its membership not known yet) a check is
keyed by its transaction id: spread over the check partitions, and so over the group's live
members, which is what survives a producer's death.

Membership comes from describing the check groups (each member's client.id names its
instance, see ``rmq_semantics.checks.CHECK_CLIENT_PREFIX``) on a background thread every
``REFRESH_S``, and at once when a group is first noted (its half records are read long
before their first check is due); the write path only reads the last answer and never
waits. A SIGKILLed
instance stays a member until its session times out (10 s): a check written to it meanwhile
is read by whichever member takes its partitions over, since check offsets are committed
only once answered.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections.abc import Iterable

from confluent_kafka import ConsumerGroupState, KafkaException
from confluent_kafka.admin import AdminClient

from rmq_semantics.checks import CHECK_CLIENT_PREFIX
from rmq_semantics.topics import SystemTopics

__all__ = ["CheckRoutes", "holdings", "route"]

log = logging.getLogger(__name__)

# How often the check groups are described (sooner while one is rebalancing: its members
# hold nothing meanwhile), and how long one description may take.
REFRESH_S = 2.0
UNSETTLED_REFRESH_S = 0.25
DESCRIBE_TIMEOUT_S = 5.0
# A producer group whose checks were not routed for this long is no longer described.
FORGET_AFTER_S = 600.0

Holdings = dict[str, tuple[int, ...]]  # instance id -> check partitions it holds


def holdings(members: Iterable, check_topic: str) -> Holdings:
    """Instance id -> the check partitions it holds, from a described group's members
    (``client_id`` and ``assignment.topic_partitions``); members of other clients are
    ignored."""
    out: dict[str, list[int]] = {}
    for member in members:
        client_id = getattr(member, "client_id", "") or ""
        if not client_id.startswith(CHECK_CLIENT_PREFIX):
            continue
        assignment = getattr(member, "assignment", None)
        parts = [tp.partition for tp in getattr(assignment, "topic_partitions", None) or ()
                 if tp.topic == check_topic]
        if parts:
            out.setdefault(client_id[len(CHECK_CLIENT_PREFIX):], []).extend(parts)
    return {instance: tuple(sorted(parts)) for instance, parts in out.items()}


def route(held: Holdings, affinity: str | None, txn_id: str) -> int | None:
    """The check partition for ``txn_id``: one that ``affinity`` holds (chosen by the
    transaction id among them), or None when it holds none (then the caller keys the request
    by transaction id)."""
    parts = held.get(affinity) if affinity else None
    if not parts:
        return None
    return parts[zlib.crc32(txn_id.encode()) % len(parts)]


class CheckRoutes:
    """The live check partitions of each producer group's instances, kept fresh in the
    background (see module docstring). :meth:`partition_for` never blocks."""

    def __init__(self, admin: AdminClient, topics: SystemTopics,
                 refresh_s: float = REFRESH_S) -> None:
        self._admin = admin
        self._topics = topics
        self._refresh_s = refresh_s
        self._lock = threading.Lock()
        self._groups: dict[str, float] = {}  # producer group -> last noted (monotonic)
        self._held: dict[str, Holdings] = {}  # producer group -> its instances' partitions
        self._failing: set[str] = set()  # groups whose description failed last time (logged)
        self._unsettled = False  # a described group was rebalancing
        self._stop = threading.Event()
        self._wake = threading.Event()  # a group noted for the first time: describe it now
        self._thread: threading.Thread | None = None

    def note(self, producer_group: str) -> None:
        """A half record of ``producer_group`` asks for affinity: describe its check group
        from now on (its first check comes a transaction timeout later)."""
        with self._lock:
            new = producer_group not in self._groups
            self._groups[producer_group] = time.monotonic()
        if new:
            self._wake.set()

    def partition_for(self, producer_group: str, affinity: str | None, txn_id: str,
                      ) -> int | None:
        if not affinity:
            return None
        self.note(producer_group)
        return route(self._held.get(producer_group, {}), affinity, txn_id)

    def start(self) -> CheckRoutes:
        self._thread = threading.Thread(target=self._run, name="rmq-check-routes", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = DESCRIBE_TIMEOUT_S) -> None:
        """Idempotent."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        while True:
            self._wake.wait(UNSETTLED_REFRESH_S if self._unsettled else self._refresh_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.refresh()
            except Exception:  # routing is best effort: checks then go by transaction id
                log.exception("check routes: refresh failed")

    def refresh(self) -> None:
        """Describe every noted group's check group once (blocking, bounded)."""
        now = time.monotonic()
        with self._lock:
            for group in [g for g, seen in self._groups.items() if now - seen > FORGET_AFTER_S]:
                del self._groups[group]
            groups = list(self._groups)
        held = {g: h for g, h in self._held.items() if g in groups}
        unsettled = False
        if groups:
            futures = self._admin.describe_consumer_groups(
                [self._topics.check_group(g) for g in groups], request_timeout=DESCRIBE_TIMEOUT_S)
            for group in groups:
                try:
                    description = futures[self._topics.check_group(group)].result(
                        timeout=DESCRIBE_TIMEOUT_S)
                except (KafkaException, TimeoutError, KeyError) as exc:
                    if group not in self._failing:
                        self._failing.add(group)
                        log.warning("check routes: cannot describe the check group of producer "
                                    "group %s (%s); its checks go by transaction id", group, exc)
                    held.pop(group, None)
                    continue
                self._failing.discard(group)
                held[group] = holdings(description.members, self._topics.check)
                unsettled |= description.state != ConsumerGroupState.STABLE
        self._held = held  # one reference swap: partition_for reads it without the lock
        self._unsettled = unsettled
