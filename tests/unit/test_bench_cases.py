"""`bench --cases`: an unknown case is refused before anything starts, and a run's figures
are merged into the results file instead of replacing the other cases'."""

from __future__ import annotations

import json

import pytest

from rmq_semantics.tools.bench.common import BenchSettings
from rmq_semantics.tools.bench.runner import _merge_into, run_bench


def test_an_unknown_case_is_refused_before_any_broker_starts(tmp_path):
    with pytest.raises(ValueError, match=r"unknown bench cases.*'nope'"):
        run_bench(tmp_path / "r.json", BenchSettings.quick(), cases=("threads", "nope"))
    assert not (tmp_path / "r.json").exists()


def test_a_partial_run_keeps_the_other_cases_and_thread_counts(tmp_path):
    out = tmp_path / "results.json"
    out.write_text(json.dumps({"txn_msgs_per_s": 100.0, "threads": {"1": "old"}}))
    merged = _merge_into(out, {"threads": {"32": "new"}, "elapsed_s": 3})
    assert merged == {"txn_msgs_per_s": 100.0, "threads": {"1": "old", "32": "new"},
                      "elapsed_s": 3}
    assert _merge_into(tmp_path / "absent.json", {"a": 1}) == {"a": 1}
