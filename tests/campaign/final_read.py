"""The campaign's final reads, by tools other than the library under test.

- Every promoted topic read ``read_committed`` by Apache Kafka's own Java client: kafka-tools'
  ``ConsoleConsumer`` (``org.apache.kafka.tools.consumer.ConsoleConsumer``), resolved from
  Maven Central once into the jar cache by ``docker/kafka/tools-pom.xml``
  (txn_tools.kafka_tools_classpath, as TransactionsCommand), printing partition, offset,
  headers and value of each record.
- ``rmq-semantics txn pending`` and ``txn discarded``, the operator's view of what the
  coordinators left undecided or set aside.

Each output is kept verbatim in the out dir next to what was parsed from it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import AdminClient

from rmq_semantics.embedded import java_executable
from tests.campaign.txn_tools import kafka_tools_classpath
from tests.campaign.workload import parse_body

REPO = Path(__file__).resolve().parents[2]
TOOLS_LOG4J = REPO / "docker" / "kafka" / "tools-log4j2.properties"
CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"
# The console consumer exits once no record came for this long (it first joins a group).
IDLE_TIMEOUT_MS = 10_000
RETRY_IDLE_TIMEOUT_MS = 30_000
# One topic's read, JVM start and group join included.
READ_DEADLINE_S = 180.0
# JVMs at once: two cores shared with the cluster.
PARALLEL_READS = 3
CLI_TIMEOUT_S = 120.0
FIELD_SEPARATOR = "\t"
HEADER_SEPARATOR = "\x1f"  # never inside a header of ours (ASCII unit separator)


@dataclass(frozen=True)
class TopicRead:
    topic: str
    records: list[dict]
    processed: int | None  # the tool's own count ("Processed a total of N messages")
    exit_code: int | None
    error: str = ""


def parse_console_line(topic: str, line: str) -> dict | None:
    """One record as DefaultMessageFormatter prints it with our separators:
    ``Partition:P<TAB>Offset:O<TAB>h1:v1<US>h2:v2<TAB>value`` (``NO_HEADERS`` when none)."""
    parts = line.split(FIELD_SEPARATOR, 3)
    if (
        len(parts) != 4
        or not parts[0].startswith("Partition:")
        or not parts[1].startswith("Offset:")
    ):
        return None
    try:
        partition, offset = int(parts[0][10:]), int(parts[1][7:])
    except ValueError:
        return None
    headers = {}
    if parts[2] != "NO_HEADERS":
        for item in parts[2].split(HEADER_SEPARATOR):
            name, _, value = item.partition(":")
            headers[name] = value
    body = parse_body(parts[3])
    return {
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "headers": headers,
        "mid": body.get("mid"),
        "key": body.get("key"),
        "txn_id": headers.get("rmq.txn_id"),
    }


def read_topic(
    bootstrap: str, topic: str, out_dir: Path, classpath: str, idle_ms: int = IDLE_TIMEOUT_MS
) -> TopicRead:
    cmd = [
        java_executable(),
        "-Xmx256m",
        f"-Dlog4j2.configurationFile={TOOLS_LOG4J}",
        "-cp",
        classpath,
        CONSOLE_CONSUMER,
        "--bootstrap-server",
        bootstrap,
        "--topic",
        topic,
        "--from-beginning",
        "--isolation-level",
        "read_committed",
        "--timeout-ms",
        str(idle_ms),
        "--formatter-property",
        "print.headers=true",
        "--formatter-property",
        "print.offset=true",
        "--formatter-property",
        "print.partition=true",
        "--formatter-property",
        "print.key=false",
        "--formatter-property",
        f"headers.separator={HEADER_SEPARATOR}",
        "--command-property",
        "auto.offset.reset=earliest",
    ]
    raw = out_dir / f"{topic}.txt"
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=READ_DEADLINE_S)
    except subprocess.TimeoutExpired as exc:
        raw.write_text(str(exc.stdout or ""))
        return TopicRead(topic, [], None, None, f"no exit within {READ_DEADLINE_S:.0f} s")
    raw.write_text(proc.stdout)
    (out_dir / f"{topic}.stderr").write_text(proc.stderr)
    records, bad = [], 0
    for line in proc.stdout.splitlines():
        record = parse_console_line(topic, line)
        if record is None:
            bad += 1
        else:
            records.append(record)
    total = re.search(r"Processed a total of (\d+) messages", proc.stderr)
    error = f"{bad} lines not understood" if bad else ""
    return TopicRead(topic, records, int(total.group(1)) if total else None, proc.returncode, error)


def listed_topics(bootstrap: str, pattern: str) -> set[str]:
    """The cluster's topics matching ``pattern``: a topic a producer created while its
    create call failed (a broker killed meanwhile) is in no history event, yet written."""
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30)
    return {t for t in metadata.topics if re.match(pattern, t)}


def read_topics(
    bootstrap: str, topics: list[str], out_dir: Path, expected: dict[str, int]
) -> list[TopicRead]:
    """Every topic read by the Java client, a few JVMs at a time; the parsed records go to
    ``records.jsonl`` beside each tool's raw output.

    The tool stops after ``IDLE_TIMEOUT_MS`` without a record, group join included: a topic
    whose count is below ``expected`` (the committed rows naming it) is read once more
    with a longer wait, so a slow join is not taken for lost records; what the second read
    shows counts."""
    out_dir.mkdir(parents=True, exist_ok=True)
    classpath = kafka_tools_classpath()
    with ThreadPoolExecutor(PARALLEL_READS) as pool:
        reads = list(pool.map(lambda t: read_topic(bootstrap, t, out_dir, classpath), topics))
        # Only a short read is read again: a slow join misses records, it adds none.
        again = [i for i, r in enumerate(reads) if len(r.records) < expected.get(r.topic, 0)]
        for i, read in zip(
            again,
            pool.map(
                lambda i: read_topic(
                    bootstrap, topics[i], out_dir, classpath, RETRY_IDLE_TIMEOUT_MS
                ),
                again,
            ),
            strict=True,
        ):
            reads[i] = read
    with open(out_dir / "records.jsonl", "w") as out:
        for read in reads:
            for record in read.records:
                out.write(json.dumps(record) + "\n")
    return reads


def table_rows(table: str) -> list[list[str]]:
    """The data rows of a table ``rich`` printed: its header's separators are heavy (┃),
    its rows' light (│)."""
    return [
        [c.strip() for c in line.strip().strip("│").split("│")]
        for line in table.splitlines()
        if "│" in line
    ]


def txn_listing(bootstrap: str, prefix: str, action: str, out_dir: Path) -> tuple[str | None, str]:
    """``rmq-semantics txn pending|discarded``: (its table as printed, or None; an error
    line or "")."""
    cmd = [
        sys.executable,
        "-m",
        "rmq_semantics",
        "txn",
        action,
        "--bootstrap-servers",
        bootstrap,
        "--topic-prefix",
        prefix,
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CLI_TIMEOUT_S, cwd=REPO)
    except subprocess.TimeoutExpired:
        return None, f"txn {action}: no answer within {CLI_TIMEOUT_S:.0f} s"
    (out_dir / f"txn-{action}.txt").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        return None, f"txn {action} exited {proc.returncode}: {proc.stderr.strip()[-300:]}"
    return proc.stdout, ""
