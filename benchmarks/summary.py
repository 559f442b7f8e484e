"""The README's bench summary: a few sentences between :data:`BEGIN` and :data:`END`, rendered
from ``bench/results.json`` as the benchmarks page's block is (:mod:`.readme`), so the README
quotes the same run as the page and cannot keep figures of an older one."""

from __future__ import annotations

from typing import Any

from benchmarks.page_text import TIMES, fig, median, ms, rate, ratio

__all__ = ["BEGIN", "END", "render_summary"]

BEGIN = "<!-- bench-summary:begin -->"
END = "<!-- bench-summary:end -->"


def _when(r: dict) -> str:
    taken = sorted(
        info["taken_at"][:10]
        for info in (r.get("cases") or {}).values()
        if isinstance(info, dict) and info.get("taken_at")
    )
    if not taken:
        return ""
    return (
        f" (taken {taken[0]})" if taken[0] == taken[-1] else f" (taken {taken[0]} to {taken[-1]})"
    )


def _p50_p99(f: Any) -> str:
    if not isinstance(f, dict) or median(f.get("p99")) is None:
        return "not measured"
    return f"{fig(f.get('p50'), ms)} / {fig(f.get('p99'), ms)} ms"


def render_summary(r: dict) -> str:
    """The summary block (markers included) for results ``r``."""
    t32 = (r.get("threads") or {}).get("32", {})
    sentences = [
        f"On a {r.get('machine', {}).get('cores', '?')}-core machine, broker included, "
        f"medians of the bench's runs{_when(r)}: 32 threads calling "
        f"`send_message_in_transaction` reach {fig(t32.get('confirmed_per_s'), rate, '/s')} "
        f"confirmed, RocketMQ 5.5.0 in the same run "
        f"{fig(r.get('rocketmq_txn_per_s'), rate, '/s')} "
        f"({fig(r.get('threads32_vs_rocketmq'), ratio, TIMES)});",
        f"commit → visible at 1,000 msgs/s p50 / p99 {_p50_p99(r.get('commit_to_visible_ms'))} "
        f"(RocketMQ {_p50_p99(r.get('rocketmq_commit_to_visible_ms'))}; the p99 "
        f"{fig(r.get('latency_vs_copier_p99'), ratio, TIMES)} the exactly-once copier's);",
        f"the batch API {fig(r.get('txn_msgs_per_s'), rate, '/s')} "
        f"({fig(r.get('txn_vs_copier'), ratio, TIMES)} the copier); the orderly consumer "
        f"{fig(r.get('orderly_ratio'), ratio, TIMES)} a plain consumer.",
    ]
    return "\n".join(
        [
            BEGIN,
            "<!-- rendered from bench/results.json by `python -m benchmarks --render "
            "--page README.md`: change the renderer, not this block -->",
            *sentences,
            END,
        ]
    )
