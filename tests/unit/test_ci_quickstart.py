"""CI runs the README's quick start as written: .ci/quickstart reads its commands from
README.md at run time, and .ci/run runs what it prints."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / ".ci" / "quickstart"


def commands(readme: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(QUICKSTART), str(readme)], capture_output=True, text=True, check=False
    )


def test_the_readmes_quick_start_commands_are_make_demo_and_make_test() -> None:
    done = commands(ROOT / "README.md")
    assert done.returncode == 0, done.stderr
    assert [line.split("#")[0].strip() for line in done.stdout.splitlines()] == [
        "make demo",
        "make test",
    ]


def test_an_edit_to_the_readme_changes_what_runs(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(
        "# x\n\n## Install\n\n```bash\npip install x\n```\n\n## Quick start\n\nText.\n\n"
        "```bash\n# a comment line\nmake demo\n\nmake test TEST_ARGS=-x  # why\n```\n\n"
        "```bash\nmake bench\n```\n\n## Next\n\n```bash\nmake docs\n```\n"
    )
    done = commands(readme)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["make demo", "make test TEST_ARGS=-x  # why"]


def test_a_readme_without_a_quick_start_block_fails(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n## Quick start\n\nRun `make demo`.\n\n## Next\n\n```bash\nls\n```\n")
    done = commands(readme)
    assert done.returncode == 1
    assert "no commands" in done.stderr


def test_a_continued_command_fails(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("## Quick start\n\n```bash\nmake demo \\\n    DEMO_ARGS=1\n```\n")
    done = commands(readme)
    assert done.returncode == 1
    assert "one command a line" in done.stderr


def test_ci_runs_the_quick_start_and_no_separate_unit_test_step() -> None:
    run = (ROOT / ".ci" / "run").read_text()
    assert ".ci/quickstart README.md" in run
    assert "make check\n" not in run and "--ignore=tests/unit" not in run
