"""Check affinity's routing without a broker: which check partitions each live instance
holds (from a described check group), and where a check goes."""

from __future__ import annotations

from types import SimpleNamespace

from confluent_kafka import ConsumerGroupState, TopicPartition

from coordinator.check_routes import CheckRoutes, holdings, route
from rmq_semantics.topics import SystemTopics

CHECK = "__rmq_check"


def member(client_id: str, *partitions: int, topic: str = CHECK) -> SimpleNamespace:
    return SimpleNamespace(client_id=client_id, assignment=SimpleNamespace(
        topic_partitions=[TopicPartition(topic, p) for p in partitions]))


def test_holdings_name_each_instance_by_its_check_client_id():
    members = [member("rmq-check.A", 3, 1), member("rmq-check.B", 0, 2),
               member("someone-else", 4), member("rmq-check.C"),  # rebalancing: nothing held
               member("rmq-check.D", 5, topic="other")]
    assert holdings(members, CHECK) == {"A": (1, 3), "B": (0, 2)}


def test_a_check_goes_to_a_partition_its_instance_holds_else_by_transaction():
    held = {"A": (1, 3), "B": (0, 2)}
    assert {route(held, "A", f"t{i}") for i in range(50)} == {1, 3}
    assert route(held, "A", "t7") == route(held, "A", "t7")  # stable per transaction
    assert route(held, "gone", "t1") is None  # not a live member: spread by transaction id
    assert route(held, None, "t1") is None


class FakeAdmin:
    def __init__(self, members, fail: bool = False) -> None:
        self.members, self.fail, self.asked = members, fail, []

    def describe_consumer_groups(self, groups, request_timeout):
        self.asked.append(list(groups))
        outcome = SimpleNamespace(result=self._result)
        return {g: outcome for g in groups}

    def _result(self, timeout):
        if self.fail:
            raise TimeoutError("no answer")
        return SimpleNamespace(members=self.members, state=ConsumerGroupState.STABLE)


def test_routes_describe_only_noted_groups_and_fall_back_when_they_cannot():
    topics = SystemTopics("__rmq")
    admin = FakeAdmin([member("rmq-check.A", 0)])
    routes = CheckRoutes(admin, topics)
    assert routes.partition_for("pg", "A", "t1") is None  # not described yet: spread
    routes.refresh()
    assert admin.asked == [[topics.check_group("pg")]]
    assert routes.partition_for("pg", "A", "t1") == 0
    assert routes.partition_for("pg", None, "t1") is None
    admin.fail = True
    routes.refresh()
    assert routes.partition_for("pg", "A", "t1") is None  # unknown again: spread
