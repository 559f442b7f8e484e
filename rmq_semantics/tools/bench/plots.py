"""The PNG plots beside a benchmark's JSON (matplotlib, imported only when plotting)."""

from __future__ import annotations

from pathlib import Path

from rmq_semantics.tools.bench.common import percentile

__all__ = ["plot"]


def plot(results: dict, latencies: dict[str, list[float]], lateness: list[float],
         out_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    fig, axes = plt.subplots(1, len(latencies), figsize=(11, 4), squeeze=False)
    for ax, (name, values) in zip(axes[0], latencies.items(), strict=True):
        ax.hist(values or [0], bins=60, color="#c44")
        for q, style in ((50, "--"), (99, ":")):
            ax.axvline(percentile(values, q), color="black", linestyle=style,
                       label=f"p{q} {percentile(values, q):.0f} ms")
        ax.set_xlabel("commit-to-visible latency (ms)")
        ax.set_ylabel("messages")
        ax.set_title(name)
        ax.legend()
    fig.suptitle("Transactional messages: local COMMIT -> visible on the real topic")
    fig.tight_layout()
    fig.savefig(out_dir / "latency.png", dpi=110)
    files.append("latency.png")

    fig, ax = plt.subplots(figsize=(7, 4))
    bars = {k: results[k] for k in ("baseline_msgs_per_s", "txn_msgs_per_s",
                                    "plain_consumer_msgs_per_s", "orderly_msgs_per_s")
            if isinstance(results.get(k), (int, float))}
    ax.bar([k.removesuffix("_msgs_per_s") for k in bars], list(bars.values()),
           color=["#888", "#c44", "#888", "#48c"][:len(bars)])
    ax.set_ylabel("messages / s")
    ax.set_title(f"Throughput, {results['settings']['size']} B values, "
                 f"{results['machine']['cores']} cores")
    fig.tight_layout()
    fig.savefig(out_dir / "throughput.png", dpi=110)
    files.append("throughput.png")

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.hist(lateness, bins=40, color="#4a4")
    ax.set_xlabel("check request after its deadline (ms)")
    ax.set_ylabel("messages")
    ax.set_title("Back-check lateness")
    fig.tight_layout()
    fig.savefig(out_dir / "check_lateness.png", dpi=110)
    files.append("check_lateness.png")
    plt.close("all")
    return files
