# The README's two commands: `make demo` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python

.PHONY: setup demo check test lint types bench fuzz clean engine images engine-stop test-docker \
	test-docker-full test-group-protocol test-cluster \
	test-matrix test-oldest test-keys test-push test-barrier model campaign campaign-short docs \
	bench-timers-million \
	docs-browser-setup test-docs-site

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# The jars from Maven Central, and when missing the barrier tests' PostgreSQL, the
# monitoring tests' Prometheus (Debian's packages, their services kept off) and the fault
# campaign's faketime and iptables.
setup: $(VENV)/.installed
	$(PY) -m rmq_semantics setup
	tests/barrier/postgres.sh ensure
	tests/monitoring/prometheus.sh ensure
	tests/campaign/tools.sh ensure

demo: setup
	$(PY) -m rmq_semantics demo

# The fast lane (seconds, no broker, no jars): lint, formatting, types, the unit tests. The
# same checks as .pre-commit-config.yaml; `make test` runs it first.
check: $(VENV)/.installed
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(PY) -m pytest tests/unit

# Every suite but the container and cluster ones (their markers): the fast lane first (make
# check, the unit tests included), then the set-up and every other suite (fuzz, integration,
# the docs' examples, barrier, monitoring) without tests/unit, so no test runs twice.
# TEST_ARGS adds pytest arguments to that second run (e.g. -k NAME or -x). CI runs it as the
# README's quick start writes it (.ci/run). The 30 slowest tests are listed at the end: the
# issues' CI shares are read from there.
test: check setup
	$(PY) -m pytest --ignore=tests/unit --durations=30 $(TEST_ARGS)

# The bench's full run (BENCH_ARGS adds e.g. --cases threads,latency or --repeat 3), then the
# docs' benchmarks page (its rendered block) and the README's summary from its results. The bench is the checkout's
# benchmarks/ package (not shipped in the wheel); its results and plots go to bench/.
bench: setup
	$(PY) -m benchmarks --out bench/results.json $(BENCH_ARGS)
	$(PY) -m benchmarks --render --out bench/results.json --page docs/benchmarks.md
	$(PY) -m benchmarks --render --out bench/results.json --page README.md

# The million-message run of issue 35 (not in CI; about 3 minutes on 2 cores): a coordinator's
# RSS with 1,000 timer messages scheduled, with 1,000,000 over the next day, and while a stream
# of them fires (benchmarks/timer_memory.py); merged into bench/results.json as timer_memory,
# then the docs' benchmarks page. TIMERS_ARGS adds e.g. --count 100000 or --smoke.
bench-timers-million: setup
	$(PY) -m benchmarks.timer_memory --out bench/results.json $(TIMERS_ARGS)
	$(PY) -m benchmarks --render --out bench/results.json --page docs/benchmarks.md

# The fuzzer's long run: 10,000 bad records through a real coordinator (RMQ_BOOTSTRAP_SERVERS
# or an embedded broker); FUZZ_ARGS adds e.g. --seed N, --only CATEGORY, --safe, --list.
fuzz: setup
	$(PY) -m tests.fuzz --records 10000 $(FUZZ_ARGS)

# A Docker Engine (installed and started when missing; see docker/engine.sh) and the images,
# each rebuilt only when its inputs change (docker/images.sh).
engine:
	docker/engine.sh ensure

engine-stop:
	docker/engine.sh stop

images: setup engine
	@docker/engine.sh status || { echo "images: no Docker engine answers"; exit 1; }
	PYTHON=$(abspath $(PY)) docker/images.sh $(IMAGES)

# The container suites (tests/containers): engine, images, the coordinator image as a sidecar
# next to the Kafka image; dockerd is stopped again if this started it (docker/test.sh).
# -full adds the compose plugin and the whole default run on the testcontainers broker.
test-docker: setup
	PY=$(PY) docker/test.sh quick

test-docker-full: setup
	PY=$(PY) docker/test.sh full

