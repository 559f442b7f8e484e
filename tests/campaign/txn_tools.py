"""The text of the admin tools the checkers read, parsed; and a runner of Kafka's own.

- Apache Kafka's ``TransactionsCommand`` (``kafka-transactions.sh``) prints every table with
  ``ToolsUtils.prettyPrintTable``: a header row, then one row per entry, each cell padded to
  its column's width and followed by a TAB. ``list`` has the columns ``TransactionalId
  Coordinator ProducerId TransactionState`` (state spelled ``Ongoing``, ``PrepareCommit``,
  ``CompleteAbort``...), ``find-hanging`` ``Topic Partition ProducerId ProducerEpoch
  CoordinatorEpoch StartOffset LastTimestamp Duration(min)``; an empty result is the header
  alone. Errors go to stderr with exit code 1.
- ``rmq-semantics txn pending|discarded`` (rmq_semantics/tools/admin.py) print a rich table:
  a header row between ``┃`` (``|`` on an ASCII console) and rows between ``│``; a cell too
  long for its column wraps onto continuation lines whose first cell is blank.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "FIND_HANGING_HEADERS",
    "LIST_HEADERS",
    "HangingTxn",
    "ToolOutputError",
    "TxnListing",
    "find_hanging_on_brokers",
    "kafka_tools_classpath",
    "parse_discarded",
    "parse_find_hanging",
    "parse_kafka_table",
    "parse_pending",
    "parse_rich_table",
    "parse_txn_list",
    "transactions_command",
]

LIST_HEADERS = ("TransactionalId", "Coordinator", "ProducerId", "TransactionState")
FIND_HANGING_HEADERS = (
    "Topic",
    "Partition",
    "ProducerId",
    "ProducerEpoch",
    "CoordinatorEpoch",
    "StartOffset",
    "LastTimestamp",
    "Duration(min)",
)
PENDING_HEADERS = (
    "txn id",
    "real topic",
    "producer group",
    "age (s)",
    "checks",
    "answered",
    "half",
)
DISCARDED_HEADERS = (
    "txn id",
    "real topic",
    "producer group",
    "checks",
    "reason",
    "discarded (s ago)",
    "half",
    "members",
)
# One JVM start, an admin client and a few metadata round trips; minutes only if broken.
TOOL_TIMEOUT_S = 120.0
TOOLS_MAIN = "org.apache.kafka.tools.TransactionsCommand"
REPO = Path(__file__).resolve().parents[2]
TOOLS_POM = REPO / "docker" / "kafka" / "tools-pom.xml"


class ToolOutputError(ValueError):
    """A tool's output is not the table we expect (a checker reports it as a failure)."""


@dataclass(frozen=True)
class TxnListing:
    transactional_id: str
    coordinator: int
    producer_id: int
    state: str


@dataclass(frozen=True)
class HangingTxn:
    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    start_offset: int
    last_timestamp: int
    duration_min: int

    @property
    def where(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.start_offset}"


def _cells(line: str) -> list[str]:
    cells = [c.strip() for c in line.rstrip("\r\n").split("\t")]
    while cells and cells[-1] == "":
        cells.pop()
    return cells


