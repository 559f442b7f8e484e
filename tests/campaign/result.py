"""What a checker returns: a name, PASS or FAIL, a one-line summary, and the violations."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TextIO

__all__ = ["CheckResult", "Status", "Violation"]

# The printed line names a few violations; the full list is on the result.
SHOWN_IN_LINE = 3


class Status(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"


@dataclass(frozen=True)
class Violation:
    """One broken promise: a short ``kind`` word, a sentence, and where to look."""

    kind: str
    detail: str
    where: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}"


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: Status
    summary: str
    violations: tuple[Violation, ...] = ()

    @classmethod
    def of(cls, name: str, summary: str, violations: list[Violation]) -> CheckResult:
        """FAIL when there is any violation, else PASS."""
        status = Status.FAIL if violations else Status.PASS
        return cls(name, status, summary, tuple(violations))

    @property
    def passed(self) -> bool:
        return self.status is Status.PASS

    def kinds(self) -> set[str]:
        return {v.kind for v in self.violations}

    def line(self) -> str:
        """``check <name>: PASS|FAIL - summary`` plus the first violations."""
        text = f"check {self.name}: {self.status.value} - {self.summary}"
        if self.violations:
            shown = "; ".join(str(v) for v in self.violations[:SHOWN_IN_LINE])
            more = len(self.violations) - SHOWN_IN_LINE
            text += f" [{shown}{f'; +{more} more' if more > 0 else ''}]"
        return text

    def print(self, out: TextIO | None = None) -> CheckResult:
        print(self.line(), file=out or sys.stdout, flush=True)
        return self
