"""The upgrade watermarks without a broker (coordinator/marker_keys.py): a fresh install
trusts no unsigned marker, an upgrade from a release before signing trusts what was there,
and the records of the keys topic are fuzzed like every other record type."""

from __future__ import annotations

import json
import random

import pytest

from coordinator import marker_keys
from coordinator.marker_auth import MarkerKey
from coordinator.marker_keys import KINDS, _parse, load_verifier, tenancy_watermarks
from coordinator.settings import CoordinatorSettings
from tests.fuzz import generators as gen

KEY = MarkerKey(b"k" * 32)
SETTINGS = CoordinatorSettings(topic_prefix="__rmq")


class FakeKeysTopic:
    """The keys topic in memory: the first record of each kind (per partition) wins."""

    records: list[dict] = []
    ends: dict[int, int] = {}
    committed = False  # whether the coordinators' group has committed progress

    def __init__(self, conf: dict, topic: str, instance_id: str) -> None:
        self.asked_committed = 0

    def read(self) -> list[dict]:
        return list(FakeKeysTopic.records)

    def write(self, records: list[tuple[str, dict]]) -> None:
        FakeKeysTopic.records += [
            {"v": 1, "kind": name.split("/")[0], **fields} for name, fields in records
        ]

    def end_offsets(self, topic: str, partitions: list[int]) -> dict[int, int]:
        return {p: FakeKeysTopic.ends[p] for p in partitions}

    def had_coordinator(self, group: str, topics: set[str]) -> bool:
        assert group == "__rmq_coordinator" and topics == {"__rmq_half", "__rmq_op"}
        return FakeKeysTopic.committed

    def close(self) -> None:
        pass


@pytest.fixture
def keys(monkeypatch: pytest.MonkeyPatch) -> type[FakeKeysTopic]:
    monkeypatch.setattr(marker_keys, "_KeysTopic", FakeKeysTopic)
    # No timer topic yet (a prefix that never scheduled a message): see the timer tests.
    monkeypatch.setattr(
        marker_keys, "topic_partition_count", lambda conf, topic: None if "_timer" in topic else 2
    )
    FakeKeysTopic.records, FakeKeysTopic.ends, FakeKeysTopic.committed = [], {0: 7, 1: 3}, False
    return FakeKeysTopic


def _history(records: list[dict]) -> list[bool]:
    return [r["earlier"] for r in records if r["kind"] == "history"]


def test_a_fresh_install_trusts_no_unsigned_marker(keys):
    """Op holds records (a producer's, a forger's) but no coordinator ever ran: every
    watermark is 0, and the decision is recorded after them."""
    verifier = load_verifier({}, SETTINGS, KEY, "c1")
    assert verifier.watermarks == {0: 0, 1: 0}
    assert [r["kind"] for r in keys.records][-1] == "history"
    assert _history(keys.records) == [False]
    # A later start, with older committed progress by then (its own), changes nothing.
    keys.committed = True
    assert load_verifier({}, SETTINGS, KEY, "c2").watermarks == {0: 0, 1: 0}
    assert _history(keys.records) == [False]


def test_an_upgrade_trusts_what_the_older_coordinators_left(keys):
    keys.committed = True  # an older release's coordinators committed their progress
    assert load_verifier({}, SETTINGS, KEY, "c1").watermarks == {0: 7, 1: 3}
    assert _history(keys.records) == [True]


def test_a_partition_added_after_the_first_start_gets_no_history(keys, monkeypatch):
    keys.committed = True
    load_verifier({}, SETTINGS, KEY, "c1")
    monkeypatch.setattr(marker_keys, "topic_partition_count", lambda conf, topic: 3)
    keys.ends[2] = 9
    assert load_verifier({}, SETTINGS, KEY, "c2").watermarks == {0: 7, 1: 3, 2: 0}


def test_watermarks_of_the_release_before_history_mean_an_earlier_coordinator(keys):
    """Keys written by coordinators before the history record existed: their watermarks
    stand, and a partition they lack is taken as history too (as they would have)."""
    keys.records = [
        {"v": 1, "kind": "fingerprint", "fingerprint": KEY.fingerprint()},
        {"v": 1, "kind": "watermark", "partition": 0, "offset": 5},
    ]
    assert load_verifier({}, SETTINGS, KEY, "c1").watermarks == {0: 5, 1: 3}
    assert _history(keys.records) == [True]


