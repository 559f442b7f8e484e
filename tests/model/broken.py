"""Running a state machine on deliberately broken code: Hypothesis must find a failing
history and shrink it. Shared by the model tests' broken-transition tests."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import Phase, settings
from hypothesis.reporting import with_reporter
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

# Examples the search may take before it must have found the planted defect.
SEARCH_EXAMPLES = 400


@dataclass
class Found:
    """What Hypothesis reported for a broken machine: the error, and the shrunk history
    (the ``state.rule(...)`` lines of its falsifying example)."""

    error: BaseException
    report: str
    rules: frozenset[str]  # the machine's rule names (the report also lists invariants)

    @property
    def steps(self) -> list[str]:
        steps = [line.strip().split(" = ", 1)[-1] for line in self.report.splitlines()]
        return [s for s in steps if s.removeprefix("state.").split("(")[0] in self.rules]


def find_failure(machine: type[RuleBasedStateMachine], examples: int = SEARCH_EXAMPLES) -> Found:
    """Run ``machine`` until it fails (it must): the error and the falsifying history."""
    lines: list[str] = []
    with with_reporter(lines.append), pytest.raises(Exception) as failure:
        run_state_machine_as_test(
            machine,
            settings=settings(
                settings.default,
                max_examples=examples,
                derandomize=True,
                database=None,
                print_blob=False,
                report_multiple_bugs=False,
                phases=[p for p in Phase if p is not Phase.explain],
            ),
        )
    notes = getattr(failure.value, "__notes__", [])  # where Hypothesis puts the steps
    rules = frozenset(
        name
        for name in dir(machine)
        if getattr(getattr(machine, name, None), "hypothesis_stateful_rule", None)
    )
    return Found(failure.value, "\n".join(map(str, [*lines, *notes])), rules)
