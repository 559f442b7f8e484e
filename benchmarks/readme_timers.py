"""Timer messages on the benchmarks page (issue 35): the ``timers`` case's lateness row in the
figures table, and the coordinator's memory with a million messages scheduled (``make
bench-timers-million``, :mod:`.timer_memory`) as a section of its own."""

from __future__ import annotations

from typing import Any

from benchmarks.page_text import at_most, fig, judged, num, pcts, rate, whole

__all__ = ["GOAL_RSS_MIB", "timer_memory_block", "timers_rows"]

#: Issue 35's goals: lateness p99 <= 100 ms at 1,000 due msgs/s (benchmarks/timers.py), and
#: RSS with a million scheduled within 100 MiB of its RSS with 1,000.
GOAL_P99_MS = 100.0
GOAL_RSS_MIB = 100.0


def timers_rows(r: dict) -> list[tuple[str, str, str, str]]:
    late = r.get("timer_lateness_ms")
    if not isinstance(late, dict):
        return []  # a results file from before the case
    return [
        (
            "timers",
            f"timer messages: due → visible to a read_committed consumer at "
            f"{num(late.get('due_msgs_per_s', '?'))} due msgs/s, all scheduled with "
            f"`Producer.send` from {late.get('threads', '?')} threads before the window, "
            f"each at least {num(late.get('lead_ms', '?'))} ms ahead",
            f"{pcts(late)}; scheduled at {fig(late.get('scheduled_msgs_per_s'), rate, '/s')}",
            judged(f"p99 ≤ {GOAL_P99_MS:g} ms", at_most(late.get("p99"), GOAL_P99_MS)),
        )
    ]


def _mib(v: Any) -> str:
    return "not measured" if not isinstance(v, (int, float)) else f"{v:,.0f} MiB"


def timer_memory_block(r: dict) -> list[str]:
    """The million-message section, from ``timer_memory`` (None: never run)."""
    m = r.get("timer_memory")
    if not isinstance(m, dict):
        return []
    base, full, firing = (m.get(k) for k in ("rss_mib_base", "rss_mib_full", "rss_mib_firing"))
    grown = None
    if isinstance(base, (int, float)):
        grown = max((v - base for v in (full, firing) if isinstance(v, (int, float))), default=None)
    met = None if grown is None else grown <= GOAL_RSS_MIB
    smoke = (
        " Taken on a shared machine (a smoke figure, not a quiet measurement)."
        if m.get("smoke")
        else ""
    )
    return [
        "",
        "### Timer messages: the coordinator's memory",
        "",
        "| timer messages | coordinator RSS (VmRSS) |",
        "| --- | --- |",
        f"| {num(m.get('base_count', '?'))} messages scheduled | {_mib(base)} |",
        f"| {num(m.get('count', '?'))} scheduled over the next "
        f"{fig(m.get('horizon_h'), whole, ' h')} | {_mib(full)} |",
        f"| the same, while {num(m.get('fire_count', '?'))} more fire at "
        f"{num(m.get('fire_rate', '?'))}/s (highest sample) | {_mib(firing)} |",
        f"| growth over the {num(m.get('base_count', '?'))}-message figure | "
        f"{_mib(grown)}: {judged(f'≤ {GOAL_RSS_MIB:g} MiB', met)} |",
        "",
        f"`make bench-timers-million` ({m.get('taken_at', '?')}; scheduling took "
        f"{fig(m.get('schedule_s'), whole, ' s')}, the coordinator took them in "
        f"{fig(m.get('taken_s'), whole, ' s')}).{smoke} The messages that fired, with the "
        f"others waiting, were late by {pcts(m.get('fire_lateness_ms'))}.",
    ]
