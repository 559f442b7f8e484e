"""What a bench run shows while it runs and when it ends: a ``rich`` progress bar over
cases x runs and a table of every figure's median and min-max in a terminal; plain lines
otherwise (a log file, CI)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rich.console import Console, JustifyMethod
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

__all__ = ["BenchConsole", "flat_figures"]


def flat_figures(results: dict, path: str = "") -> Iterator[tuple[str, dict]]:
    """Every figure (``{"median", "min", "max", "runs"}``) in ``results``, by key path."""
    for key, value in results.items():
        if key in ("machine", "settings", "cases") or not isinstance(value, dict):
            continue
        name = f"{path}.{key}" if path else key
        if "median" in value and "runs" in value:
            yield name, value
        else:
            yield from flat_figures(value, name)


def _short(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _run_line(run: dict) -> str:
    """A run's figures on one line: floats, and the p50/p99 of its samples."""
    parts = []
    for key, value in run.items():
        if isinstance(value, float):
            parts.append(f"{key} {_short(value)}")
        elif isinstance(value, dict) and isinstance(value.get("samples"), list):
            from benchmarks.common import percentile

            samples = value["samples"]
            parts.append(
                f"{key} p50 {_short(percentile(samples, 50))} p99 {_short(percentile(samples, 99))}"
            )
        elif isinstance(value, dict) and (inner := _run_line(value)):
            parts.append(f"{key}: {{{inner}}}")
    return ", ".join(parts)


class BenchConsole:
    """Progress of a bench run (``with``), its log lines, and the final table."""

    def __init__(self, total: int, console: Console | None = None) -> None:
        self.console = console or Console()
        self.live = self.console.is_terminal
        self.total = total
        self._progress: Progress | None = None
        self._task: Any = None

    def __enter__(self) -> BenchConsole:
        if self.live:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=self.console,
            )
            self._progress.start()
            self._task = self._progress.add_task("bench", total=self.total)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def log(self, line: str) -> None:
        if self._progress is not None:
            self._progress.console.print(line, markup=False, highlight=False)
        else:
            print(line, flush=True)

    def begin(self, case: str, run: int, repeat: int, load: dict) -> None:
        busy = load.get("cpu_busy")
        where = f"{case} run {run + 1}/{repeat}"
        if self._progress is not None:
            self._progress.update(self._task, description=where)
        self.log(f"{where}: starting (machine {'?' if busy is None else f'{busy:.0%}'} busy)")

    def done(self, case: str, run: int, repeat: int, result: dict, seconds: float) -> None:
        self.log(f"{case} run {run + 1}/{repeat} ({seconds:.1f} s): {_run_line(result)}")
        if self._progress is not None:
            self._progress.advance(self._task)

    def table(self, results: dict, busy: set[str]) -> None:
        """Every figure's median and min-max (the cases of ``busy`` marked)."""
        rows = list(flat_figures(results))
        if not self.live:
            for name, fig in rows:
                print(
                    f"{name}: {_short(fig['median'])} ({_short(fig['min'])}-"
                    f"{_short(fig['max'])}, {len(fig['runs'])} runs)",
                    flush=True,
                )
            if busy:
                print(f"taken on a busy machine: {', '.join(sorted(busy))}", flush=True)
            return
        table = Table(title="bench: median (min-max) over the runs")
        columns: tuple[tuple[str, JustifyMethod], ...] = (
            ("figure", "left"),
            ("median", "right"),
            ("min-max", "right"),
            ("runs", "right"),
        )
        for column, justify in columns:
            table.add_column(column, justify=justify)
        for name, fig in rows:
            table.add_row(
                name,
                _short(fig["median"]),
                f"{_short(fig['min'])}-{_short(fig['max'])}",
                str(len(fig["runs"])),
            )
        self.console.print(table)
        if busy:
            self.console.print(f"[yellow]taken on a busy machine:[/] {', '.join(sorted(busy))}")