def parse_kafka_table(text: str, headers: Sequence[str]) -> list[dict[str, str]]:
    """The rows of a ``prettyPrintTable`` under ``headers``; lines before the header and
    lines without a TAB (log lines) are skipped; a row of the wrong width is an error."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if _cells(ln) == list(headers)), None)
    if start is None:
        head = text.strip().splitlines()[:1]
        raise ToolOutputError(
            f"no {' '.join(headers[:2])}... header in the tool's output "
            f"(first line: {head[0] if head else '(empty)'!r})"
        )
    rows = []
    for number, line in enumerate(lines[start + 1 :], start + 2):
        if "\t" not in line:
            continue
        cells = _cells(line)
        if len(cells) != len(headers):
            raise ToolOutputError(
                f"line {number} has {len(cells)} cells, want {len(headers)}: {line!r}"
            )
        rows.append(dict(zip(headers, cells, strict=True)))
    return rows


def _int(row: dict[str, str], name: str) -> int:
    try:
        return int(row[name])
    except ValueError:
        raise ToolOutputError(f"{name} is not a number: {row[name]!r} in {row}") from None


def parse_txn_list(text: str) -> list[TxnListing]:
    """``kafka-transactions.sh list``."""
    return [
        TxnListing(
            r["TransactionalId"],
            _int(r, "Coordinator"),
            _int(r, "ProducerId"),
            r["TransactionState"],
        )
        for r in parse_kafka_table(text, LIST_HEADERS)
    ]


def parse_find_hanging(text: str) -> list[HangingTxn]:
    """``kafka-transactions.sh find-hanging``: empty when nothing hangs."""
    return [
        HangingTxn(r["Topic"], *(_int(r, h) for h in FIND_HANGING_HEADERS[1:]))
        for r in parse_kafka_table(text, FIND_HANGING_HEADERS)
    ]


_VERTICAL = "┃│|"
_RULE_CHARS = set("━─┏┓┗┛┡┩┢┪└┘┌┐├┤┣┫┳┻╇╈┼┬┴╋+-=| ")


def _is_rule(line: str) -> bool:
    return set(line) <= _RULE_CHARS and any(c in line for c in "━─-=")


def _groups(text: str) -> list[list[list[str]]]:
    """The runs of ``│ a │ b │`` lines between rule lines, each line split into cells."""
    groups: list[list[list[str]]] = [[]]
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if _is_rule(line):
            groups.append([])
        elif line[0] in _VERTICAL and line[-1] in _VERTICAL and len(line) > 1:
            groups[-1].append([c.strip() for c in re.split(f"[{_VERTICAL}]", line[1:-1])])
        # else: a title or a log line
    return groups  # empty runs kept: a table without rows has one between its two rules


def parse_rich_table(text: str, headers: Sequence[str]) -> list[dict[str, str]]:
    """The rows of a rich table printed with ``headers`` by a wide console (a piped
    ``rmq-semantics`` prints 250 columns): a continuation line (blank first cell) of a
    wrapped row is joined to the row above."""
    groups = _groups(text)
    for i, group in enumerate(groups):
        if not group or len(group[0]) != len(headers):
            continue
        joined = [" ".join(filter(None, column)) for column in zip(*group, strict=True)]
        if joined == list(headers):
            body = groups[i + 1] if i + 1 < len(groups) else []
            break
    else:
        raise ToolOutputError(f"no '{headers[0]}' table in the output: {text.strip()[:120]!r}")
    rows: list[list[str]] = []
    for cells in body:
        if len(cells) != len(headers):
            raise ToolOutputError(
                f"a row has {len(cells)} cells, want {len(headers)}: {' | '.join(cells)!r}"
            )
        if cells[0] == "" and rows:
            rows[-1] = [a + b for a, b in zip(rows[-1], cells, strict=True)]
        else:
            rows.append(cells)
    return [dict(zip(headers, r, strict=True)) for r in rows]


def parse_pending(text: str) -> list[dict[str, str]]:
    """``rmq-semantics txn pending``: one dict per pending transaction (keys: the headers)."""
    return parse_rich_table(text, PENDING_HEADERS)


def parse_discarded(text: str) -> list[dict[str, str]]:
    """``rmq-semantics txn discarded``."""
    return parse_rich_table(text, DISCARDED_HEADERS)


def kafka_tools_classpath(pom: Path = TOOLS_POM) -> str:
    """kafka-tools and its dependencies, resolved once by Maven into the project's cache."""
    from rmq_semantics.embedded import cache_dir, resolve_maven_jars

    match = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", pom.read_text())
    if match is None:
        raise ToolOutputError(f"{pom} does not pin <kafka.version>")
    version = match.group(1)
    libs = resolve_maven_jars(
        pom,
        cache_dir() / f"kafka-tools-{version}" / "libs",
        f"kafka-tools {version}",
        [f"-Dkafka.version={version}"],
    )
    return str(libs / "*")


def transactions_command(
    bootstrap: str,
    args: Sequence[str],
    *,
    command_config: str | None = None,
    timeout_s: float = TOOL_TIMEOUT_S,
) -> str:
    """Run Apache Kafka's ``TransactionsCommand`` (what ``kafka-transactions.sh`` runs) and
    return its stdout; a non-zero exit raises ToolOutputError with its stderr's last line."""
    from rmq_semantics.embedded import java_executable

    cmd = [
        java_executable(),
        "-cp",
        kafka_tools_classpath(),
        TOOLS_MAIN,
        "--bootstrap-server",
        bootstrap,
    ]
    if command_config:
        cmd += ["--command-config", command_config]
    cmd += list(args)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise ToolOutputError(
            f"TransactionsCommand {' '.join(args)} did not finish within {timeout_s:.0f} s"
        ) from exc
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        raise ToolOutputError(
            f"TransactionsCommand {' '.join(args)} exited {proc.returncode}: "
            f"{lines[-1] if lines else '(no stderr)'}"
        )
    return proc.stdout


def find_hanging_on_brokers(
    bootstrap: str,
    broker_ids: Sequence[int],
    *,
    command_config: str | None = None,
    max_transaction_timeout_min: int | None = None,
) -> dict[int, str]:
    """``find-hanging --broker-id N`` on every broker: broker id -> the command's output."""
    extra = (
        []
        if max_transaction_timeout_min is None
        else ["--max-transaction-timeout", str(max_transaction_timeout_min)]
    )
    return {
        b: transactions_command(
            bootstrap,
            ["find-hanging", "--broker-id", str(b), *extra],
            command_config=command_config,
        )
        for b in broker_ids
    }
