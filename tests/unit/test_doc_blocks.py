"""Every fenced Python block of the README and the docs is run or says why not
(tests/doc_blocks.py has the markers), and the check itself fails on a block that is neither."""

from __future__ import annotations

from pathlib import Path

from tests.doc_blocks import ROOT, examples_run, markdown_pages, problems, python_blocks


def test_every_python_block_in_the_readme_and_docs_is_run_or_marked() -> None:
    pages = markdown_pages()
    assert ROOT / "README.md" in pages
    assert ROOT / "docs" / "guides" / "transactions.md" in pages
    assert problems(pages) == []


def test_the_readme_examples_are_run() -> None:
    kinds = [block.kind for block in python_blocks(ROOT / "README.md")]
    assert kinds == ["example", "example"]


def _tree(tmp_path: Path, page: str, example: str | None = None) -> Path:
    (tmp_path / "examples").mkdir()
    if example is not None:
        (tmp_path / "examples" / "hello.py").write_text(example)
    (tmp_path / "page.md").write_text(page)
    return tmp_path / "page.md"


def test_an_unmarked_python_block_fails(tmp_path: Path) -> None:
    page = _tree(
        tmp_path,
        "# Page\n\n```bash\nmake demo\n```\n\nText.\n\n```python\nprint('hi')\n```\n",
    )
    found = problems([page], root=tmp_path, run=set())
    assert len(found) == 1
    assert "page.md:9: a Python block neither run nor marked" in found[0]


def test_an_unmarked_block_in_a_list_or_with_attributes_fails(tmp_path: Path) -> None:
    page = _tree(
        tmp_path,
        "- item\n\n    ```py\n    x = 1\n    ```\n\n"
        '~~~{.python title="x.py"}\nx = 2\n~~~\n\n'
        "<!-- not run: a fragment -->\n```pycon\n>>> 1\n```\n",
    )
    found = problems([page], root=tmp_path, run=set())
    assert [line.split(": ", 1)[0].rsplit(":", 1)[1] for line in found] == ["3", "7"]


def test_a_marked_block_passes_and_a_reasonless_one_fails(tmp_path: Path) -> None:
    page = _tree(
        tmp_path,
        "<!-- not run: needs a SASL_SSL cluster -->\n```python\nx = 1\n```\n\n"
        "<!-- not run: -->\n```python\nx = 2\n```\n",
    )
    found = problems([page], root=tmp_path, run=set())
    assert len(found) == 1
    assert found[0].endswith("page.md:7: 'not run' without a reason")


def test_an_example_block_must_be_its_files_text_and_the_file_run(tmp_path: Path) -> None:
    marked = "<!-- example: examples/hello.py -->\n```python\nprint('hi')\n```\n"
    page = _tree(tmp_path, marked, example="print('hi')\n")
    assert problems([page], root=tmp_path, run={"examples/hello.py"}) == []
    not_run = problems([page], root=tmp_path, run=set())
    assert any("is not run by" in line for line in not_run)
    assert any("examples/hello.py: not run by" in line for line in not_run)
    (tmp_path / "examples" / "hello.py").write_text("print('hello')\n")
    drifted = problems([page], root=tmp_path, run={"examples/hello.py"})
    assert len(drifted) == 1
    assert "differs from examples/hello.py" in drifted[0]


def test_the_runner_names_are_read_from_the_integration_test(tmp_path: Path) -> None:
    test = tmp_path / "test_x.py"
    test.write_text('def test_a():\n    run("examples/hello.py")\n    x = "not/an/example.py"\n')
    assert examples_run(test) == {"examples/hello.py"}
