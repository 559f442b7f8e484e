"""Each fault of the campaign's nemesis (tests/campaign) on the 3-node cluster: applied, an
effect a user would see asserted, healed, the cluster healthy again (every broker
registered, every partition with its full ISR).

The file runs inside the campaign's own network and mount namespaces (its partitions are
iptables rules, its full disk a tmpfs): started outside them, one test re-runs this file
in fresh ones (``python -m tests.campaign.namespaces``) with a cluster of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient

from tests.campaign import namespaces
from tests.campaign.clock import ClockSkew, clock_file_env, faketime_available, skewed_env
from tests.campaign.fault_watch import GroupWatch, LeaderWatch
from tests.campaign.faultkit import (
    AllBrokersPaused,
    BrokerKill,
    BrokerPause,
    ControllerKill,
    GroupCoordinatorKill,
    GroupProbe,
    MetadataReader,
    ProcessKill,
    ProcessPause,
    ProcTarget,
    active_controller,
    await_healthy,
    group_coordinator,
)
from tests.campaign.nemesis import Nemesis, Timing
from tests.integration.txn_helpers import wait_for

pytestmark = pytest.mark.cluster
inner = pytest.mark.skipif(
    not namespaces.inside(),
    reason="runs inside the campaign's namespaces (test_every_fault_in_the_campaigns_namespaces)",
)
ROOT = Path(__file__).resolve().parents[2]
SESSION_MS = 6000
# A member of the test group: polls its topic until killed, printing nothing.
MEMBER = f"""
import sys
from confluent_kafka import Consumer
c = Consumer({{"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2],
              "session.timeout.ms": {SESSION_MS}, "heartbeat.interval.ms": 500,
              "auto.offset.reset": "earliest"}})
c.subscribe([sys.argv[3]])
while True:
    c.poll(0.5)
"""
# A producer whose clock the test moves: per line on stdin, its time, its monotonic clock
# after a sleep, and the timestamp of a record it produced.
SKEWED = """
import json, sys, time
from confluent_kafka import Producer
p = Producer({"bootstrap.servers": sys.argv[1], "message.timeout.ms": 20000})
for _ in sys.stdin:
    t0 = time.monotonic(); time.sleep(0.2); slept = time.monotonic() - t0
    out = {}
    p.produce(sys.argv[2], b"skewed", on_delivery=lambda e, m: out.update(
        error=str(e) if e else None, ts=m.timestamp()[1]))
    p.flush(30)
    print(json.dumps({"time": time.time(), "slept": slept, **out}), flush=True)
