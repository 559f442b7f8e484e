"""``rmq-semantics demo``: the product end to end on the embedded broker."""

from __future__ import annotations

import argparse
import tempfile
import uuid
from pathlib import Path

from rich.console import Console

from rmq_semantics.consumer import Consumer
from rmq_semantics.embedded import EmbeddedKafka, free_port
from rmq_semantics.message import Message
from rmq_semantics.producer import Producer
from rmq_semantics.topics import ensure_topics

__all__ = ["register_cli", "run_demo"]

# Bounds how long the demo waits for its own records to come back.
READ_BACK_TIMEOUT_S = 30.0


def run_demo(data_dir: Path, console: Console) -> bool:
    broker = EmbeddedKafka(data_dir, port=free_port())
    console.print(f"[bold]Starting Apache Kafka[/bold] in {broker.data_dir} ...")
    bootstrap = broker.start()
    try:
        console.print(f"broker at {bootstrap}")
        conf = {"bootstrap.servers": bootstrap}
        topic = f"demo-orders-{uuid.uuid4().hex[:6]}"
        ensure_topics(conf, {topic: (3, {})})
        with Producer(conf) as producer:
            sent = producer.send(Message(topic, b'{"order": 1}', key="customer-1"))
        console.print(f"sent to {sent.topic}[{sent.partition}]@{sent.offset}")
        with Consumer({**conf, "group.id": f"demo-{uuid.uuid4().hex[:6]}",
                       "auto.offset.reset": "earliest"}) as consumer:
            consumer.subscribe([topic])
            msg = consumer.poll(READ_BACK_TIMEOUT_S)
        del producer, consumer  # librdkafka handles must not outlive the broker
        ok = msg is not None and msg.error() is None and msg.value() == b'{"order": 1}'
        console.print("[green]PASS[/green]" if ok else "[red]FAIL[/red]")
        return ok
    finally:
        broker.stop()


def _cmd_demo(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir or tempfile.mkdtemp(prefix="rmq-demo-"))
    return 0 if run_demo(data_dir, Console()) else 1


def register_cli(sub: argparse._SubParsersAction) -> None:
    demo = sub.add_parser("demo", help="run the whole pipeline on the embedded broker")
    demo.add_argument("--data-dir", default=None, help="broker data dir (default: a temp dir)")
    demo.set_defaults(func=_cmd_demo)
