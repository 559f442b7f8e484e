"""The Grafana dashboard as a picture: each panel's PromQL queried from a Prometheus over a
time range (``/api/v1/query_range``) and drawn as a grid of plots (matplotlib, imported only
when drawing). The monitoring tests read the panels' queries through :func:`panels` too.

    python -m rmq_semantics.tools.dashboard_plots --prometheus http://127.0.0.1:9090 \\
        --dashboard docker/grafana/rmq-semantics.json --last 600 --out docs/dashboard.png
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Panel", "Series", "Target", "main", "panels", "query", "query_range", "render"]

# One Prometheus HTTP call; a range query over an hour at 1 s steps answers well within it.
HTTP_TIMEOUT_S = 30.0
_LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")


@dataclass(frozen=True)
class Target:
    """One query of a panel and its legend template (Grafana's ``{{label}}``)."""

    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    """A dashboard panel: its title, unit and queries."""

    title: str
    unit: str
    targets: tuple[Target, ...]


@dataclass(frozen=True)
class Series:
    """One series of a query's answer: its labels and its (unix time, value) points."""

    labels: dict[str, str]
    points: list[tuple[float, float]]

    def name(self, legend: str) -> str:
        """The legend template with this series' labels filled in."""
        return _LEGEND.sub(lambda m: self.labels.get(m.group(1), ""), legend)


def panels(dashboard: dict) -> list[Panel]:
    """The panels of a Grafana dashboard (its JSON model), in order, with their queries."""
    out = []
    for panel in dashboard.get("panels", []):
        targets = tuple(
            Target(t["expr"], t.get("legendFormat", ""))
            for t in panel.get("targets", [])
            if t.get("expr")
        )
        if targets:
            unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
            out.append(Panel(panel.get("title", ""), unit, targets))
    return out


def _get(url: str, path: str, params: dict[str, object]) -> dict:
    full = f"{url.rstrip('/')}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(full, timeout=HTTP_TIMEOUT_S) as response:
        body = json.load(response)
    if body.get("status") != "success":
        raise ValueError(f"{full}: {body.get('errorType')}: {body.get('error')}")
    return body["data"]


def query(url: str, expr: str, at: float | None = None) -> list[Series]:
    """An instant query (``/api/v1/query``) at ``at`` (default: now)."""
    params: dict[str, object] = {"query": expr}
    if at is not None:
        params["time"] = at
    data = _get(url, "/api/v1/query", params)
    if data["resultType"] == "scalar":
        return [Series({}, [(data["result"][0], float(data["result"][1]))])]
    return [
        Series(r["metric"], [(float(r["value"][0]), float(r["value"][1]))]) for r in data["result"]
    ]


def query_range(url: str, expr: str, start: float, end: float, step: float) -> list[Series]:
    """A range query (``/api/v1/query_range``) from ``start`` to ``end`` every ``step`` s."""
    data = _get(
        url, "/api/v1/query_range", {"query": expr, "start": start, "end": end, "step": step}
    )
    return [
        Series(r["metric"], [(float(t), float(v)) for t, v in r["values"]]) for r in data["result"]
    ]


def render(
    url: str,
    dashboard: dict,
    start: float,
    end: float,
    out: Path,
    step: float | None = None,
    title: str | None = None,
) -> Path:
    """Draw every panel of ``dashboard`` from ``url``'s data over [start, end] into ``out``
    (PNG), two panels a row, time in seconds from ``start``; series that stayed at 0 (the
    label values the coordinator creates up front) are left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    step = step or max(1.0, (end - start) / 300)
    shown = panels(dashboard)
    rows = math.ceil(len(shown) / 2)
    fig, axes = plt.subplots(rows, 2, figsize=(13, 3.1 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, shown, strict=False):
        for target in panel.targets:
            for series in query_range(url, target.expr, start, end, step):
                points = [(t - start, v) for t, v in series.points if math.isfinite(v)]
                if any(v for _, v in points):  # label values that stayed at 0 are left out
                    ax.plot(
                        *zip(*points, strict=True), label=series.name(target.legend), linewidth=1.2
                    )
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlim(0, end - start)
        ax.set_ylim(bottom=0)
        ax.set_ylabel(panel.unit if panel.unit not in ("short", "") else "", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper left")
    for ax in list(axes.flat)[len(shown) :]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("seconds into the run", fontsize=8)
    fig.suptitle(title or dashboard.get("title", ""), fontsize=12)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    """The command line: draw the PNG, print its path; 1 and one line when it cannot."""
    parser = argparse.ArgumentParser(
        prog="python -m rmq_semantics.tools.dashboard_plots",
        description="Draw the Grafana dashboard's panels from a Prometheus' data as a PNG.",
    )
    parser.add_argument(
        "--prometheus", default="http://127.0.0.1:9090", help="the Prometheus base URL"
    )
    parser.add_argument("--dashboard", type=Path, default=Path("docker/grafana/rmq-semantics.json"))
    parser.add_argument("--start", type=float, help="unix seconds (default: end - --last)")
    parser.add_argument("--end", type=float, help="unix seconds (default: now)")
    parser.add_argument("--last", type=float, default=600.0, help="seconds, without --start")
    parser.add_argument("--step", type=float, help="seconds between points")
    parser.add_argument("--title", help="the figure's title (default: the dashboard's)")
    parser.add_argument("--out", type=Path, default=Path("docs/dashboard.png"))
    args = parser.parse_args(argv)
    end = args.end or time.time()
    start = args.start or end - args.last
    try:
        dashboard = json.loads(args.dashboard.read_text())
        render(args.prometheus, dashboard, start, end, args.out, args.step, args.title)
    except (OSError, ValueError) as exc:
        print(f"dashboard_plots: {exc}", file=sys.stderr)
        return 1
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
