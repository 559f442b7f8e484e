"""A SimpleConsumer record's states in its partition's engine (:mod:`.engine`): ready to
deliver, invisible while handed out, dying (owed to the DLQ), done; and the one table of the
moves between them."""

from __future__ import annotations

from enum import Enum

from rmq_semantics.errors import IllegalTransitionError

__all__ = ["TRANSITIONS", "RecordState", "transition"]


class RecordState(Enum):
    READY = "ready"
    INVISIBLE = "invisible"
    DYING = "dying"
    DONE = "done"


TRANSITIONS: dict[RecordState, frozenset[RecordState]] = {
    RecordState.READY: frozenset({RecordState.INVISIBLE, RecordState.DYING}),
    RecordState.INVISIBLE: frozenset({RecordState.DONE, RecordState.READY, RecordState.DYING}),
    RecordState.DYING: frozenset({RecordState.DONE}),
    RecordState.DONE: frozenset(),
}


def transition(current: RecordState, target: RecordState) -> RecordState:
    """``target`` if the table allows the move from ``current``, else IllegalTransitionError."""
    if target not in TRANSITIONS[current]:
        raise IllegalTransitionError(f"a record cannot go from {current.value} to {target.value}")
    return target
