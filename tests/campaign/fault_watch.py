"""What shows that the faults took effect, for the summary's minimums.

- :class:`LeaderWatch`: partition leader changes of some topics (metadata polled about
  twice a second; a change is a partition whose leader differs from the last one seen,
  leaderless included);
- :class:`GroupWatch`: rebalances of a consumer group (its member set changed, or it was
  seen in a rebalancing state) and moves of its group coordinator;
- :func:`controller_elections`: KRaft leader epochs gone by;
- :func:`count_log_lines`: lines of logs matching patterns, e.g. :data:`FENCE_PATTERNS`
  for transactional producers fenced or re-created by the coordinators.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from rmq_semantics.kafka_cluster import EmbeddedCluster
from tests.campaign.faultkit import (
    REBALANCING,
    GroupProbe,
    MetadataReader,
    active_controller,
    group_snapshot,
)

__all__ = ["FENCE_PATTERNS", "GroupWatch", "LeaderWatch", "controller_elections", "count_log_lines"]

POLL_S = 0.5
# The coordinator's own lines when its transactional producer was fenced or re-created
# (coordinator/kafka_txn.py), and librdkafka's fencing errors as they reach its log.
FENCE_PATTERNS = (
    r"re-creating transactional producer",
    r"fenced by another instance",
    r"PRODUCER_FENCED",
    r"INVALID_PRODUCER_EPOCH",
)


class _Poller:
    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, daemon=True, name=f"nemesis-{type(self).__name__}"
        )
        self.lock = threading.Lock()

    def start(self) -> _Poller:
        self.baseline()
        self._thread.start()
        return self

    def baseline(self) -> None:
        """A first reading before the faults begin, to count changes from."""

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)
        self.close()

    def close(self) -> None:
        pass

    def __enter__(self) -> _Poller:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self.interval_s)

    def poll(self) -> None:
        raise NotImplementedError


class LeaderWatch(_Poller):
    """Counts leader changes of ``topics``' partitions (all topics when empty)."""

    def __init__(
        self, cluster: EmbeddedCluster, topics: Iterable[str] = (), interval_s: float = POLL_S
    ) -> None:
        super().__init__(interval_s)
        self.reader = MetadataReader(cluster)
        self.topics = list(topics)
        self.leaders: dict[tuple[str, int], int] = {}
        self.changes = 0
        self.polls = 0

    def baseline(self, timeout_s: float = 15.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.polls == 0 and time.monotonic() < deadline:
            self.poll()

    def watch(self, *topics: str) -> None:
        """Add topics (created mid-run) to the watch."""
        with self.lock:
            self.topics.extend(t for t in topics if t not in self.topics)

    def poll(self) -> None:
        full = self.reader.metadata()
        if full is None:
            return
        meta = full.topics
        with self.lock:
            names = self.topics or [t for t in meta if not t.startswith("__")]
            self.polls += 1
            for name in names:
                for n, part in getattr(meta.get(name), "partitions", {}).items():
                    last = self.leaders.get((name, n))
                    if last is not None and last != part.leader:
                        self.changes += 1
                    self.leaders[(name, n)] = part.leader


class GroupWatch(_Poller):
    """Counts rebalances of consumer group ``group`` and moves of its coordinator."""

    def __init__(
        self, cluster: EmbeddedCluster, group: str, interval_s: float = POLL_S / 2
    ) -> None:
        super().__init__(interval_s)
        self.probe = GroupProbe(cluster.bootstrap)
        self.group = group
        self.rebalances = 0
        self.coordinator_moves = 0
        self._members: frozenset[str] | None = None
        self._rebalancing = False
        self._coordinator: int | None = None

    def close(self) -> None:
        self.probe.close()

    def poll(self) -> None:
        snap = group_snapshot(self.probe, self.group)
        if snap is None:
            return
        state, members, coordinator = snap
        with self.lock:
            # One rebalance: entering a rebalancing state, or (one missed between two
            # polls) a new member set while stable.
            rebalancing = state in REBALANCING
            changed = self._members is not None and members != self._members
            if not self._rebalancing and (rebalancing or changed):
                self.rebalances += 1
            self._rebalancing = rebalancing
            self._members = members
            if self._coordinator is not None and coordinator != self._coordinator:
                self.coordinator_moves += 1
            self._coordinator = coordinator


def controller_elections(cluster: EmbeddedCluster, since_epoch: int) -> int:
    """KRaft leader epochs since ``since_epoch`` (an :func:`active_controller` epoch read
    earlier): each is an election, won or not."""
    return max(0, active_controller(cluster)[1] - since_epoch)


def count_log_lines(paths: Iterable[Path | str], patterns: Iterable[str]) -> int:
    """Lines of the files ``paths`` (missing ones count 0) matching any of ``patterns``."""
    regex = re.compile("|".join(f"(?:{p})" for p in patterns))
    total = 0
    for path in paths:
        try:
            with open(path, errors="replace") as lines:
                total += sum(1 for line in lines if regex.search(line))
        except OSError:
            continue
    return total
