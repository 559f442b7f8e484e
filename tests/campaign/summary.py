"""The campaign's closing table: faults by kind, records by outcome, each checker's verdict;
on failure, the seed and the history files to replay it."""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from tests.campaign.checkers import OBSERVATIONS
from tests.campaign.history import History, Kind
from tests.campaign.result import CheckResult

__all__ = ["failure_line", "outcome_counts", "render_summary"]


def outcome_counts(history: History) -> Counter[str]:
    """Transactions by intent, then what became of the messages (rows, reads, timer
    messages, consumers)."""
    counts: Counter[str] = Counter()
    for e in history.of(Kind.SEND):
        counts[f"txn {e['intent']}"] += 1
    counts["send failed"] = len(history.of(Kind.SEND_FAILED))
    counts["msgs committed (rows)"] = len(history.of(Kind.COMMITTED_ROW))
    counts["records read at the end"] = len(history.of(Kind.FINAL_READ))
    if history.of(Kind.TIMER_SEND):
        counts["timer msgs sent"] = sum(1 for e in history.of(Kind.TIMER_SENT) if e["ok"])
        counts["timer sends failed"] = len(history.of(Kind.TIMER_SEND)) - counts["timer msgs sent"]
        counts["timer msgs recalled"] = sum(1 for e in history.of(Kind.TIMER_RECALLED) if e["ok"])
    for e in history.of(Kind.CONSUMED):
        counts[f"consumed by {e['consumer']}"] += 1
    for e in history.of(Kind.SIMPLE):  # the SimpleConsumer's: received, ack_ok, ...
        counts[f"simple {e['event']}"] += 1
    counts["push retries"] = len(history.of(Kind.PUSH_RETRY))
    counts["dead letters"] = len(history.of(Kind.DLQ))
    if history.of(Kind.SPARK_ROW):
        counts["spark rows"] = len(history.of(Kind.SPARK_ROW))
    return counts


def failure_line(
    results: Sequence[CheckResult], seed: int | None, history_paths: Sequence[str]
) -> str | None:
    """``None`` when every checker passed, else how to replay the run."""
    failed = [r.name for r in results if not r.passed]
    if not failed:
        return None
    return (
        f"FAILED {', '.join(failed)}: replay with seed {seed if seed is not None else '?'} "
        f"(make campaign SEEDS={seed if seed is not None else '?'}); history: "
        f"{' '.join(history_paths) or '(none)'}"
    )


def render_summary(
    history: History,
    results: Sequence[CheckResult],
    *,
    seed: int | None = None,
    history_paths: Sequence[str] | None = None,
    console: Console | None = None,
) -> str:
    """Print the summary with rich (to ``console``, default stdout) and return it as text."""
    seed = history.seed if seed is None else seed
    paths = list(history.paths if history_paths is None else history_paths)
    out = console or Console(width=120)
    faults = Table("fault", "injected", title=f"faults (seed {seed})")
    for kind, n in sorted(Counter(e["fault"] for e in history.of(Kind.FAULT)).items()):
        faults.add_row(kind, str(n))
    for kind in OBSERVATIONS:
        faults.add_row(
            f"observed {kind.value}", str(sum(int(e.get("count", 1)) for e in history.of(kind)))
        )
    outcomes = Table("outcome", "count", title="records")
    for name, n in outcome_counts(history).items():
        outcomes.add_row(name, str(n))
    checks = Table("checker", "verdict", "summary", "violations", title="checkers")
    for r in results:
        verdict = "[green]PASS[/]" if r.passed else "[bold red]FAIL[/]"
        checks.add_row(r.name, verdict, r.summary, str(len(r.violations)))
    line = failure_line(results, seed, paths)
    plain = Console(file=io.StringIO(), width=120, color_system=None)
    for target in (out, plain):
        for table in (faults, outcomes, checks):
            target.print(table)
        if line:
            target.print(line, style="bold red", soft_wrap=True, markup=False)
    return plain.file.getvalue()  # type: ignore[attr-defined]
