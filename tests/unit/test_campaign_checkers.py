"""The campaign's checkers pass a clean history and report each planted violation."""

from __future__ import annotations

import io
import threading

import pytest
from rich.console import Console

from tests.campaign import events as ev
from tests.campaign.checkers import (
    CLUSTER_FAULTS,
    check_coordinator_exits,
    check_exactly_once,
    check_faults_took_effect,
    check_history,
    check_kafka_transactions,
    check_liveness,
    check_locks,
    check_orderly,
    check_push,
    check_settled,
    check_spark,
    run_all,
)
from tests.campaign.history import Event, Kind, Recorder, at, load
from tests.campaign.nemesis import BROKER_KINDS
from tests.campaign.planted import HORIZON_S, MINIMUMS, TXN_PENDING_EMPTY, clean_events, history_of
from tests.campaign.result import CheckResult, Status
from tests.campaign.summary import failure_line, render_summary
from tests.campaign.txn_tools import (
    FIND_HANGING_HEADERS,
    LIST_HEADERS,
    ToolOutputError,
    parse_discarded,
    parse_find_hanging,
    parse_pending,
    parse_txn_list,
)


def _plant(*extra: Event, drop=lambda e: False):
    return history_of([e for e in clean_events() if not drop(e)] + list(extra))


def _fails_with(result: CheckResult, kind: str, *words: str) -> None:
    assert result.status is Status.FAIL, result.line()
    found = [v for v in result.violations if v.kind == kind]
    assert found, f"no {kind} in {result.line()}"
    assert all(any(w in str(v) for v in found) for w in words), result.line()


def _final(msg_id: str):
    return lambda e: e.kind is Kind.FINAL_READ and e["msg_id"] == msg_id


def test_a_clean_history_passes_every_checker(capsys):
    results = run_all(
        history_of(clean_events()),
        horizon_s=HORIZON_S,
        minimums=MINIMUMS,
        pending=TXN_PENDING_EMPTY,
        discarded=[],
        find_hanging={
            1: "Topic\tPartition\tProducerId\tProducerEpoch\t"
            "CoordinatorEpoch\tStartOffset\tLastTimestamp\t"
            "Duration(min)\t\n"
        },
        txn_list="TransactionalId\tCoordinator\tProducerId\tTransactionState\t\n",
    )
    assert [r.line() for r in results if not r.passed] == []
    names = {r.name for r in results}
    assert names == {
        "history",
        "exactly_once",
        "liveness",
        "settled",
        "kafka_transactions",
        "timers",
        "coordinator_exits",
        "orderly",
        "simple",
        "locks",
        "push",
        "push_fifo",
        "spark",
        "faults_took_effect",
    }
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == len(results) and all(": PASS - " in ln for ln in printed)


# exactly once iff committed


def test_a_duplicate_promotion_is_reported():
    dup = at(ev.final_read("orders", 1, 7, msg_id="m1", txn_id="t1"), 31.0)
    _fails_with(check_exactly_once(_plant(dup)), "duplicate", "m1", "orders[0]@0", "orders[1]@7")


def test_a_lost_commit_is_reported():
    _fails_with(check_exactly_once(_plant(drop=_final("m3"))), "lost", "m3", "t3")


def test_a_rolled_back_message_visible_is_reported():
    seen = at(ev.final_read("orders", 0, 9, msg_id="m2", txn_id="t2"), 31.0)
    _fails_with(check_exactly_once(_plant(seen)), "rolled_back_visible", "m2", "orders[0]@9")


def test_an_unknow_then_rollback_message_visible_is_reported_as_rolled_back():
    seen = at(ev.final_read("orders", 0, 9, msg_id="m4", txn_id="t4"), 31.0)
    _fails_with(check_exactly_once(_plant(seen)), "rolled_back_visible", "m4")


def test_a_failed_send_visible_is_reported():
    seen = at(ev.final_read("orders", 0, 9, msg_id="m6"), 31.0)
    _fails_with(check_exactly_once(_plant(seen)), "failed_send_visible", "m6")


