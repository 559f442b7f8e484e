"""The multi-node cluster's layout and node properties (no JVM is started)."""

import concurrent.futures
import json
from types import SimpleNamespace

import pytest

from rmq_semantics import topics as topics_module
from rmq_semantics.errors import EmbeddedKafkaError
from rmq_semantics.kafka_cluster import EmbeddedCluster
from rmq_semantics.topics import ensure_topics, replication_for


@pytest.mark.parametrize(
    ("brokers", "expected"), [(1, (1, 1)), (2, (2, 2)), (3, (3, 2)), (5, (3, 2))]
)
def test_replication_is_three_copies_two_needed_on_as_many_nodes_as_there_are(brokers, expected):
    assert replication_for(brokers) == expected


def test_nodes_share_one_voter_set_and_get_replicated_internal_topics(tmp_path):
    cluster = EmbeddedCluster(tmp_path, brokers=3, port=30000)
    assert cluster.bootstrap == "127.0.0.1:30000,127.0.0.1:30001,127.0.0.1:30002"
    props = [
        cluster.node(i)._properties(cluster._layout["nodes"][i - 1]["controller_port"])
        for i in (1, 2, 3)
    ]
    assert [p["node.id"] for p in props] == ["1", "2", "3"]
    assert len({p["controller.quorum.voters"] for p in props}) == 1
    assert props[0]["controller.quorum.voters"].count("@127.0.0.1:") == 3
    for p in props:
        assert p["transaction.state.log.replication.factor"] == "3"
        assert p["transaction.state.log.min.isr"] == "2"
        assert p["offsets.topic.replication.factor"] == "3"
        assert p["share.coordinator.state.topic.replication.factor"] == "3"
        assert p["default.replication.factor"] == "3"
        assert p["min.insync.replicas"] == "2"
    assert cluster.node(2).data_dir == tmp_path.resolve() / "node-2"


def test_an_existing_cluster_keeps_its_layout_and_refuses_a_contradiction(tmp_path):
    (tmp_path / "cluster.json").write_text(
        json.dumps(
            {
                "brokers": 2,
                "version": "4.1.1",
                "cluster_id": "x",
                "nodes": [
                    {"id": 1, "port": 1, "controller_port": 3},
                    {"id": 2, "port": 2, "controller_port": 4},
                ],
            }
        )
    )
    assert EmbeddedCluster(tmp_path).bootstrap == "127.0.0.1:1,127.0.0.1:2"
    with pytest.raises(EmbeddedKafkaError, match="brokers=2, not 3"):
        EmbeddedCluster(tmp_path, brokers=3)
    with pytest.raises(EmbeddedKafkaError, match=r"nodes 1\.\.2"):
        EmbeddedCluster(tmp_path).node(3)


def test_a_node_of_a_missing_cluster_is_one_clear_error(tmp_path):
    with pytest.raises(EmbeddedKafkaError, match="start one with --brokers N"):
        EmbeddedCluster(tmp_path / "none")


class _FakeAdmin:
    def __init__(self):
        self.created = []

    def create_topics(self, topics, request_timeout):
        self.created += topics
        done = concurrent.futures.Future()
        done.set_result(None)
        return {t.topic: done for t in topics}


@pytest.mark.parametrize(
    ("brokers", "override", "expected"),
    [
        (1, None, (1, "1")),
        (3, None, (3, "2")),
        (5, None, (3, "2")),
        (5, 5, (5, "2")),
        (3, 1, (1, "1")),
    ],
)
def test_system_topics_are_created_with_the_clusters_replication(
    monkeypatch, brokers, override, expected
):
    admin = _FakeAdmin()
    meta = SimpleNamespace(
        topics={}, brokers={n: SimpleNamespace(host="h", port=n) for n in range(brokers)}
    )
    monkeypatch.setattr(topics_module, "_admin", lambda conf: (admin, None))
    monkeypatch.setattr(topics_module, "_metadata", lambda *args, **kwargs: meta)
    monkeypatch.setattr(topics_module, "_await_visible", lambda *args, **kwargs: None)
    ensure_topics(
        {},
        {"sys": (2, {"cleanup.policy": "compact"})},
        replicated=True,
        replication_factor=override,
    )
    ensure_topics({}, {"user": (1, {})})
    system, user = admin.created
    assert (system.replication_factor, system.config["min.insync.replicas"]) == expected
    assert system.config["cleanup.policy"] == "compact"
    assert user.replication_factor == -1 and "min.insync.replicas" not in user.config
