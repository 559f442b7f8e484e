"""The short fault campaign (issue 30, ``make campaign-short``) on the session's 3-node
cluster, so CI's cluster step reuses its cluster: producer and consumer processes through
the public API, the nemesis, and the checkers over the recorded history. A failure names
the seed and the out dir holding the history to replay it."""

from __future__ import annotations

import pytest

from tests.campaign.__main__ import SHORT_LOAD_S, SHORT_SEED
from tests.campaign.runner import Campaign, Options

pytestmark = pytest.mark.cluster


def test_short_campaign(cluster, tmp_path):
    out = tmp_path / f"campaign-{SHORT_SEED}"
    code = Campaign(Options(SHORT_SEED, SHORT_LOAD_S, True, out), cluster=cluster).run()
    assert code == 0, (out / "summary.txt").read_text()