def test_a_message_whose_local_transaction_never_committed_is_reported():
    never = at(ev.send("t7", "grp", ["orders"], ["m7"], "slow_local_txn"), 2.0)
    seen = at(ev.final_read("orders", 0, 9, msg_id="m7", txn_id="t7"), 31.0)
    _fails_with(check_exactly_once(_plant(never, seen)), "uncommitted_visible", "m7")


def test_a_partial_multi_message_transaction_is_reported():
    result = check_exactly_once(_plant(drop=_final("m5b")))
    _fails_with(result, "partial_txn", "t5", "1 of 2", "m5b")
    _fails_with(result, "lost", "m5b")


def test_a_message_on_the_wrong_topic_or_under_another_txn_is_reported():
    moved = at(ev.final_read("audit", 0, 5, msg_id="m1", txn_id="t9"), 31.0)
    result = check_exactly_once(_plant(moved, drop=_final("m1")))
    _fails_with(result, "wrong_topic", "m1", "audit[0]@5")
    _fails_with(result, "txn_mismatch", "t9")


def test_only_the_named_promoted_topics_are_checked():
    assert check_exactly_once(_plant(drop=_final("m5b")), topics=["orders"]).kinds() == set()


# liveness


def test_an_unknow_transaction_decided_past_its_horizon_is_reported():
    late = at(ev.check_answered("t3", "grp", "COMMIT"), 1.5 + HORIZON_S + 2)
    history = _plant(late, drop=lambda e: e.kind is Kind.CHECK_ANSWERED and e["txn_id"] == "t3")
    _fails_with(check_liveness(history, horizon_s=HORIZON_S), "late_decision", "t3", "2.0 s past")


def test_an_unknow_transaction_never_decided_is_reported():
    history = _plant(drop=lambda e: e.kind is Kind.CHECK_ANSWERED and e["answer"] == "ROLLBACK")
    _fails_with(check_liveness(history, horizon_s=HORIZON_S), "undecided", "t4")


def test_the_horizon_pauses_while_the_producer_group_is_down():
    late = at(ev.check_answered("t3", "grp", "COMMIT"), 1.5 + HORIZON_S + 2)
    down = [at(ev.group_state("grp", False), 2.0), at(ev.group_state("grp", True), 5.0)]
    history = _plant(
        late, *down, drop=lambda e: e.kind is Kind.CHECK_ANSWERED and e["txn_id"] == "t3"
    )
    assert check_liveness(history, horizon_s=HORIZON_S).passed


def test_the_horizon_pauses_while_a_cluster_fault_is_on_and_only_then():
    late = at(ev.check_answered("t3", "grp", "COMMIT"), 1.5 + HORIZON_S + 2)
    drop = lambda e: e.kind is Kind.CHECK_ANSWERED and e["txn_id"] == "t3"  # noqa: E731
    # Recorded at its heal, like the runner's: its wall times map through the event's.
    partition = at(ev.fault("partition", "node-2", 2000, end_ms=5000), 5.0)
    assert check_liveness(_plant(late, partition, drop=drop), horizon_s=HORIZON_S).passed
    consumer = at(ev.fault("consumer_pause", "orderly-0", 2000, end_ms=5000), 5.0)
    _fails_with(
        check_liveness(_plant(late, consumer, drop=drop), horizon_s=HORIZON_S),
        "late_decision",
        "t3",
    )


def test_the_liveness_checker_knows_every_cluster_fault_of_the_nemesis():
    assert set(BROKER_KINDS) == CLUSTER_FAULTS


def test_the_horizon_starts_when_a_slow_local_transaction_ended():
    slow = [
        at(ev.send("t8", "grp", ["orders"], ["m8"], "UNKNOW_then_COMMIT"), 1.0),
        at(ev.local_committed("t8", "grp"), 20.0),
        at(ev.check_answered("t8", "grp", "COMMIT"), 25.0),
    ]
    assert check_liveness(_plant(*slow), horizon_s=HORIZON_S).passed


# coordinators


def test_a_coordinator_that_exited_on_its_own_is_reported():
    crashed = at(ev.exit_("coordinator", "coordinator-3", 1, killed_by_nemesis=False), 9.0)
    _fails_with(
        check_coordinator_exits(_plant(crashed)),
        "unexpected_exit",
        "coordinator-3",
        "on its own",
        "code 1",
    )


