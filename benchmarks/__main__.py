"""``python -m benchmarks``: the same command as ``rmq-semantics bench`` (what ``make bench``
runs), with the CLI's logging and its one-line errors."""

import sys

from rmq_semantics.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
