"""How a figure of ``bench/results.json`` reads on the benchmarks page: numbers at the
precision the runs' spread allows, ``median (min-max)``, percentiles, and a goal met or
missed. Shared by the block's sections (:mod:`.readme`, :mod:`.readme_keys`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

__all__ = [
    "DASH",
    "TIMES",
    "at_least",
    "at_most",
    "fig",
    "judged",
    "median",
    "ms",
    "num",
    "pcts",
    "rate",
    "ratio",
    "whole",
]

# Written as escapes: the linter reads the characters as look-alikes of "-" and "x".
DASH, TIMES = "\u2013", "\u00d7"


# One number as the page shows it: a rate, milliseconds, a count, a ratio, a whole number.
def rate(v: float) -> str:
    if v >= 1000:  # three significant figures: the runs' spread is wider than that
        return f"{round(v, 2 - math.floor(math.log10(v))):,.0f}"
    return f"{v:,.0f}"


def ms(v: float) -> str:
    return f"{v:.2f}" if abs(v) < 10 else f"{v:.1f}" if abs(v) < 100 else f"{v:,.0f}"


def num(v: Any) -> str:
    return f"{v:,}" if isinstance(v, int) else f"{v:g}" if isinstance(v, float) else str(v)


def ratio(v: float) -> str:
    return f"{v:.2f}"


def whole(v: float) -> str:
    return f"{v:.0f}"


def fig(f: Any, fmt: Callable[[float], str], unit: str = "") -> str:
    """``median (min-max)`` of a figure; a bare number (an older results file) as is."""
    if isinstance(f, (int, float)):
        return f"{fmt(f)}{unit}"
    if not isinstance(f, dict) or f.get("median") is None:
        return "not measured"
    low, high = fmt(f["min"]), fmt(f["max"])
    if low == high:  # one run, or runs alike at the precision shown
        return f"{fmt(f['median'])}{unit}"
    return f"{fmt(f['median'])}{unit} ({low}{DASH}{high})"


def median(f: Any) -> float | None:
    if isinstance(f, (int, float)):
        return float(f)
    return f.get("median") if isinstance(f, dict) else None


def pcts(f: Any, keys: tuple[str, ...] = ("p50", "p99", "max")) -> str:
    if not isinstance(f, dict):
        return "not measured"
    return ", ".join(f"{k} {fig(f.get(k), ms)}" for k in keys) + " ms"


def judged(text: str, met: bool | None) -> str:
    verdict = "not measured" if met is None else "**met**" if met else "**missed**"
    return f"{text} — {verdict}"


def at_least(f: Any, goal: float, every_run: bool = False) -> bool | None:
    """Whether the median (``every_run``: the worst run) reaches ``goal``; None: unknown."""
    value = (f.get("min") if every_run else f.get("median")) if isinstance(f, dict) else median(f)
    return None if value is None else value >= goal


def at_most(f: Any, goal: float) -> bool | None:
    value = median(f)
    return None if value is None else value <= goal