def test_a_coordinator_stopped_by_the_harness_must_exit_cleanly():
    unclean = at(
        ev.exit_("coordinator", "coordinator-3", 3, killed_by_nemesis=False, stopped=True), 29.0
    )
    _fails_with(check_coordinator_exits(_plant(unclean)), "unexpected_exit", "stopped")


# orderly and locks


def test_an_out_of_order_key_is_reported():
    early = at(ev.consumed("orderly", "og", "c2", "orders", 0, 2, "m3", key="k1"), 4.0, proc="c2")
    _fails_with(
        check_orderly(_plant(early)), "out_of_order", "key 'k1'", "orders[0]@2", "orders[0]@0"
    )


def test_key_mode_allows_other_keys_to_pass_but_partition_mode_does_not():
    other_key = at(
        ev.consumed("orderly", "og", "c1", "orders", 0, 1, "m5a", key="k2"), 4.0, proc="c1"
    )
    assert check_orderly(_plant(other_key)).passed
    partition = at(ev.subscribe("orderly", "og", "c1", ["orders"], mode="partition"), 0.7)
    _fails_with(check_orderly(_plant(other_key, partition)), "out_of_order", "orders[0]@1")


def test_a_record_the_orderly_group_never_processed_is_reported():
    history = _plant(
        drop=lambda e: (
            e.kind is Kind.CONSUMED and e["consumer"] == "orderly" and e["msg_id"] == "m5b"
        )
    )
    _fails_with(check_orderly(history), "unprocessed", "audit[0]@0")


def test_an_orderly_consumer_processing_an_invisible_record_is_reported():
    half = at(ev.consumed("orderly", "og", "c1", "orders", 0, 5, "m2", key="k1"), 6.0)
    _fails_with(check_orderly(_plant(half)), "phantom", "orders[0]@5")


def test_an_overlapping_lock_is_reported():
    grant = at(ev.lock_grant("og/orders/0", "c2", 2, 5100, 20000), 5.1, proc="coordinator-2")
    batch = at(
        ev.batch(
            "og/orders/0",
            "c2",
            2,
            lease_granted_ms=5100,
            lease_valid_until_ms=20000,
            start_ms=5150,
            end_ms=5190,
            offsets=[],
            committed=False,
        ),
        5.19,
        proc="c2",
    )
    result = check_locks(_plant(grant, batch))
    _fails_with(result, "overlapping_lock", "c2", "c1")
    _fails_with(result, "overlapping_grant", "c2")


def test_a_batch_outliving_its_lease_does_not_overlap_the_next_holder():
    batch = at(
        ev.batch(
            "og/orders/0",
            "c2",
            2,
            lease_granted_ms=9500,
            lease_valid_until_ms=20000,
            start_ms=9600,
            end_ms=9700,
            offsets=[],
            committed=False,
        ),
        9.7,
        proc="c2",
    )
    assert check_locks(_plant(batch)).passed


def test_a_later_holder_with_a_lower_epoch_is_reported():
    grant = at(ev.lock_grant("og/orders/0", "c3", 2, 25000, 30000), 25.0)
    _fails_with(check_locks(_plant(grant)), "epoch_not_increasing", "c3", "epoch 2")


def test_a_commit_after_the_lease_was_lost_is_reported():
    late = at(
        ev.batch(
            "og/orders/0",
            "c1",
            1,
            lease_granted_ms=1000,
            lease_valid_until_ms=9000,
            start_ms=8800,
            end_ms=8900,
            offsets=[3],
            committed=True,
            commit_ms=9600,
        ),
        9.6,
        proc="c1",
    )
    _fails_with(check_locks(_plant(late)), "commit_after_lease_lost", "c1", "[3]", "c2 got epoch 2")


