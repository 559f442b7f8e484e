"""``python -m tests.fuzz``: the fuzzer through a real coordinator (``make fuzz``).

The broker is ``--bootstrap``, else ``RMQ_BOOTSTRAP_SERVERS``, else an embedded Apache Kafka
started for the run. Exit code 1 when an invariant broke; the report lists the counts per
reason either way.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

from rmq_semantics.embedded import EmbeddedKafka, free_port
from tests.fuzz.categories import CATEGORIES, select
from tests.fuzz.coordinator_run import run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__)
    parser.add_argument("--records", type=int, default=10_000, help="bad records to write")
    parser.add_argument("--seed", type=int, help="reproduce a run (default: random)")
    parser.add_argument("--only", default="", help="comma-separated categories (default all)")
    parser.add_argument("--skip", default="", help="comma-separated categories to leave out")
    parser.add_argument(
        "--safe",
        action="store_true",
        help="leave out the categories today's code is known to fail on",
    )
    parser.add_argument("--list", action="store_true", help="list the categories and exit")
    parser.add_argument("--bootstrap", default=os.environ.get("RMQ_BOOTSTRAP_SERVERS"))
    parser.add_argument("--log-dir", type=Path, help="where the coordinator's log goes")
    args = parser.parse_args(argv)
    if args.list:
        for c in CATEGORIES:
            known = f"  known bad: {c.known_bad}" if c.known_bad else ""
            print(f"{c.name:32} {c.topic:13} {'counted' if c.counted else '       '}{known}")
        return 0
    names = [n for n in args.only.split(",") if n], [n for n in args.skip.split(",") if n]
    try:
        categories = select(*names, safe=args.safe)
    except ValueError as exc:
        parser.error(str(exc))
    # The producers' own warnings about the bad records are expected: errors only.
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    if args.bootstrap:
        report = run(
            args.bootstrap,
            records=args.records,
            categories=categories,
            seed=args.seed,
            log_dir=args.log_dir,
        )
    else:
        data_dir = Path(tempfile.mkdtemp(prefix="rmq-fuzz-kafka-"))
        kafka = EmbeddedKafka(data_dir, port=free_port())
        try:
            kafka.start()
            report = run(
                kafka.bootstrap,
                records=args.records,
                categories=categories,
                seed=args.seed,
                conf=kafka.client_conf(),
                log_dir=args.log_dir,
            )
        finally:
            kafka.stop()
            shutil.rmtree(data_dir, ignore_errors=True)
    print(report.text())
    return 1 if report.violations() else 0


if __name__ == "__main__":
    sys.exit(main())