# The cluster suite (tests/cluster): a 3-node KRaft cluster of the embedded jars on free
# ports, broker kills mid-stream; excluded from `make test` by its marker.
test-cluster: setup
	$(PY) -m pytest -m cluster tests/cluster $(CLUSTER_ARGS)

# The fault campaign (tests/campaign, issue 30): inside namespaces of its own (network,
# mount, pid: tests/campaign/namespaces.py, root), a 3-node cluster of its own, producer and
# consumer processes, the nemesis (every fault kind), the checkers; a seed's run prints its
# table and the out dir holding its history. SEEDS="1 2 3" runs each (long load;
# CAMPAIGN_ARGS adds e.g. --duration 600); every seed runs, the target fails if one did.
SEEDS ?= 1
CAMPAIGN_NS := $(PY) -m tests.campaign.namespaces
# The final read's kafka-tools jars, resolved before the namespaces (no DNS in there).
CAMPAIGN_JARS := $(PY) -c "from tests.campaign.txn_tools import kafka_tools_classpath as k; k()"
campaign: setup
	@$(CAMPAIGN_JARS)
	@failed=""; for s in $(SEEDS); do \
		$(CAMPAIGN_NS) $(PY) -m tests.campaign --seed $$s $(CAMPAIGN_ARGS) \
			|| failed="$$failed $$s"; \
	done; \
	if [ -n "$$failed" ]; then echo "campaign: FAILED seeds:$$failed"; exit 1; fi

# The short campaign CI runs as its own step: the pinned seed, short horizons, every fault
# kind once, its own namespaced cluster; about 5 minutes.
SHORT_SEED ?= 30
campaign-short: setup
	@$(CAMPAIGN_JARS)
	$(CAMPAIGN_NS) $(PY) -m tests.campaign --short --seed $(SHORT_SEED) $(CAMPAIGN_ARGS)

# The transactional, orderly and SimpleConsumer suites on each Kafka release we support (the
# embedded jars of each, resolved from Maven Central once): the pinned default and the oldest
# line, 3.9.
KAFKA_VERSIONS ?= 4.4.0 4.1.1 3.9.2
test-matrix: setup
	@for v in $(KAFKA_VERSIONS); do \
		echo "test-matrix: Apache Kafka $$v"; \
		RMQ_TEST_KAFKA_VERSION=$$v $(PY) -m pytest tests/integration/test_transactions.py \
			tests/integration/test_orderly.py tests/integration/test_simple_consumer.py \
			$(MATRIX_ARGS) || exit 1; \
	done

# The transactional, orderly and push suites on the oldest Kafka line we support (3.9), and
# the SimpleConsumer's FIFO order across a SIGKILL, its pattern subscription, redelivery and
# DLQ (about 35 s), the short form CI runs: the 5,000-message SIGKILL run, the OAuth/TLS
# wiring test and the rest of the SimpleConsumer file are left to make test-matrix, which
# runs all of them on every supported release.
OLDEST_KAFKA ?= 3.9.2
OLDEST_SIMPLE := $(addprefix tests/integration/test_simple_consumer.py::test_, \
	fifo_per_group_holds_across_two_processes_and_a_sigkill \
	a_pattern_subscription_leaves_system_topics_out_and_keeps_its_tag_filter \
	an_unacked_message_comes_back_after_its_invisible_duration_with_attempt_2 \
	the_dlq_after_max_delivery_attempts)
test-oldest: setup
	RMQ_TEST_KAFKA_VERSION=$(OLDEST_KAFKA) $(PY) -m pytest tests/integration/test_transactions.py \
		tests/integration/test_orderly.py tests/integration/test_push.py $(OLDEST_SIMPLE) \
		-k "not sigkill_mid_5000 and not oauth_cb" $(OLDEST_ARGS)