def test_a_commit_sent_after_the_lease_lapsed_is_reported_though_no_one_took_the_queue():
    late = at(
        ev.batch(
            "og/audit/0",
            "c1",
            1,
            lease_granted_ms=1000,
            lease_valid_until_ms=60000,
            start_ms=8800,
            end_ms=8900,
            offsets=[3],
            committed=True,
            commit_sent_ms=70000,
            commit_ms=70100,
        ),
        70.1,
        proc="c1",
    )
    _fails_with(check_locks(_plant(late)), "commit_after_lease_lost", "c1", "lapsed")


def test_a_commit_sent_under_the_lease_that_lands_after_a_takeover_is_counted_not_failed():
    """librdkafka defers a commit while the group coordinator is away and sends it later
    under the generation current then: no fence the holder can bind to its lease. It states
    a prefix the holder processed; the summary counts it."""
    landed = at(
        ev.batch(
            "og/orders/0",
            "c1",
            1,
            lease_granted_ms=1000,
            lease_valid_until_ms=9000,
            start_ms=8800,
            end_ms=8900,
            offsets=[3],
            committed=True,
            commit_sent_ms=8950,
            commit_ms=9600,
        ),
        9.6,
        proc="c1",
    )
    result = check_locks(_plant(landed))
    assert result.passed, result.violations
    assert "1 commits landed after a takeover" in result.summary


def test_a_commit_sent_under_the_lease_may_land_late_if_no_one_else_took_the_queue():
    """A broker down delays the commit's answer, not its sending: the consumer checked its
    lease when it sent it, and no other holder's offsets can be moved back."""
    slow = at(
        ev.batch(
            "og/audit/0",
            "c1",
            1,
            lease_granted_ms=1000,
            lease_valid_until_ms=60000,
            start_ms=8800,
            end_ms=8900,
            offsets=[3],
            committed=True,
            commit_sent_ms=59000,
            commit_ms=72000,
        ),
        72.0,
        proc="c1",
    )
    assert check_locks(_plant(slow)).passed


def test_a_batch_without_a_valid_lease_is_reported():
    stale = at(
        ev.batch(
            "og/orders/0",
            "c1",
            1,
            lease_granted_ms=1000,
            lease_valid_until_ms=9000,
            start_ms=9100,
            end_ms=9200,
            offsets=[],
            committed=False,
        ),
        9.2,
        proc="c1",
    )
    _fails_with(check_locks(_plant(stale)), "batch_without_lease", "c1", "9100")


# push


def test_a_lost_push_record_is_reported():
    history = _plant(
        drop=lambda e: e.kind is Kind.CONSUMED and e["consumer"] == "push" and e["msg_id"] == "m5b"
    )
    _fails_with(check_push(history), "lost", "m5b", "audit[0]@0")


def test_a_retry_that_never_came_back_is_reported():
    history = _plant(drop=lambda e: e.kind is Kind.CONSUMED and e["topic"] == "%RETRY%pg")
    result = check_push(history)
    _fails_with(result, "retry_lost", "m3")
    _fails_with(result, "lost", "m3")


def test_a_push_consumer_processing_an_invisible_record_is_reported():
    half = at(ev.consumed("push", "pg", "push-1", "orders", 0, 9, "m2"), 6.0)
    _fails_with(check_push(_plant(half)), "phantom", "m2")


# spark


@pytest.mark.parametrize(
    ("rows", "kind", "msg"),
    [
        (["m1", "m1", "m3", "m5a", "m5b"], "duplicate", "m1"),
        (["m1", "m5a", "m5b"], "missing", "m3"),
        (["m1", "m2", "m3", "m5a", "m5b"], "extra", "m2"),
    ],
)
def test_the_spark_output_must_be_the_committed_set_once(rows, kind, msg):
    result = check_spark(history_of(clean_events()), [{"msg_id": m} for m in rows])
    _fails_with(result, kind, msg)


def test_a_spark_duplicate_in_the_recorded_rows_is_reported():
    _fails_with(check_spark(_plant(at(ev.spark_row("m3"), 33.0))), "duplicate", "m3")


# the faults took effect


