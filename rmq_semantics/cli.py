"""``rmq-semantics``: the one command line of the product.

User errors (our ``RmqError`` family) are one line on stderr and a non-zero exit, never a
traceback. Subcommands import their modules lazily so ``kafka start`` does not load Spark.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from rmq_semantics import __version__
from rmq_semantics.errors import RmqError
from rmq_semantics.helptext import docstring_summary

__all__ = ["main"]

DEFAULT_DATA_DIR = Path.home() / ".local" / "share" / "rmq-semantics" / "kafka"


def _configure_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _cmd_setup(args: argparse.Namespace) -> int:
    from rmq_semantics.kafka_jars import java_executable, kafka_classpath

    java_executable()
    print(f"kafka jars: {kafka_classpath()}")
    try:
        from spark.jars import spark_jars
    except ImportError:  # pyspark not installed: the Spark job is optional
        return 0
    print(f"spark kafka source and avro jars: {len(spark_jars())} jars")
    return 0


def _cmd_kafka(args: argparse.Namespace) -> int:
    from rmq_semantics.embedded import EmbeddedKafka
    from rmq_semantics.kafka_cluster import is_cluster_dir

    brokers = getattr(args, "brokers", None)
    if (brokers or 1) > 1 or args.node is not None or is_cluster_dir(Path(args.data_dir)):
        return _cmd_kafka_cluster(args)
    sasl = None
    if getattr(args, "sasl_plain", None):
        user, _, password = args.sasl_plain.partition(":")
        if not user or not password:
            raise RmqError("--sasl-plain wants USER:PASSWORD")
        sasl = {user: password}
    broker = EmbeddedKafka(
        Path(args.data_dir),
        port=getattr(args, "port", None),
        sasl_users=sasl,
        version=getattr(args, "version", None),
    )
    if args.action == "start":
        print(f"starting Apache Kafka in {broker.data_dir} ...", flush=True)
        bootstrap = broker.start()
        if sasl:
            print(
                f"clients need: security.protocol=SASL_PLAINTEXT sasl.mechanisms=PLAIN "
                f"sasl.username={next(iter(sasl))} sasl.password=..."
            )
        print(bootstrap)
    elif args.kill:
        running = broker.running_pid() is not None
        broker.kill()
        print("killed" if running else f"no broker running in {broker.data_dir}")
    else:
        print("stopped" if broker.stop() else f"no broker running in {broker.data_dir}")
    return 0


def _cmd_kafka_cluster(args: argparse.Namespace) -> int:
    from rmq_semantics.embedded import DEFAULT_PORT
    from rmq_semantics.kafka_cluster import EmbeddedCluster, is_cluster_dir

    if getattr(args, "sasl_plain", None):
        raise RmqError("--sasl-plain is for the one-node broker only")
    creating = args.action == "start" and not is_cluster_dir(Path(args.data_dir))
    cluster = EmbeddedCluster(
        Path(args.data_dir),
        brokers=getattr(args, "brokers", None),
        port=(args.port or DEFAULT_PORT) if creating else None,
        version=getattr(args, "version", None),
    )
    if args.action == "start" and args.node is not None:
        print(f"starting node {args.node} of the cluster in {cluster.data_dir} ...", flush=True)
        cluster.start_node(args.node)
    elif args.action == "start":
        print(
            f"starting a {cluster.brokers}-node Apache Kafka {cluster.version} cluster in "
            f"{cluster.data_dir} ...",
            flush=True,
        )
        cluster.start()
    else:
        stopped = cluster.stop(args.node, kill=args.kill)
        verb = "killed" if args.kill else "stopped"
        print(
            f"{verb} node(s) {', '.join(map(str, stopped))}"
            if stopped
            else f"no node running in {cluster.data_dir}"
        )
        return 0
    print(cluster.bootstrap)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rmq-semantics", description=docstring_summary(__doc__))
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    setup = sub.add_parser("setup", help="resolve the broker and Spark jars from Maven Central")
    setup.set_defaults(func=_cmd_setup)

    kafka = sub.add_parser(
        "kafka", help="the embedded Apache Kafka (KRaft): one node, or a cluster with --brokers N"
    )
    kafka_sub = kafka.add_subparsers(dest="action", required=True)
    start = kafka_sub.add_parser("start", help="start it in the background")
    start.add_argument("--data-dir", default=str(DEFAULT_DATA_DIR))
    start.add_argument("--port", type=int, default=None, help="listener port (default 9092)")
    start.add_argument(
        "--sasl-plain",
        metavar="USER:PASSWORD",
        default=None,
        help="listen with SASL_PLAINTEXT/PLAIN for this user",
    )
    start.add_argument(
        "--brokers",
        type=int,
        default=None,
        help="nodes of a new cluster (each broker and controller, ids 1..N); "
        "node I listens on port + I - 1",
    )
    start.add_argument(
        "--version",
        default=None,
        help="Apache Kafka release from Maven Central (default: the pom's)",
    )
    start.add_argument(
        "--node",
        type=int,
        default=None,
        help="start this stopped node of an existing cluster again",
    )
    stop = kafka_sub.add_parser("stop", help="stop it gracefully")
    stop.add_argument("--data-dir", default=str(DEFAULT_DATA_DIR))
    stop.add_argument("--node", type=int, default=None, help="stop only this node")
    stop.add_argument("--kill", action="store_true", help="SIGKILL instead of a clean stop")
    kafka.set_defaults(func=_cmd_kafka)

    for register in _subcommand_registrars():
        register(sub)
    return parser


def _subcommand_registrars() -> list:
    """Subcommands defined next to what they run (the sidecar, the Spark job, the tools
    under rmq_semantics.tools and the bench); none imports Spark until it runs."""
    from coordinator.acls import register_cli as tenant
    from coordinator.server import register_cli as coordinator
    from rmq_semantics.tools.admin import register_cli as txn
    from rmq_semantics.tools.demo import register_cli as demo
    from rmq_semantics.tools.dlq import register_cli as dlq
    from rmq_semantics.tools.timers import register_cli as timer
    from spark.job import register_cli as spark

    return [coordinator, tenant, txn, dlq, timer, spark, demo, _bench_registrar()]


# Where the bench is when the package was installed from a wheel, which leaves it out.
BENCH_ELSEWHERE = (
    "the bench is not installed with the package: run it from a source checkout "
    "with `make bench` (or `python -m benchmarks`)"
)


def _bench_registrar() -> Callable[[argparse._SubParsersAction], None]:
    """The bench's own subcommand when this package runs from a source checkout: the bench
    (``benchmarks/``) sits beside it there, and is looked for there when nothing on the path
    provides it (an editable install maps only the shipped packages). Elsewhere, a
    ``bench`` that says where to run it."""
    checkout = Path(__file__).resolve().parents[1]
    if (checkout / "benchmarks" / "runner.py").is_file() and str(checkout) not in sys.path:
        sys.path.append(str(checkout))
    try:
        from benchmarks.runner import register_cli
    except ImportError as exc:  # not there, or another project's "benchmarks" came first
        if not (exc.name or "").startswith("benchmarks"):
            raise
        return _register_bench_elsewhere
    return register_cli


def _register_bench_elsewhere(sub: argparse._SubParsersAction) -> None:
    # No flag of its own ("+" prefixes none of the bench's): every documented flag, --help
    # included, lands in ``ignored`` and the command prints its one line.
    bench = sub.add_parser(
        "bench", help="the benchmarks (from a source checkout)", add_help=False, prefix_chars="+"
    )
    bench.add_argument("ignored", nargs="*")
    bench.set_defaults(func=_cmd_bench_elsewhere)


def _cmd_bench_elsewhere(args: argparse.Namespace) -> int:
    print(f"rmq-semantics: error: {BENCH_ELSEWHERE}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging(args.verbose)
    try:
        return int(args.func(args) or 0)
    except RmqError as exc:
        print(f"rmq-semantics: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