# -- the tenancy watermarks ---------------------------------------------------------------
def test_isolation_from_a_fresh_install_trusts_no_unsigned_record(keys):
    """Half and Op hold records (a tenant's forgeries) but no coordinator ever ran: every
    tenancy watermark is 0, and later starts keep that."""
    assert tenancy_watermarks({}, SETTINGS, "c1") == {"half": {0: 0, 1: 0}, "op": {0: 0, 1: 0}}
    keys.committed = True  # its own progress, by a later start
    assert tenancy_watermarks({}, SETTINGS, "c2") == {"half": {0: 0, 1: 0}, "op": {0: 0, 1: 0}}


@pytest.mark.parametrize("trace", ["keys", "committed"])
def test_isolation_after_coordinators_ran_without_it_trusts_what_was_there(keys, trace):
    """The switch from a deployment without isolation: its coordinators left records in the
    keys topic, or (a release before the keys topic) committed progress."""
    if trace == "keys":
        load_verifier({}, SETTINGS, KEY, "old")  # a coordinator without a tenants file
    else:
        keys.committed = True
    ends = {0: 7, 1: 3}
    assert tenancy_watermarks({}, SETTINGS, "c1") == {"half": ends, "op": ends}


@pytest.mark.parametrize("earlier", [True, False])
def test_the_timer_topics_that_exist_at_the_switch_get_watermarks_too(keys, monkeypatch, earlier):
    """Issue 44, item 8: every timer topic there (intake, cancel, levels) is recorded as the
    half and Op topics are: its ends after coordinators ran without isolation, else 0."""
    monkeypatch.setattr(marker_keys, "topic_partition_count", lambda conf, topic: 2)
    keys.committed = earlier
    marks = tenancy_watermarks({}, SETTINGS, "c1")
    ends = {0: 7, 1: 3} if earlier else {0: 0, 1: 0}
    levels = {f"timer_{level}" for level in range(1, 19)}  # 3 days
    assert set(marks) == {"half", "op", "timer", "timer_cancel", *levels}
    assert marks["timer"] == marks["timer_cancel"] == marks["timer_18"] == ends
    assert tenancy_watermarks({}, SETTINGS, "c2") == marks  # the first record wins


def test_a_tenancy_record_of_before_issue_44_has_no_timer_watermarks(keys):
    keys.records = [{"v": 1, "kind": "tenancy", "half": {"0": 4}, "op": {}}]
    assert tenancy_watermarks({}, SETTINGS, "c1") == {"half": {0: 4}, "op": {}}


# -- the fuzzer's keys records ------------------------------------------------------------
def test_every_keys_record_kind_has_a_generator_and_is_read():
    assert set(gen.KEYS_RECORDS) == set(KINDS), "a keys record kind without a generator"
    rng = random.Random(29)
    for kind, build in gen.KEYS_RECORDS.items():
        record = _parse(build(rng))
        assert record is not None and record["kind"] == kind


def test_mutated_keys_records_are_skipped_or_well_typed_never_raise():
    rng = random.Random(2929)
    types = {
        "key": {"key": str},
        "fingerprint": {"fingerprint": str},
        "watermark": {"partition": int, "offset": int},
        "history": {"earlier": bool},
        "tenancy": {"half": dict, "op": dict},
    }
    for _ in range(3000):
        kind = gen.pick(rng, KINDS)
        data = gen.keys_mutation(rng, gen.KEYS_RECORDS[kind](rng))
        record = _parse(data)
        if record is not None:
            for name, typ in types[record["kind"]].items():
                assert type(record[name]) is typ, (json.loads(data or b"null"), name)
            if record["kind"] == "tenancy":  # the timer topics' watermarks, when present
                assert all(type(v) is dict for k, v in record.items() if k.startswith("timer"))


@pytest.mark.parametrize(
    "value, ok",
    [
        (b'{"v":1,"kind":"history","earlier":true}', True),
        (b'{"v":1,"kind":"history","earlier":false}', True),
        (b'{"v":1,"kind":"history","earlier":1}', False),
        (b'{"v":1,"kind":"history"}', False),
    ],
)
def test_only_well_formed_history_records_are_read(value, ok):
    assert (_parse(value) is not None) is ok


@pytest.mark.parametrize(
    "value, ok",
    [
        (b'{"v":1,"kind":"tenancy","half":{},"op":{"0":3}}', True),  # before issue 44
        (b'{"v":1,"kind":"tenancy","half":{},"op":{},"timer":{"0":2},"timer_4":{}}', True),
        (b'{"v":1,"kind":"tenancy","half":{},"op":{},"timer_cancel":{"0":"2"}}', False),
        (b'{"v":1,"kind":"tenancy","half":{},"op":{},"timer":[]}', False),
    ],
)
def test_tenancy_records_with_and_without_timer_watermarks_are_read(value, ok):
    assert (_parse(value) is not None) is ok