# The user-facing consumers' suites (orderly, plain) under the KIP-848 group protocol.
test-group-protocol: setup
	RMQ_TEST_GROUP_PROTOCOL=consumer $(PY) -m pytest tests/integration/test_orderly.py \
		tests/integration/test_orderly_fast_path.py tests/integration/test_orderly_keys.py \
		tests/integration/test_orderly_keys_procs.py tests/integration/test_foundation.py \
		tests/integration/test_push.py $(GP_ARGS)

# Key-ordered consumption across processes, the long run: four consumer processes joining,
# leaving, SIGKILLed and SIGSTOPped over three rounds (the default run has a short one).
test-keys: setup
	RMQ_TEST_KEYS_LONG=1 $(PY) -m pytest tests/integration/test_orderly_keys_procs.py \
		tests/integration/test_orderly_keys.py $(KEYS_ARGS)

# The concurrent consumer with 10,000 messages (the default run has 2,000).
test-push: setup
	RMQ_TEST_PUSH_N=10000 $(PY) -m pytest tests/integration/test_push.py $(PUSH_ARGS)

# The transaction barrier's races with 1,000 transactions per database (the default run has
# 150); on SQLite and on a PostgreSQL server of its own (tests/barrier/postgres.sh installs it).
test-barrier: setup
	RMQ_TEST_BARRIER_N=1000 $(PY) -m pytest tests/barrier $(BARRIER_ARGS)

# The model-based tests (Hypothesis state machines of the coordinator's transaction state, the
# lock table and the orderly offset tracker) under the campaign profile: random, many more and
# longer histories than `make test`'s derandomized ci profile (tests/model/profiles.py).
model: $(VENV)/.installed
	HYPOTHESIS_PROFILE=campaign $(PY) -m pytest tests/unit/test_model_offsets.py \
		tests/unit/test_model_locks.py tests/unit/test_model_txn.py $(MODEL_ARGS)

# The docs site (mkdocs.yml), built strictly into site/: a broken link, a missing page or a
# reference page the code can no longer generate fails it. The pinned `docs` extra first;
# Material's end-of-life banner (CONTRIBUTING.md, "The docs") is silenced.
$(VENV)/.docs-installed: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[docs]'
	touch $@

MKDOCS_BUILD := NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site
docs: $(VENV)/.docs-installed
	$(MKDOCS_BUILD)

# The site again only when a tracked input (pages, root pages, the code its reference pages
# and API entries come from, the bench's plots) is newer than the last build: after
# `make docs`, as in CI, test-docs-site builds nothing.
SITE_INPUTS = $(wildcard $(shell git ls-files mkdocs.yml docs rmq_semantics coordinator spark bench '*.md' 2>/dev/null))
site/index.html: $(VENV)/.docs-installed $(SITE_INPUTS)
	$(MKDOCS_BUILD)

# Debian's chromium and chromium-driver (root + apt-get; quick when present) for the site's
# browser test: tests/site/chromium.sh. Selenium, in the docs extra, uses this chromedriver.
docs-browser-setup:
	tests/site/chromium.sh ensure

# Timer messages through repeated faults of a broker of the test's own (issue 35): four
# restarts, some SIGKILL, three seeds; a few minutes. CI runs the one-restart test instead.
test-timer-faults: setup
	$(PY) -m pytest -m faults tests/integration/test_timer_faults.py \
		tests/integration/test_timer_paused.py $(TEST_ARGS)

# The docs site as people read it (tests/site): served on 127.0.0.1 and opened in headless
# Chromium; a reader's search for send_message_in_transaction lands on its API entry.
# Screenshots into RMQ_SITE_SCREENSHOTS (a directory; default the test's tmp dir).
test-docs-site: site/index.html docs-browser-setup
	$(PY) -m pytest -m docs_site tests/site $(SITE_ARGS)

lint: $(VENV)/.installed
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# mypy over rmq_semantics, coordinator and spark (the files and flags: pyproject.toml).
types: $(VENV)/.installed
	$(PY) -m mypy

clean:
	rm -rf $(VENV) build *.egg-info site
