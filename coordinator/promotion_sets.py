"""Promotion in parallel: several Kafka transactions open at once, one per set of this
instance's half partitions (set k: the owned partitions p with ``p % sets == k``), each
written by its own :class:`TransactionWriter` (its own transactional producers).

A set's transaction carries only its partitions' promotions, done markers and consumer
offsets, so a record waits only for its own set's commit in flight, not for unrelated
partitions'. A set is a subset of the instance's assignment by construction, and every
transaction sends its offsets with the consumer's group metadata: KIP-447's generation fence
keeps a zombie's transaction out whatever set or transactional id it writes with
(docs/design/contract.md, rule 8).

This module routes decided actions to their sets and holds what a busy set has decided until
its commit settles; the transaction service keeps the offsets and the replay."""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Iterable, Sequence

from coordinator.actions import Action, LateCommit
from coordinator.promote import TransactionWriter
from rmq_semantics.errors import ConfigError

__all__ = ["PromotionSets", "action_partition", "set_transactional_id"]

# A blocked wait for the first commit to end looks this often for a wedged call.
WEDGE_POLL_S = 1.0


def set_transactional_id(base: str, index: int, sets: int) -> str:
    """The transactional id of set ``index`` of ``sets``: ``base`` itself for one set (the
    id of every release before sets), ``<base>.s<index>`` otherwise."""
    return base if sets == 1 else f"{base}.s{index}"


def action_partition(action: Action) -> int:
    """The half (and Op) partition whose decision ``action`` writes."""
    return action.partition if isinstance(action, LateCommit) else action.half.partition


class PromotionSets:
    """The writers of the sets, and each set's decided actions not yet submitted."""

    def __init__(self, writers: Sequence[TransactionWriter]) -> None:
        if not writers:
            raise ConfigError("promotion_sets must be a positive int, got 0")
        self.writers = tuple(writers)
        # Per set: actions decided while its writer was busy (submitted with its next
        # transaction), and the (half, op) offsets of the transaction it has in flight.
        self.pending: list[list[Action]] = [[] for _ in self.writers]
        self.sent: list[dict[int, tuple[int, int]]] = [{} for _ in self.writers]

    def __len__(self) -> int:
        return len(self.writers)

    def set_of(self, partition: int) -> int:
        return partition % len(self.writers)

    def route(self, actions: Iterable[Action]) -> None:
        """Each action to its set's pending list."""
        for action in actions:
            self.pending[self.set_of(action_partition(action))].append(action)

    def forget(self, partitions: set[int]) -> None:
        """Drop what was decided for ``partitions`` (revoked: never written by this instance,
        their next owner decides again from the committed offsets)."""
        for k, actions in enumerate(self.pending):
            self.pending[k] = [a for a in actions if action_partition(a) not in partitions]
        for sent in self.sent:
            for p in partitions:
                sent.pop(p, None)

    def clear(self) -> None:
        """A replay: nothing decided survives it."""
        for k in range(len(self.writers)):
            self.pending[k] = []
            self.sent[k] = {}

    @property
    def in_flight(self) -> bool:
        return any(w.in_flight for w in self.writers)

    def free_with_work(self) -> bool:
        """Whether some set has decided actions and no commit in flight."""
        return any(self.pending[k] and not w.in_flight for k, w in enumerate(self.writers))

    def wait_first(self) -> None:
        """Block until one commit in flight has ended or wedged (nothing if none is)."""
        while True:
            busy = [w for w in self.writers if w.in_flight]
            if not busy or any(w.commit_done for w in busy):
                return
            futures = [f for w in busy if (f := w.commit) is not None]
            concurrent.futures.wait(
                futures, timeout=WEDGE_POLL_S, return_when=concurrent.futures.FIRST_COMPLETED
            )

    def start(self, stop: threading.Event | None = None) -> None:
        for writer in self.writers:
            writer.start(stop)

    def prepare(self) -> None:
        for writer in self.writers:
            writer.prepare()

    def close(self) -> None:
        """Idempotent: every writer closed, even if one fails."""
        errors: list[BaseException] = []
        for writer in self.writers:
            try:
                writer.close()
            except Exception as exc:  # the others still close
                errors.append(exc)
        if errors:
            raise errors[0]