def test_faults_that_missed_the_load_are_reported():
    history = _plant(drop=lambda e: e.kind in (Kind.LOCK_TAKEOVER, Kind.FAULT))
    result = check_faults_took_effect(history, {**MINIMUMS, "rebalance": 4})
    _fails_with(
        result,
        "too_few",
        "lock_takeover: 0 < minimum 1",
        "rebalance: 3 < minimum 4",
        "fault:broker_sigkill: 0",
    )


# Kafka's TransactionsCommand and `rmq-semantics txn pending|discarded`


def _kafka_table(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """What ToolsUtils.prettyPrintTable prints: cells padded to the column, each + TAB."""
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    return "".join(
        "".join(c.ljust(w) + "\t" for c, w in zip(r, widths, strict=True)) + "\n"
        for r in [headers, *rows]
    )


HANGING = _kafka_table(
    FIND_HANGING_HEADERS, [("orders", "3", "1002", "5", "7", "41", "1712000000000", "22")]
)
LISTED = _kafka_table(
    LIST_HEADERS,
    [
        ("rmq-coord-0", "1", "1000", "CompleteCommit"),
        ("rmq-coord-1", "2", "1001", "Ongoing"),
        ("other-app", "2", "1005", "Ongoing"),
    ],
)
NOTHING_HANGS = _kafka_table(FIND_HANGING_HEADERS, [])
# Captured: kafka-tools 4.3.1 `list` against the embedded 4.4.0 broker, one transaction left
# open and one committed.
CAPTURED_LIST = (
    "TransactionalId\tCoordinator\tProducerId\tTransactionState\t\n"
    "rmq-coord-1    \t1          \t1         \tCompleteCommit  \t\n"
    "rmq-coord-0    \t1          \t0         \tOngoing         \t\n"
)
CAPTURED_NOTHING_HANGS = (
    "Topic\tPartition\tProducerId\tProducerEpoch\tCoordinatorEpoch\t"
    "StartOffset\tLastTimestamp\tDuration(min)\t\n"
)


def test_kafka_tool_tables_are_parsed_as_kafka_prints_them():
    assert parse_find_hanging(NOTHING_HANGS) == []
    (hanging,) = parse_find_hanging("SLF4J: a log line first\n" + HANGING)
    assert (hanging.where, hanging.producer_id, hanging.duration_min) == ("orders[3]@41", 1002, 22)
    assert [(t.transactional_id, t.state) for t in parse_txn_list(LISTED)] == [
        ("rmq-coord-0", "CompleteCommit"),
        ("rmq-coord-1", "Ongoing"),
        ("other-app", "Ongoing"),
    ]
    with pytest.raises(ToolOutputError, match="no Topic Partition"):
        parse_find_hanging("Failed to list topics: timed out\n")


def test_a_hanging_transaction_is_reported():
    result = check_kafka_transactions({1: NOTHING_HANGS, 2: HANGING}, LISTED[: LISTED.index("\n")])
    _fails_with(result, "hanging", "broker 2", "orders[3]@41", "producer 1002")


def test_a_transaction_left_ongoing_is_reported():
    result = check_kafka_transactions({1: NOTHING_HANGS}, LISTED, txn_id_prefix="rmq-coord")
    _fails_with(result, "open_txn", "rmq-coord-1 is Ongoing")
    assert {v.where["transactional_id"] for v in result.violations} == {"rmq-coord-1"}
    captured = check_kafka_transactions({1: CAPTURED_NOTHING_HANGS}, CAPTURED_LIST)
    _fails_with(captured, "open_txn", "rmq-coord-0 is Ongoing (coordinator 1, producer 0)")
    assert len(captured.violations) == 1


def test_unreadable_tool_output_fails_the_check():
    _fails_with(check_kafka_transactions({1: "Error: broken pipe"}, LISTED), "unparseable")


PENDING = """\
┏━━━━━━━━┳━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━┳━━━━━━━━━┳━━━━━━━━┳━━━━━━━━━━┳━━━━━━┓
┃ txn id ┃ real topic ┃ producer group ┃ age (s) ┃ checks ┃ answered ┃ half ┃
┡━━━━━━━━╇━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━╇━━━━━━━━━╇━━━━━━━━╇━━━━━━━━━━╇━━━━━━┩
│ tx-1   │ orders     │ pg             │ 12.0    │ 3      │ 2        │ 0:15 │
│ tx-2   │ orders-b   │ pg             │ 1.5     │ 0      │ 0        │ 1:7  │
└────────┴────────────┴────────────────┴─────────┴────────┴──────────┴──────┘
"""
DISCARDED_ASCII = """\
+-------------------------------------------------------------------------------------+
| txn id | real topic | producer group | checks | reason | discarded (s ago) | half | members |
|--------+------------+----------------+--------+--------+-------------------+------+---------|
| tx-9   | orders     | pg             | 15     | check_max, | 3.0       | 0:1  | 1/1     |
|        |            |                |        | late_commit |          |      |         |
+-------------------------------------------------------------------------------------+
"""


def test_txn_pending_and_discarded_tables_are_parsed():
    assert parse_pending(TXN_PENDING_EMPTY) == []
    assert [(r["txn id"], r["half"]) for r in parse_pending(PENDING)] == [
        ("tx-1", "0:15"),
        ("tx-2", "1:7"),
    ]
    (row,) = parse_discarded(DISCARDED_ASCII)
    assert (row["txn id"], row["reason"]) == ("tx-9", "check_max,late_commit")
    with pytest.raises(ToolOutputError, match="no 'txn id' table"):
        parse_pending("error: could not reach the broker")


def test_a_transaction_left_pending_or_discarded_is_reported():
    result = check_settled(PENDING, DISCARDED_ASCII)
    _fails_with(result, "pending", "tx-1", "tx-2", "orders-b")
    _fails_with(result, "discarded", "tx-9", "check_max")
    objects = check_settled([{"txn_id": "tx-3", "real_topic": "t", "producer_group": "g"}], [])
    _fails_with(objects, "pending", "tx-3", "group g")
    assert check_settled(TXN_PENDING_EMPTY, []).passed


# the history format


def test_the_history_round_trips_from_two_threads(tmp_path):
    path = tmp_path / "producer-1.jsonl"
    written: list[Event] = []
    with Recorder(path, "producer-1") as recorder:

        def work(name: str) -> None:
            for i in range(200):
                written.append(
                    recorder.emit(
                        ev.send(
                            f"{name}-{i}",
                            "grp",
                            ["orders"],
                            [f"{name}-m{i}"],
                            "COMMIT",
                            keys=[None],
                        )
                    )
                )

        threads = [threading.Thread(target=work, args=(n,)) for n in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    other = tmp_path / "harness.jsonl"
    with Recorder(other, "harness") as recorder:
        written.append(recorder.emit(ev.fault("broker_sigstop", "broker-1", 5, seed=7)))
        written.append(recorder.record("run", phase="end", seed=7))
    history = load([tmp_path])
    assert (history.bad, history.torn, history.seed) == ([], [], 7)
    assert history.events == sorted(written, key=lambda e: (e.mono_s, e.proc, e.seq))
    sends = history.of(Kind.SEND)
    assert sorted(e.seq for e in sends) == list(range(400))
    assert sends[0]["keys"] == [None] and sends[0]["intent"] == "COMMIT"
    assert history.paths == [str(other), str(path)]


def test_a_torn_last_line_is_counted_and_a_bad_line_fails_the_history_check(tmp_path):
    good = at(ev.observed("rebalance"), 1.0, proc="c1").to_json()
    (tmp_path / "c1.jsonl").write_text(good + "\n" + good[:20])
    (tmp_path / "c2.jsonl").write_text('{"kind": "nope"}\n' + good + "\n")
    history = load(tmp_path)
    assert len(history) == 2 and len(history.torn) == 1
    _fails_with(check_history(history), "bad_line", "c2.jsonl:1", "unknown kind 'nope'")


def test_an_event_without_its_required_fields_is_refused(tmp_path):
    with (
        Recorder(tmp_path / "c1.jsonl", "c1") as recorder,
        pytest.raises(ValueError, match="a consumed event needs msg_id"),
    ):
        recorder.record(
            "consumed", consumer="push", group="g", instance="i", topic="t", partition=0, offset=1
        )
    assert (tmp_path / "c1.jsonl").read_text() == ""


# the summary


def test_the_summary_counts_and_names_the_seed_and_history_on_failure(tmp_path):
    history = _plant(at(ev.final_read("orders", 1, 7, msg_id="m1"), 31.0))
    results = run_all(history, horizon_s=HORIZON_S, minimums=MINIMUMS, echo=False)
    console = Console(file=io.StringIO(), width=160)
    text = render_summary(
        history, results, history_paths=[str(tmp_path / "h.jsonl")], console=console
    )
    assert "broker_sigkill" in text and "txn UNKNOW_then_COMMIT" in text
    assert "exactly_once" in text and "FAIL" in text
    assert f"replay with seed 42 (make campaign SEEDS=42); history: {tmp_path}/h.jsonl" in text
    assert text == console.file.getvalue()
    clean = run_all(history_of(clean_events()), horizon_s=HORIZON_S, minimums=MINIMUMS, echo=False)
    assert failure_line(clean, 42, ["h"]) is None


def test_key_mode_orders_by_the_message_group_header_before_the_record_key():
    # m5a (key k2) shares message group k1 with m1 and m3: processed before m1, out of order.
    regrouped = [
        e
        if not (e.kind is Kind.FINAL_READ and e["msg_id"] in ("m1", "m5a"))
        else at(
            ev.final_read(
                e["topic"],
                e["partition"],
                e["offset"],
                msg_id=e["msg_id"],
                key=e["key"],
                headers={"rmq.message_group": "g1"},
            ),
            31.0,
        )
        for e in clean_events()
    ]
    early = at(ev.consumed("orderly", "og", "c1", "orders", 0, 1, "m5a", key="k2"), 4.0)
    assert check_orderly(history_of([*clean_events(), early])).passed
    _fails_with(
        check_orderly(history_of([*regrouped, early])), "out_of_order", "key 'g1'", "orders[0]@1"
    )


def test_a_pattern_subscription_expects_every_matching_topic_read():
    # The push group subscribed by pattern only: a record of a matching topic it never
    # processed is lost; a topic the pattern does not match is not its business.
    def drop_m5b(e):
        return (e.kind is Kind.SUBSCRIBE and e["consumer"] == "push") or (
            e.kind is Kind.CONSUMED and e["group"] == "pg" and e["msg_id"] == "m5b"
        )

    extra = [
        at(ev.subscribe("push", "pg", "push-1", [], pattern="^(orders|audit)$"), 0.6),
        at(ev.final_read("other", 0, 0, msg_id="x1"), 31.0),
    ]
    result = check_push(_plant(*extra, drop=drop_m5b), echo=False)
    _fails_with(result, "lost", "m5b")
    assert {v.where.get("msg_id") for v in result.violations} == {"m5b"}


def test_dead_letters_must_be_exactly_the_planned_ones():
    planned = {"m5a"}.__contains__
    assert check_push(history_of(clean_events()), dead_letter_expected=planned, echo=False).passed
    _fails_with(
        check_push(history_of(clean_events()), dead_letter_expected=lambda m: False, echo=False),
        "unexpected_dead_letter",
        "m5a",
    )
    _fails_with(
        check_push(
            history_of(clean_events()), dead_letter_expected={"m5a", "m1"}.__contains__, echo=False
        ),
        "missing_dead_letter",
        "m1",
    )


def test_find_hanging_is_limited_to_the_runs_topics():
    header = "\t".join(FIND_HANGING_HEADERS)
    other = header + "\n" + "\t".join(["other-topic", "0", "7", "0", "3", "12", "1", "9"])
    ours = header + "\n" + "\t".join(["cw30-t0", "0", "7", "0", "3", "12", "1", "9"])
    listing = "\t".join(LIST_HEADERS) + "\n"
    assert check_kafka_transactions(
        {1: other}, listing, topic_prefixes=["cw30-"], echo=False
    ).passed
    _fails_with(
        check_kafka_transactions({1: ours}, listing, topic_prefixes=["cw30-"], echo=False),
        "hanging",
        "cw30-t0[0]@12",
    )
