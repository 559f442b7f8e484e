"""``python -m benchmarks``, what ``make bench`` runs: the same flags as ``rmq-semantics
bench``, without going through the product's CLI (which sits above the bench and dispatches
to it, so the bench never imports the CLI)."""

import argparse
import logging
import sys

from benchmarks.runner import register_cli
from rmq_semantics.errors import RmqError


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    sub = parser.add_subparsers(dest="command", required=True)
    register_cli(sub)
    sub.choices["bench"].prog = "python -m benchmarks"
    args = parser.parse_args(["bench", *argv])
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.func(args) or 0)
    except RmqError as exc:  # a user error: one line, as the CLI gives it
        print(f"python -m benchmarks: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
