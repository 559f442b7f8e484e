"""The orderly consumer's offset tracker as a state machine (Hypothesis), against a model of
one partition: its log (offsets with gaps), the records a consumer took and finished, and
the commits it made.

Promises checked after every step: the committable offset is the lowest unfinished record
taken (never past one); the done offsets it carries are exactly the finished records above
it; a tracker restored from a commit hands over every record not finished by then and skips
exactly those the commit marked done (with a tight metadata bound: only finished ones).
"""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rmq_semantics.orderly.offsets import OffsetTracker, split_metadata
from tests.model.broken import find_failure

OWNER = "client-1:3"
# A bound this tight truncates the done field: the restored tracker then redoes more.
TIGHT_METADATA_BYTES = 26


class OffsetMachine(RuleBasedStateMachine):
    """One partition consumed by a sequence of consumers, each restored from the last
    commit (a takeover or a restart)."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[int] = []  # the partition's offsets (gaps: compacted, markers)
        self.processed: set[int] = set()  # finished by some consumer, ever
        self.committed: tuple[int, str] | None = None
        self.committed_done: set[int] = set()  # finished when the commit was made
        self.tight = False
        self.commit_tight = False  # the commit's done field was made under the tight bound
        self._consumer(None)

    def _consumer(self, commit: tuple[int, str] | None) -> None:
        """A new consumer: reads from the commit (or the log's start) with no work done."""
        bound = {"max_metadata_bytes": TIGHT_METADATA_BYTES} if self.tight else {}
        if commit is None:
            self.tracker = OffsetTracker(**bound)
            self.position = 0
        else:
            self.tracker = OffsetTracker.restore(*commit, **bound)
            self.position = next(
                (i for i, o in enumerate(self.log) if o >= commit[0]), len(self.log)
            )
        self.taken: list[int] = []
        self.finished: set[int] = set()  # by this consumer
        self.skipped: set[int] = set()
        # What the commit it started from said is done (its own commits carry that on).
        self.inherited = self.committed_done if commit is not None else set()
        self.inherited_tight = self.commit_tight

    # -- the partition and the consumer ------------------------------------------------------
    @rule(gaps=st.lists(st.sampled_from([1, 1, 1, 2, 5]), min_size=1, max_size=6))
    def append(self, gaps: list[int]) -> None:
        for gap in gaps:
            self.log.append((self.log[-1] if self.log else -1) + gap)

    @precondition(lambda self: self.position < len(self.log))
    @rule(most=st.integers(1, 4))
    def take(self, most: int) -> None:
        for offset in self.log[self.position : self.position + most]:
            self._take(offset)

    def _take(self, offset: int) -> None:
        self.position += 1
        if self.tracker.add(offset):
            self.taken.append(offset)
        else:
            # Skipped: the commit it started from said it is done, which it must really be.
            assert offset in self.processed, f"offset {offset} skipped but never finished"
            assert offset in self.inherited
            self.skipped.add(offset)
        if not self.inherited_tight and offset in self.inherited:
            assert offset in self.skipped, f"offset {offset} finished and committed, redone"

    @precondition(lambda self: any(o not in self.finished for o in self.taken))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        unfinished = [o for o in self.taken if o not in self.finished]
        for offset in data.draw(
            st.lists(st.sampled_from(unfinished), min_size=1, max_size=3, unique=True)
        ):
            assert self.tracker.done(offset)
            self.finished.add(offset)
            self.processed.add(offset)

    @precondition(lambda self: bool(self.finished))
    @rule(data=st.data())
    def finish_again(self, data: st.DataObject) -> None:
        assert not self.tracker.done(data.draw(st.sampled_from(sorted(self.finished))))

    @rule()
    def commit(self) -> None:
        commit = self.tracker.committable(OWNER)
        if commit is None:
            return
        offset, metadata = commit
        unfinished = [o for o in self.taken if o not in self.finished]
        assert all(o >= offset for o in unfinished), f"commit {offset} passes {unfinished}"
        assert split_metadata(metadata)[1] == OWNER
        self.committed, self.commit_tight = commit, self.tight or self.inherited_tight
        known = self.finished | self.skipped | self.inherited
        self.committed_done = {o for o in known if o >= offset}

    @rule(tight=st.booleans())
    def takeover(self, tight: bool) -> None:
        """The consumer dies (its unfinished and uncommitted work is lost) and another
        takes the partition from the last commit."""
        self.tight = tight
        self._consumer(self.committed)

    # -- promises ----------------------------------------------------------------------------
    @invariant()
    def never_past_an_unfinished_record(self) -> None:
        unfinished = [o for o in self.taken if o not in self.finished]
        low = self.tracker.lowest_unfinished
        if unfinished:
            assert low == min(unfinished)
        assert self.tracker.in_flight == len(unfinished)

    @invariant()
    def nothing_committed_is_lost(self) -> None:
        """Every record below the committed offset was finished by someone."""
        if self.committed is not None:
            below = [o for o in self.log if o < self.committed[0]]
            assert set(below) <= self.processed, sorted(set(below) - self.processed)


TestOffsetMachine = OffsetMachine.TestCase


def test_a_tracker_that_commits_past_an_unfinished_record_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Planted defect: the commit is where reading got to (auto-commit's mistake), not the
    lowest unfinished record. Hypothesis finds it and shrinks it to a handful of steps."""

    def read_position(self: OffsetTracker, owner: str = "") -> tuple[int, str] | None:
        return None if self.next_offset is None else (self.next_offset, owner)

    monkeypatch.setattr(OffsetTracker, "committable", read_position)
    found = find_failure(OffsetMachine)
    assert isinstance(found.error, AssertionError)
    assert "passes" in str(found.error)
    assert found.steps == ["state.append(gaps=[1])", "state.take(most=1)", "state.commit()"], (
        found.report
    )
