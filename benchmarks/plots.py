"""The PNG plots beside a benchmark's JSON (matplotlib, imported only when plotting): every
throughput with its min-max over the runs, and the latency distributions (the pooled
samples of the runs, kept in the samples file beside the JSON)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.common import percentile

__all__ = ["plot"]


def _throughputs(results: dict) -> list[tuple[str, dict, str]]:
    """(label, figure, colour) of every throughput measured, the layer's in red."""
    bars = [
        ("raw Kafka", results.get("baseline_msgs_per_s"), "#888"),
        ("copier (exactly-once)", results.get("copier_msgs_per_s"), "#888"),
        ("batch API", results.get("txn_msgs_per_s"), "#c44"),
    ]
    for n, c in sorted((results.get("coordinators") or {}).items()):
        bars.append(
            (f"batch API, {n} coordinator{'s' if n != '1' else ''}", c.get("msgs_per_s"), "#c44")
        )
    for n, t in sorted((results.get("threads") or {}).items(), key=lambda kv: int(kv[0])):
        bars.append(
            (
                f"{n} thread{'s' if n != '1' else ''}, one txn per call",
                t.get("confirmed_per_s"),
                "#c44",
            )
        )
    bars += [
        ("plain consumer", results.get("plain_consumer_msgs_per_s"), "#888"),
        ("OrderlyConsumer", results.get("orderly_msgs_per_s"), "#48c"),
    ]
    return [
        (label, f, colour) for label, f, colour in bars if isinstance(f, dict) and f.get("median")
    ]


def _throughput_plot(plt, results: dict, path: Path) -> None:
    bars = _throughputs(results)
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(bars) + 1.5))
    medians = [f["median"] for _, f, _ in bars]
    spread = [
        [f["median"] - f["min"] for _, f, _ in bars],
        [f["max"] - f["median"] for _, f, _ in bars],
    ]
    ax.barh(
        [label for label, _, _ in bars],
        medians,
        xerr=spread,
        capsize=3,
        color=[colour for _, _, colour in bars],
    )
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("messages / s (median, min-max over the runs; log scale)")
    ax.set_title(
        f"Throughput, {results['settings']['size']} B values, {results['machine']['cores']} cores"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _latency_plot(plt, samples: dict, path: Path) -> None:
    at_rate = {
        name: samples[key]
        for name, key in (
            ("commit → visible", "commit_to_visible_ms"),
            ("copier input → visible", "copier_latency_ms"),
        )
        if samples.get(key)
    }
    saturation = samples.get("commit_to_visible_saturation_ms") or []
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    top = max((percentile(v, 99.5) for v in at_rate.values()), default=1.0)
    for (name, values), colour in zip(at_rate.items(), ("#c44", "#888"), strict=False):
        axes[0].hist(
            [min(v, top) for v in values],
            bins=60,
            range=(0, top),
            color=colour,
            alpha=0.6,
            density=True,
            label=f"{name}: p50 {percentile(values, 50):.1f}, p99 {percentile(values, 99):.1f} ms",
        )
    axes[0].set_title("at the offered rate, the runs pooled (tail clipped at p99.5)")
    axes[1].hist(saturation or [0], bins=60, color="#c44", density=True)
    axes[1].set_title("batch API at saturation (queueing)")
    for ax in axes:
        ax.set_xlabel("latency (ms)")
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    axes[0].set_ylabel("share of messages (density)")
    fig.suptitle("Local COMMIT → visible on the real topic, against the bare copier")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot(results: dict, samples: dict[str, list[float]], out_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    if _throughputs(results):  # a run of latency cases only has no rates to draw
        _throughput_plot(plt, results, out_dir / "throughput.png")
        files.append("throughput.png")
    if samples.get("commit_to_visible_ms") or samples.get("copier_latency_ms"):
        _latency_plot(plt, samples, out_dir / "latency.png")
        files.append("latency.png")
    if samples.get("check_lateness_ms"):
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.hist(samples["check_lateness_ms"], bins=40, color="#4a4")
        ax.set_xlabel("check request after its deadline (ms)")
        ax.set_ylabel("messages")
        ax.set_title("Back-check lateness")
        fig.tight_layout()
        fig.savefig(out_dir / "check_lateness.png", dpi=110)
        files.append("check_lateness.png")
    plt.close("all")
    return files
