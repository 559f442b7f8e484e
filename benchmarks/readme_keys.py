"""The keys case on the benchmarks page (issue 16): its goals' rows in the figures table,
and every mode of it beside Parallel Consumer's published seconds."""

from __future__ import annotations

from benchmarks.page_text import (
    DASH,
    TIMES,
    at_least,
    at_most,
    fig,
    judged,
    num,
    ratio,
)

__all__ = ["KEY_MODE_LABELS", "PC_SECONDS", "keys_block", "keys_rows", "keys_table"]

# Parallel Consumer's published table (10,000 messages of 0-5 ms, 1 partition, 16 threads),
# seconds per mode of the keys case; "unordered" is its UNORDERED mode.
PC_SECONDS = {
    "partition": 22.2,
    "key_1": 26.7,
    "key_20": 2.24,
    "key_10000": 2.13,
    "unordered": 2.83,
}
# Goals of issue 16: key order with 20 keys at least 10x partition order and at least
# Parallel Consumer's ratio; 1 key within 20 % of partition order; the rest below.
GOAL_KEY20_SPEEDUP = max(10.0, PC_SECONDS["partition"] / PC_SECONDS["key_20"])
GOAL_KEY1_VS_PARTITION, GOAL_ZIPF_VS_BOUND, GOAL_FAILING_KEY = 1.2, 0.8, 0.9
KEY_MODE_LABELS = {
    "partition": "partition order",
    "key_1": "key order, 1 key",
    "key_5": "key order, 5 keys",
    "key_20": "key order, 20 keys",
    "key_10000": "key order, 10,000 keys",
    "zipf": "key order, Zipf(1.1) over 1,000 keys",
    "unordered": "every record its own key (unordered)",
    "failing_key": "20 keys, one always failing: the other 19",
}


def keys_rows(r: dict) -> list[tuple[str, str, str, str]]:
    """The keys case's goals (issue 16); none before the case was first run."""
    k = r.get("keys")
    if not isinstance(k, dict):
        return []
    modes, g = k.get("modes") or {}, k.get
    zipf, unordered = modes.get("zipf") or {}, modes.get("unordered") or {}
    speedup_met = at_least(g("key20_speedup"), GOAL_KEY20_SPEEDUP)
    ratio_met = at_least(g("failing_key_ratio"), GOAL_FAILING_KEY)
    dlq = g("failing_key_dlq_records")
    dlq_low = dlq.get("min") if isinstance(dlq, dict) else None
    failing_met = (
        None
        if ratio_met is None or dlq_low is None
        else ratio_met and dlq_low == g("failing_key_records")
    )
    pc = PC_SECONDS["partition"] / PC_SECONDS["key_20"]
    return [
        (
            "keys",
            "key order, 20 keys, against partition order (speed-up)",
            fig(g("key20_speedup"), ratio, TIMES),
            judged(f"≥ 10{TIMES} and ≥ Parallel Consumer's {pc:.1f}{TIMES}", speedup_met),
        ),
        (
            "keys",
            "key order, 1 key, against partition order (seconds)",
            fig(g("key1_vs_partition"), ratio, TIMES),
            judged(
                f"≤ {GOAL_KEY1_VS_PARTITION}{TIMES} (within 20 %)",
                at_most(g("key1_vs_partition"), GOAL_KEY1_VS_PARTITION),
            ),
        ),
        (
            "keys",
            "Zipf(1.1) keys over 1,000: critical-path bound / measured",
            f"{fig(g('zipf_vs_bound'), ratio, TIMES)} "
            f"(bound {fig(g('zipf_bound_s'), ratio, ' s')}, "
            f"measured {fig(zipf.get('seconds'), ratio, ' s')}; unordered "
            f"{fig(unordered.get('seconds'), ratio, ' s')})",
            judged(
                f"≥ {GOAL_ZIPF_VS_BOUND}{TIMES}", at_least(g("zipf_vs_bound"), GOAL_ZIPF_VS_BOUND)
            ),
        ),
        (
            "keys",
            "one key always failing: the other keys' rate against 20 healthy keys",
            f"{fig(g('failing_key_ratio'), ratio, TIMES)}; in the DLQ "
            f"{fig(dlq, num)} of its {num(g('failing_key_records') or '?')} records",
            judged(f"≥ {GOAL_FAILING_KEY}{TIMES}, all of them in the DLQ", failing_met),
        ),
    ]


def keys_table(r: dict) -> list[str]:
    """Every mode of the keys case beside Parallel Consumer's published seconds."""
    k = r.get("keys")
    if not isinstance(k, dict):
        return []
    modes, s = k.get("modes") or {}, k.get("settings") or {}
    pc_partition = PC_SECONDS["partition"]
    lines = [
        "### Key-ordered consumption and Parallel Consumer",
        "",
        f"| mode | seconds: median (min{DASH}max) | speed-up against partition order "
        "| Parallel Consumer (published) |",
        "| --- | --- | --- | --- |",
    ]
    for mode, label in KEY_MODE_LABELS.items():
        m = modes.get(mode) or {}
        pc = PC_SECONDS.get(mode)
        theirs = "—" if pc is None else f"{pc:g} s ({ratio(pc_partition / pc)}{TIMES})"
        lines.append(
            f"| {label} | {fig(m.get('seconds'), ratio, ' s')} | "
            f"{fig(m.get('speedup'), ratio, TIMES)} | {theirs} |"
        )
    lines += [
        "",
        f"Each mode consumes {num(s.get('messages', '?'))} records of one partition "
        f"with {s.get('workers', '?')} workers; the listener sleeps a seeded random "
        f"0{DASH}{s.get('max_wait_ms', '?')} ms per record, the same in every mode, and "
        "a mode is timed from its first call to its last completion. The failing key "
        f"is suspended for {s.get('failing_suspend_ms', '?')} ms each time and parks "
        f"to the DLQ after {s.get('failing_max_reconsume_times', '?')} retries; its row "
        "times the other keys. Parallel Consumer's figures are those of its README "
        f"(10,000 messages of 0{DASH}5 ms, 1 partition, 16 threads), not re-measured.",
        "",
    ]
    return lines


def keys_block(results: dict) -> list[str]:
    table = keys_table(results)
    return ["", *table[:-1]] if table else []
