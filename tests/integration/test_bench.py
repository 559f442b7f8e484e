"""`rmq-semantics bench --quick` runs every case and writes the JSON and plots it promises.
No timing is asserted: speed is what the benchmark reports, not what the tests check."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.integration.txn_helpers import REPO

pytestmark = pytest.mark.integration

REQUIRED = ("baseline_msgs_per_s", "txn_msgs_per_s", "txn_ratio", "orderly_msgs_per_s",
            "plain_consumer_msgs_per_s", "orderly_ratio", "takeover_s", "spark_ratio")


def test_quick_bench_writes_every_figure_and_plot(tmp_path):
    out = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, "-m", "rmq_semantics", "bench", "--quick",
                           "--count", "5000", "--repeat", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=900, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(out.read_text())
    for key in REQUIRED:
        assert results[key] > 0, key
    for key, parts in (("commit_to_visible_ms", ("p50", "p99", "max")),
                       ("check_lateness_ms", ("p50", "p99"))):
        assert all(results[key][part] >= 0 for part in parts), results[key]
    assert results["machine"]["cores"] >= 1 and results["machine"]["kafka"]
    assert results["settings"]["count"] == 5000
    for threads in ("1", "8"):  # the quick run's threads case
        case = results["threads"][threads]
        assert case["confirmed_per_s"]["median"] > 0 and case["consumed_per_s"]["median"] > 0
        assert case["p99_ms"]["median"] >= case["p50_ms"]["median"] > 0
    for plot in results["plots"]:
        assert (tmp_path / plot).stat().st_size > 0