"""


def test_every_fault_in_the_campaigns_namespaces(tmp_path):
    if namespaces.inside():
        pytest.skip("already inside: the other tests of this file run here")
    if os.geteuid() != 0:
        pytest.skip("the campaign's namespaces need root")
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-q",
        "-m",
        "cluster",
        str(Path(__file__).resolve()),
    ]
    proc = subprocess.run(
        namespaces.ns_command(cmd),
        env=namespaces.ns_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    (tmp_path / "inner.log").write_text(proc.stdout + proc.stderr)
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
    assert proc.returncode == 0, f"{tail}\n(all of it: {tmp_path / 'inner.log'})"
    # Only this test skips in there: every fault's test ran.
    assert " passed" in tail and " 1 skipped" in tail, tail


@pytest.fixture
def admin(cluster):
    return AdminClient(cluster.conf())


@pytest.fixture
def reader(cluster):
    return MetadataReader(cluster)


@pytest.fixture
def probe(cluster):
    # Not the Admin client in this process: librdkafka aborts on a DescribeGroups timeout
    # while the coordinator is down (see faultkit.PROBE).
    probe = GroupProbe(cluster.bootstrap)
    yield probe
    probe.close()


@pytest.fixture
def topic(make_topic):
    return make_topic("nemesis", partitions=3)


def _healthy(cluster) -> None:
    problem = await_healthy(cluster, 120)
    assert problem is None, problem


def _leaders(admin, topic) -> dict[int, tuple[int, list[int]]]:
    parts = admin.list_topics(topic, timeout=10).topics[topic].partitions
    return {n: (p.leader, list(p.isrs)) for n, p in parts.items()}


def _all_leaders(reader, topic, ok) -> bool:
    """Whether ``ok(leader, isr)`` holds for every partition, as a node that answers says
    (not the one the fault stopped or cut off)."""
    meta = reader.metadata()
    parts = meta.topics[topic].partitions if meta and topic in meta.topics else {}
    return bool(parts) and all(ok(p.leader, list(p.isrs)) for p in parts.values())


def _produce_acked(cluster, topic, timeout_ms: int) -> KafkaError | None:
    """One acks=all record; the delivery error, None when it was acknowledged."""
    result: list = []
    producer = Producer(cluster.conf(**{"acks": "all", "message.timeout.ms": timeout_ms}))
    producer.produce(topic, b"x", on_delivery=lambda err, _m: result.append(err))
    producer.flush(timeout_ms / 1000 + 10)
    assert result, "no delivery report"
    return result[0]


def _event_ok(fault, kind: str) -> dict:
    event = fault.event()
    assert event["kind"] == kind and "error" not in event["detail"], event
    assert event["start_ms"] <= event["end_ms"], event
    return event


@inner
def test_broker_pause_past_the_session_timeout_moves_its_leaderships(cluster, admin, reader, topic):
    _healthy(cluster)
    node = _leaders(admin, topic)[0][0]
    with LeaderWatch(cluster, [topic]) as watch, BrokerPause(cluster, node) as fault:
        wait_for(
            lambda: _all_leaders(reader, topic, lambda leader, _isr: leader != node),
            60,
            f"leaders off paused node {node}",
            interval_s=0.5,
        )
        wait_for(
            lambda: watch.changes >= 1,
            30,
            "the watch to count the moves",
            details=lambda: str(watch.leaders),
        )
    _event_ok(fault, "broker_pause")
    _healthy(cluster)


@inner
def test_broker_kill_then_restart(cluster, admin, reader, topic):
    _healthy(cluster)
    node = _leaders(admin, topic)[1][0]
    with BrokerKill(cluster, node) as fault:
        assert cluster.node(node).pid is None
        wait_for(
            lambda: _all_leaders(reader, topic, lambda leader, _isr: leader not in (node, -1)),
            60,
            "new leaders",
            interval_s=0.5,
        )
    event = _event_ok(fault, "broker_kill")
    assert event["detail"]["restart_s"] > 0 and cluster.node(node).pid is not None
    _healthy(cluster)


@inner
def test_all_brokers_paused_stops_every_write_until_healed(cluster, topic):
    _healthy(cluster)
    with AllBrokersPaused(cluster) as fault:
        err = _produce_acked(cluster, topic, timeout_ms=3000)
        assert err is not None and err.code() == KafkaError._MSG_TIMED_OUT, err
    assert len(_event_ok(fault, "all_brokers_paused")["detail"]["pids"]) == 3
    assert _produce_acked(cluster, topic, timeout_ms=60000) is None
    _healthy(cluster)


@inner
def test_the_active_controller_killed_gives_way_to_another(cluster):
    _healthy(cluster)
    node, epoch = active_controller(cluster)
    with ControllerKill(cluster) as fault:
        wait_for(
            lambda: active_controller(cluster)[1] > epoch and active_controller(cluster)[0] != node,
            60,
            "a new KRaft leader",
            interval_s=0.5,
        )
    event = _event_ok(fault, "controller_kill")
    assert event["target"] == f"node-{node}" and event["detail"]["epoch"] == epoch
    _healthy(cluster)


def _member(cluster, group: str, topic: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", MEMBER, cluster.bootstrap, group, topic],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@inner
def test_group_coordinator_killed_during_a_rebalance_a_zombie_member_caused(
    cluster, probe, topic, unique
):
    _healthy(cluster)
    group = unique("nemesis-group")
    members = [_member(cluster, group, topic) for _ in range(2)]
    try:
        wait_for(
            lambda: (
                (s := probe.describe(group)) and len(s["members"]) == 2 and s["state"] == "STABLE"
            ),
            60,
            "two members, stable",
            interval_s=0.5,
        )
        node = group_coordinator(probe, group)
        zombie = ProcTarget("member-0", "consumer", lambda: members[0].pid)
        with GroupWatch(cluster, group) as watch:
            fault = GroupCoordinatorKill(
                cluster, group, ProcessPause(zombie), rebalance_wait_s=SESSION_MS / 1000 + 20
            )
            with fault:
                wait_for(
                    lambda: (s := probe.describe(group)) and s["coordinator"] != node,
                    90,
                    "the group's coordinator moved",
                    interval_s=0.5,
                )
            event = _event_ok(fault, "group_coordinator_kill")
            assert event["target"] == f"node-{node}" and event["detail"]["rebalance_seen"]
            assert event["detail"]["trigger"]["kind"] == "consumer_pause"
            wait_for(
                lambda: watch.rebalances >= 1 and watch.coordinator_moves >= 1,
                30,
                "the watch to see the rebalance and the move",
                interval_s=0.5,
            )
        _healthy(cluster)
    finally:
        for proc in members:
            proc.kill()
            proc.wait(10)


@inner
def test_a_killed_consumer_process_leaves_its_group_and_is_restarted(cluster, probe, topic, unique):
    group = unique("nemesis-kill")
    procs = [_member(cluster, group, topic)]
    target = ProcTarget(
        "member",
        "consumer",
        lambda: procs[-1].pid,
        restart=lambda: procs.append(_member(cluster, group, topic)),
    )
    try:
        wait_for(
            lambda: (s := probe.describe(group)) and len(s["members"]) == 1,
            60,
            "the member joined",
            interval_s=0.5,
        )
        first = probe.describe(group)["members"]
        with ProcessKill(target) as fault:
            assert procs[0].wait(10) == -9  # killed (the fault does not reap our child)
        event = _event_ok(fault, "consumer_kill")
        assert event["detail"]["restarted_pid"] == procs[-1].pid != procs[0].pid
        wait_for(
            lambda: (s := probe.describe(group)) and s["members"] not in ([], first),
            60,
            "the restarted member in the group's place",
            interval_s=0.5,
        )
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(10)


def _skewed_producer(cluster, topic, env) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", SKEWED, cluster.bootstrap, topic],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )


def _ask(proc: subprocess.Popen) -> dict:
    proc.stdin.write("go\n")
    proc.stdin.flush()
    answer = json.loads(proc.stdout.readline())
    answer["skew"] = answer["time"] - time.time()
    return answer


@inner
def test_a_producer_whose_clock_runs_ahead_then_behind_still_produces(cluster, topic, tmp_path):
    why = faketime_available()
    if why:
        pytest.skip(why)
    _healthy(cluster)
    # A fixed offset: the process's wall clock is behind; its sleeps and librdkafka work.
    fixed = _skewed_producer(cluster, topic, skewed_env("-90s"))
    proc = _skewed_producer(cluster, topic, clock_file_env(tmp_path / "clock"))
    try:
        answer = _ask(fixed)
        assert answer["error"] is None and -95 < answer["skew"] < -85, answer
        assert 0.15 < answer["slept"] < 5 and abs(answer["ts"] / 1000 - answer["time"]) < 5
        assert abs(_ask(proc)["skew"]) < 5
        target = ProcTarget("skewed", "producer", lambda: proc.pid, clock_file=tmp_path / "clock")
        with ClockSkew(target, "+120s") as fault:
            time.sleep(2.5)  # libfaketime re-reads the file when the second changes
            ahead = _ask(proc)
            assert ahead["error"] is None and 115 < ahead["skew"] < 125, ahead
            assert ahead["ts"] / 1000 - time.time() > 100  # the record carries it too
        _event_ok(fault, "clock_skew")
        time.sleep(2.5)
        assert abs(_ask(proc)["skew"]) < 5
    finally:
        for p in (fixed, proc):
            p.kill()
            p.wait(10)


@inner
def test_a_partitioned_broker_drops_out_of_every_isr_until_healed(cluster, admin, reader, topic):
    _healthy(cluster)
    node = _leaders(admin, topic)[2][0]
    with namespaces.Partition(cluster, node) as fault:
        wait_for(
            lambda: _all_leaders(
                reader, topic, lambda leader, isr: node not in isr and leader != node
            ),
            60,
            f"node {node} out of every ISR",
            interval_s=0.5,
        )
    assert _event_ok(fault, "partition")["detail"]["ports"]
    _healthy(cluster)


@inner
def test_a_short_nemesis_run_records_its_faults_and_heals_everything(cluster, topic):
    members = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])]
    target = ProcTarget(
        "sleeper",
        "consumer",
        lambda: members[-1].pid,
        restart=lambda: members.append(
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        ),
    )
    timing = Timing(all_paused_s=2, process_pause_s=2, kill_down_s=1, gap_s=1, settle_s=60)
    nemesis = Nemesis(
        5,
        cluster,
        [target],
        kinds=("all_brokers_paused", "consumer_pause", "consumer_kill"),
        short=True,
        timing=timing,
    )
    try:
        nemesis.start()
        assert nemesis.wait(120)
        events = nemesis.stop()
        assert sorted(e["kind"] for e in events) == [
            "all_brokers_paused",
            "consumer_kill",
            "consumer_pause",
        ]
        assert all(e["seed"] == 5 and e["end_ms"] >= e["start_ms"] for e in events)
        assert len(members) == 2 and members[-1].poll() is None
        assert _produce_acked(cluster, topic, timeout_ms=60000) is None
        _healthy(cluster)
    finally:
        for proc in members:
            proc.kill()
            proc.wait(10)


@inner
def test_a_full_log_dir_stops_the_broker_until_the_filler_is_gone(cluster, admin, topic):
    # Last: the node's log dir stays on its tmpfs for the rest of the session.
    _healthy(cluster)
    node = 3
    tmpfs = namespaces.TmpfsLogDir(cluster, node, size_mb=64)
    tmpfs.install()
    _healthy(cluster)
    log = cluster.node(node).data_dir / "broker.log"
    with namespaces.DiskFull(tmpfs) as fault:
        wait_for(lambda: cluster.node(node).pid is None, 60, f"node {node} to stop")
    event = _event_ok(fault, "disk_full")
    assert event["detail"]["stopped"] and event["detail"]["filled_bytes"] > 0
    assert "No space left on device" in log.read_text(errors="replace")
    _healthy(cluster)
    assert _produce_acked(cluster, topic, timeout_ms=60000) is None
