"""The metrics the dashboard and the alert rules read (docker/grafana, docker/prometheus):
label values that exist at 0 from the start, check answers by state, partition ownership and
the check horizon."""

from __future__ import annotations

from coordinator.metrics import CoordinatorMetrics, publish_partition_counters
from coordinator.settings import CoordinatorSettings
from coordinator.txn_service import check_horizon_ms
from rmq_semantics.topics import SystemTopics
from tests.unit.test_txn_state import T0, end, half, live


def test_event_counters_exist_at_zero_so_the_first_event_is_an_increase():
    registry = CoordinatorMetrics().registry
    for name, labels in [
        ("rmq_discarded_total", {"reason": "check_max"}),
        ("rmq_discarded_total", {"reason": "too_large"}),
        ("rmq_rejected_requests_total", {"reason": "mismatch"}),
        ("rmq_checks_answered_total", {"state": "unknown"}),
        ("rmq_lock_events_total", {"event": "taken_over"}),
    ]:
        assert registry.get_sample_value(name, labels) == 0.0, (name, labels)


def test_check_answers_are_counted_by_state_and_inline_decisions_are_not():
    metrics = CoordinatorMetrics()
    st = live()
    for offset in range(3):
        st.on_half(offset, half(offset), T0)
    [issued] = [a for a in st.due(T0 + 6000) if a.half.offset == 0]
    st.on_end_request(end(0, 0, "UNKNOWN", from_check=True, seq=issued.check_seq), T0)
    st.on_end_request(end(1, 1, "COMMIT", from_check=True, seq=1), T0)
    st.on_end_request(end(2, 2, "ROLLBACK"), T0)  # inline: not an answer
    publish_partition_counters(metrics, SystemTopics("rmq"), {0: st}, age_due=True)
    sample = metrics.registry.get_sample_value
    assert {
        s: sample("rmq_checks_answered_total", {"state": s})
        for s in ("commit", "rollback", "unknown")
    } == {"commit": 1, "rollback": 0, "unknown": 1}


def test_partition_gauges_are_read_at_each_scrape():
    metrics = CoordinatorMetrics()
    owned = [1]
    metrics.watch_partitions("transactions", lambda: 4, lambda: len(owned))
    sample = metrics.registry.get_sample_value
    assert sample("rmq_owned_partitions", {"service": "transactions"}) == 1
    owned += [2, 3]
    assert sample("rmq_owned_partitions", {"service": "transactions"}) == 3
    assert sample("rmq_partitions", {"service": "transactions"}) == 4


def test_the_check_horizon_is_the_timeout_plus_check_max_intervals():
    settings = CoordinatorSettings(transaction_timeout_ms=1500, check_interval_ms=2500, check_max=3)
    assert check_horizon_ms(settings) == 9000
