# The README's two commands: `make demo` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python

.PHONY: setup demo test lint bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

setup: $(VENV)/.installed
	$(PY) -m rmq_semantics setup

demo: setup
	$(PY) -m rmq_semantics demo

test: setup
	$(PY) -m ruff check .
	$(PY) -m pytest

bench: setup
	$(PY) -m rmq_semantics bench --out bench/results.json

lint: $(VENV)/.installed
	$(PY) -m ruff check .

clean:
	rm -rf $(VENV) build *.egg-info
