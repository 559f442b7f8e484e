"""``python -m tests.campaign --seed N --duration S [--short] [--out DIR] [--cluster-dir D]
[--calm | --stub-faults] [--min NAME=N ...] [--horizon S]``: one campaign run; exit code 0
on PASS, 1 on FAIL (the seed and the history are printed). The nemesis is
tests/campaign/nemesis.py's once it exists, else none (calm weather)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from rmq_semantics.kafka_cluster import EmbeddedCluster, is_cluster_dir
from tests.campaign.runner import HORIZON_S, Campaign, Options, default_out

# The short run (CI, make campaign-short): a pinned seed, about 5 minutes with the cluster.
SHORT_SEED = 30
SHORT_LOAD_S = 150.0
LONG_LOAD_S = 420.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.campaign", description=__doc__)
    parser.add_argument(
        "--seed", type=int, default=None, help=f"the run's seed (default 1; --short: {SHORT_SEED})"
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=None,
        help=f"seconds of load (default {LONG_LOAD_S:.0f}; --short: {SHORT_LOAD_S:.0f})",
    )
    parser.add_argument(
        "--short", action="store_true", help="fewer processes and topics, a short load (the CI run)"
    )
    parser.add_argument("--out", type=Path, default=None, help="where everything is written")
    parser.add_argument(
        "--cluster-dir",
        type=Path,
        default=None,
        help="run on this running EmbeddedCluster (not stopped at the end)",
    )
    weather = parser.add_mutually_exclusive_group()
    weather.add_argument(
        "--stub-faults", action="store_true", help="a fixed handful of faults (smoke.SmokeNemesis)"
    )
    weather.add_argument("--calm", action="store_true", help="no faults at all")
    parser.add_argument(
        "--min",
        action="append",
        default=None,
        metavar="NAME=N",
        help="a minimum of an observation (leader_change, lock_takeover, "
        "rebalance, fenced_producer, fault:<kind>); given once or more, "
        "these replace the nemesis's own",
    )
    parser.add_argument(
        "--horizon",
        type=float,
        default=HORIZON_S,
        help=f"seconds of up-time within which an UNKNOW transaction is "
        f"decided (default {HORIZON_S:.0f})",
    )
    args = parser.parse_args(argv)
    minimums = None
    if args.min is not None:
        try:
            minimums = {name: int(n) for name, n in (m.split("=", 1) for m in args.min)}
        except ValueError:
            parser.error(f"--min takes NAME=N, got {args.min}")
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    load_s = args.duration or (SHORT_LOAD_S if args.short else LONG_LOAD_S)
    seed = args.seed if args.seed is not None else SHORT_SEED if args.short else 1
    out = (args.out or default_out(seed)).resolve()
    cluster = None
    if args.cluster_dir is not None:
        if not is_cluster_dir(args.cluster_dir):
            parser.error(f"--cluster-dir {args.cluster_dir}: no cluster.json there")
        cluster = EmbeddedCluster(args.cluster_dir)
    campaign = Campaign(
        Options(seed, load_s, args.short, out, args.stub_faults, args.calm, minimums, args.horizon),
        cluster=cluster,
        owns_cluster=False,
    )
    return campaign.run()


if __name__ == "__main__":
    sys.exit(main())
