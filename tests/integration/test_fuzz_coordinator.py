"""The fuzzer's short run through a real coordinator (issue 12; ``make fuzz`` is the long
one): a few hundred bad records of every category on the system topics, among good
transactions, lock calls and timer messages sent through ``Producer.send`` (issue 35: forged
timer records on the intake and a level topic, garbage cancels and cancels of another group;
each valid timer message delivered once, each bad one discarded with its reason). It
asserts the invariants, so it fails until the fixes of issue 12 are in: the known-bad
categories (``tests/fuzz/categories.py``) crash or lose messages today.
``python -m tests.fuzz --only NAME --records 300`` runs one alone.
"""

from __future__ import annotations

import pytest

from tests.fuzz.categories import select
from tests.fuzz.coordinator_run import run

pytestmark = pytest.mark.integration

RECORDS = 300
SEED = 12  # fixed: CI sees the same records every run


def test_a_coordinator_survives_every_kind_of_bad_record_and_loses_no_good_one(broker, tmp_path):
    report = run(
        broker.bootstrap,
        records=RECORDS,
        categories=select(),
        seed=SEED,
        conf=broker.conf(),
        log_dir=tmp_path,
    )
    print(report.text())
    assert not report.violations(), report.text()
    assert sum(report.sent.values()) >= RECORDS and report.good
