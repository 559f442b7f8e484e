"""The version: one source (pyproject.toml, as installed), read by the package and the CLI."""

from __future__ import annotations

from importlib.metadata import version

import pytest

import rmq_semantics
from rmq_semantics.cli import main


def test_the_package_version_is_the_installed_distributions():
    assert rmq_semantics.__version__ == version("rmq-semantics")


def test_the_cli_prints_its_version_and_exits_0(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"rmq-semantics {rmq_semantics.__version__}"
