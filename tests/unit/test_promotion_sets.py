"""Routing of the coordinator's decisions to promotion sets (no broker)."""

from __future__ import annotations

import pytest

from coordinator.actions import LateCommit, SaveCheckCounts
from coordinator.promotion_sets import PromotionSets, action_partition, set_transactional_id
from coordinator.settings import CoordinatorSettings
from rmq_semantics.errors import ConfigError


class _Writer:
    in_flight = False


def _late(partition: int) -> LateCommit:
    return LateCommit(partition, 7, f"t{partition}", "pg", 3)


def test_one_set_keeps_the_transactional_ids_of_releases_before_sets():
    base = "rmq_coordinator-abc"
    assert set_transactional_id(base, 0, 1) == base
    assert [set_transactional_id(base, k, 3) for k in range(3)] == [
        f"{base}.s0",
        f"{base}.s1",
        f"{base}.s2",
    ]


def test_each_decision_goes_to_the_set_of_its_half_partition_and_a_revoke_drops_it():
    sets = PromotionSets([_Writer(), _Writer(), _Writer()])  # type: ignore[list-item]
    sets.route([_late(p) for p in range(7)])
    assert [[action_partition(a) for a in pending] for pending in sets.pending] == [
        [0, 3, 6],
        [1, 4],
        [2, 5],
    ]
    sets.sent[0] = {0: (1, 1), 3: (2, 2)}
    sets.forget({3, 4})
    assert [[action_partition(a) for a in pending] for pending in sets.pending] == [
        [0, 6],
        [1],
        [2, 5],
    ]
    assert sets.sent[0] == {0: (1, 1)}
    assert sets.free_with_work()
    sets.clear()
    assert not any(sets.pending) and not sets.free_with_work()


def test_action_partition_reads_the_half_record_of_other_actions():
    class Half:
        partition = 5

    action = SaveCheckCounts.__new__(SaveCheckCounts)
    object.__setattr__(action, "half", Half())
    assert action_partition(action) == 5


@pytest.mark.parametrize("value", [0, -1, True])
def test_promotion_sets_must_be_a_positive_int(value):
    with pytest.raises(ConfigError, match="promotion_sets must be a positive int"):
        CoordinatorSettings(promotion_sets=value)
