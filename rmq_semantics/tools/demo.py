"""``rmq-semantics demo``: the whole product end to end on the embedded broker.

An order service writes each order to SQLite inside its local transaction and publishes an
``OrderCreated`` event as a transactional message. Some orders commit, some roll back, and
some end UNKNOWN as if the service crashed before sending its decision, so the
coordinator's back-check must resolve them from the database; the transaction barrier
(rmq_semantics/barrier) makes that answer exact, also for two slow orders whose local
transaction is still open when their check comes. An orderly consumer processes
each customer's events in order, the Spark job copies the promoted topic to Parquet, and
the summary compares Spark's rows with the database's committed orders.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import fastavro
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from rmq_semantics.barrier import BarrierTransactionListener, TransactionBarrier
from rmq_semantics.embedded import EmbeddedKafka, free_port
from rmq_semantics.message import Message
from rmq_semantics.tools.admin import list_discarded, list_pending
from rmq_semantics.tools.coordinator_process import CoordinatorProcess
from rmq_semantics.topics import ensure_topics
from rmq_semantics.transaction import LocalTransactionState, TransactionProducer

__all__ = ["register_cli", "run_demo"]

ORDERS = 60
CUSTOMERS = 6
# Short horizons so the back-check resolves the "crashed" orders within seconds.
COORDINATOR_SETTINGS = {
    "transaction_timeout_ms": 2000,
    "check_interval_ms": 2000,
    "check_max": 5,
    "half_partitions": 4,
    "check_partitions": 2,
}
RESOLVE_TIMEOUT_S = 90.0
# A slow order holds its local transaction open until its back-check waits on it, or this long.
SLOW_ORDER_WAIT_S = 15.0


def order_schema() -> dict:
    return json.loads((resources.files("rmq_semantics.tools") / "demo_order.avsc").read_text())


def _scenario(n: int) -> str:
    # 60 % commit, 20 % roll back, 10 % crash after the local commit, 10 % crash before it;
    # two orders are slow: their local transaction is still open when the back-check comes.
    if n % 30 == 15:
        return "slow-commit"
    return {
        0: "commit",
        1: "commit",
        2: "commit",
        3: "rollback",
        4: "crash-committed",
        5: "commit",
        6: "commit",
        7: "commit",
        8: "rollback",
        9: "crash-uncommitted",
    }[n % 10]


class OrderService(BarrierTransactionListener):
    """The local transaction is an INSERT into SQLite under the transaction barrier, so the
    back-check answers from the barrier row: it waits for a local transaction still open
    and rolls back one that has not begun."""

    def __init__(self, db_path: Path) -> None:
        self.db_path = db_path
        self.checked: set[str] = set()
        self._lock = threading.Lock()
        self._waited: dict[str, threading.Event] = {}
        super().__init__(
            TransactionBarrier(on_wait=self._check_waits),
            connect=self._db,
            business=self._insert_order,
        )
        db = self._db()
        try:
            self.barrier.create_table(db)
            db.execute(
                "CREATE TABLE IF NOT EXISTS orders (order_id TEXT PRIMARY KEY, "
                "customer TEXT, seq INT, amount_cents INT, txn_id TEXT UNIQUE)"
            )
            db.commit()
        finally:
            db.close()

    def _db(self) -> sqlite3.Connection:
        return sqlite3.connect(self.db_path, timeout=10)

    def _waiting(self, txn_id: str) -> threading.Event:
        with self._lock:
            return self._waited.setdefault(txn_id, threading.Event())

    def _check_waits(self, txn_id: str) -> None:
        self._waiting(txn_id).set()

    def execute_local_transaction(self, msg: Message, arg: dict) -> LocalTransactionState:
        if arg["scenario"] == "crash-uncommitted":
            return LocalTransactionState.UNKNOW  # "crashed" before its local transaction
        return super().execute_local_transaction(msg, arg)

    def _insert_order(
        self, cursor: sqlite3.Cursor, msg: Message, arg: dict
    ) -> LocalTransactionState:
        cursor.execute(
            "INSERT INTO orders VALUES (?, ?, ?, ?, ?)",
            (arg["order_id"], arg["customer"], arg["seq"], arg["amount_cents"], msg.transaction_id),
        )
        scenario = arg["scenario"]
        if scenario == "slow-commit":
            # Held open until its back-check waits on it (the check then answers COMMIT).
            self._waiting(msg.transaction_id or "").wait(SLOW_ORDER_WAIT_S)
        if scenario == "rollback":
            return LocalTransactionState.ROLLBACK_MESSAGE
        if scenario == "crash-committed":
            return LocalTransactionState.UNKNOW  # no decision reaches the coordinator
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg: Message) -> LocalTransactionState:
        with self._lock:
            self.checked.add(msg.transaction_id or "")
        return super().check_local_transaction(msg)

    def committed_orders(self) -> set[str]:
        db = self._db()
        try:
            return {r[0] for r in db.execute("SELECT order_id FROM orders")}
        finally:
            db.close()


@dataclass
class Summary:
    committed: int = 0
    rolled_back: int = 0
    resolved_by_check: int = 0
    checks_waited: int = 0
    discarded: int = 0
    orderly_processed: int = 0
    orderly_in_order: bool = True
    spark_rows: int = 0
    spark_ok: bool = False
    notes: list[str] = field(default_factory=list)


def _encode(schema: dict, record: dict) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def _orderly_check(conf: dict, topic: str, expected: int, summary: Summary) -> None:
    """Process the promoted events per customer with an OrderlyConsumer, checking order."""
    try:
        from rmq_semantics.orderly import ConsumeOrderlyStatus, OrderlyConsumer
    except ImportError:
        summary.notes.append("orderly consumer not available in this build")
        return
    schema = fastavro.parse_schema(order_schema())
    # Promotion order is commit order (a back-checked order lands after later ones), so
    # "in order" means each customer's events are processed in their queue's offset order.
    last_offset: dict[str, int] = {}
    seen: set[str] = set()
    lock = threading.Lock()

    def listener(msgs, context):
        with lock:
            for m in msgs:
                order = fastavro.schemaless_reader(io.BytesIO(m.value), schema)
                if m.offset <= last_offset.get(order["customer"], -1):
                    summary.orderly_in_order = False
                last_offset[order["customer"]] = m.offset
                seen.add(order["order_id"])
        return ConsumeOrderlyStatus.SUCCESS

    consumer = OrderlyConsumer(
        {
            **conf,
            "group.id": f"demo-billing-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
        },
        listener=listener,
    )
    consumer.subscribe([topic])
    consumer.start()
    try:
        deadline = time.monotonic() + RESOLVE_TIMEOUT_S
        while len(seen) < expected and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        consumer.shutdown()
    summary.orderly_processed = len(seen)


def _spark(bootstrap: str, topic: str, work: Path, summary: Summary, committed: set[str]) -> None:
    try:
        from spark.job import JobSettings, build_session, run_job
    except ImportError:
        summary.notes.append("Spark job not available in this build")
        return
    schema_file = work / "order.avsc"
    schema_file.write_text(json.dumps(order_schema()))
    output = work / "orders.parquet"
    spark = build_session("local[2]")
    try:
        run_job(
            JobSettings(
                bootstrap_servers=bootstrap,
                topics=topic,
                output=str(output),
                checkpoint=str(work / "orders.checkpoint"),
                avro_schema=str(schema_file),
                available_now=True,
            ),
            spark=spark,
        )
        ids = [r["order_id"] for r in spark.read.parquet(str(output)).select("order_id").collect()]
    finally:
        spark.stop()
    summary.spark_rows = len(ids)
    summary.spark_ok = len(ids) == len(set(ids)) and set(ids) == committed


def run_demo(console: Console, work: Path, orders: int = ORDERS) -> bool:
    broker = EmbeddedKafka(work / "kafka", port=free_port())
    coordinator: CoordinatorProcess | None = None
    summary = Summary()
    try:
        console.print("[bold]1/5[/bold] starting Apache Kafka (embedded, KRaft) ...")
        bootstrap = broker.start()
        conf = {"bootstrap.servers": bootstrap}
        topic = "orders"
        ensure_topics(conf, {topic: (3, {})})
        console.print(f"      broker at {bootstrap}")
        console.print("[bold]2/5[/bold] starting the coordinator sidecar ...")
        coordinator = CoordinatorProcess(
            bootstrap, work / "coordinator.log", settings=COORDINATOR_SETTINGS
        ).start()
        coordinator.wait_ready()

        console.print(
            f"[bold]3/5[/bold] order service: {orders} orders in local SQLite transactions ..."
        )
        service = OrderService(work / "orders.db")
        schema = order_schema()
        scenarios: dict[str, str] = {}
        with (
            TransactionProducer(
                conf,
                producer_group="order-service",
                listener=service,
                half_partitions=4,
                check_partitions=2,
            ) as producer,
            Progress(console=console, transient=True) as progress,
        ):
            sending = progress.add_task("sending orders", total=orders)
            for n in range(orders):
                customer = f"customer-{n % CUSTOMERS}"
                order = {
                    "order_id": f"order-{n:04d}",
                    "customer": customer,
                    "seq": n // CUSTOMERS,
                    "amount_cents": 1000 + n,
                }
                scenario = _scenario(n)
                scenarios[order["order_id"]] = scenario
                producer.send_message_in_transaction(
                    Message(topic, _encode(schema, order), key=customer, tags="OrderCreated"),
                    {**order, "scenario": scenario},
                )
                progress.advance(sending)
            resolving = progress.add_task("back-check resolving crashed orders", total=None)
            deadline = time.monotonic() + RESOLVE_TIMEOUT_S
            while list_pending(conf):
                coordinator.require_running()
                if time.monotonic() > deadline:
                    summary.notes.append("some transactions were still pending")
                    break
                progress.update(resolving, description=f"pending: {len(list_pending(conf))}")
                time.sleep(0.5)
        committed = service.committed_orders()
        summary.committed = len(committed)
        summary.rolled_back = sum(
            1 for s in scenarios.values() if s in ("rollback", "crash-uncommitted")
        )
        summary.resolved_by_check = len(service.checked)
        summary.checks_waited = service.barrier.waited_checks
        summary.discarded = len(list_discarded(conf))

        console.print("[bold]4/5[/bold] orderly consumer: per-customer order events ...")
        _orderly_check(conf, topic, len(committed), summary)
        console.print("[bold]5/5[/bold] Spark job: promoted topic -> Parquet ...")
        _spark(bootstrap, topic, work, summary, committed)
    finally:
        if coordinator is not None:
            coordinator.stop()
        broker.stop()

    table = Table(title="rmq-semantics demo")
    table.add_column("what")
    table.add_column("count", justify="right")
    table.add_row("orders committed (SQLite)", str(summary.committed))
    table.add_row("orders rolled back", str(summary.rolled_back))
    table.add_row("resolved by back-check", str(summary.resolved_by_check))
    table.add_row("back-checks that found a local transaction running", str(summary.checks_waited))
    table.add_row("discarded", str(summary.discarded))
    order_note = "" if summary.orderly_in_order else " (OUT OF ORDER)"
    table.add_row(
        "events processed in order (orderly consumer)", f"{summary.orderly_processed}{order_note}"
    )
    table.add_row("rows Spark wrote to Parquet", str(summary.spark_rows))
    console.print(table)
    for note in summary.notes:
        console.print(f"note: {note}")
    ok = summary.spark_ok and summary.orderly_in_order and summary.discarded == 0
    console.print(
        "[bold green]PASS[/bold green]: Spark's rows equal the database's committed orders"
        if ok
        else "[bold red]FAIL[/bold red]: see the table above"
    )
    return ok


def _cmd_demo(args: argparse.Namespace) -> int:
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="rmq-demo-"))
    if work.exists() and args.work_dir:
        shutil.rmtree(work)  # a demo run starts clean, so a second run works the same
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # the driver binds to loopback only
    try:
        return 0 if run_demo(Console(), work, args.orders) else 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def register_cli(sub: argparse._SubParsersAction) -> None:
    demo = sub.add_parser("demo", help="run the whole pipeline on the embedded broker")
    demo.add_argument(
        "--work-dir",
        default=None,
        help="broker data, SQLite and Parquet (default: a temp dir, removed afterwards)",
    )
    demo.add_argument("--orders", type=int, default=ORDERS)
    demo.add_argument("--keep", action="store_true", help="keep the work dir")
    demo.set_defaults(func=_cmd_demo)
