#!/usr/bin/env bash
# `make test-docker` / `make test-docker-full`: the container suites, with whatever set-up is
# missing done first, and dockerd stopped again afterwards if this run started it (a trap, so
# also on failure).
#   docker/test.sh [quick|full]
#   quick  engine (no compose plugin), the coordinator and Kafka images, then
#          pytest -m "containers and not compose" tests/containers
#   full   also the compose plugin (a Go build on a fresh machine), the Spark image and
#          `compose config`, then tests/containers with the compose scenario and the whole
#          default run (`pytest`), its broker under testcontainers
# No engine to be had: one reason, exit 0; under RMQ_REQUIRE=docker a failure.
# Shell, like engine.sh: it drives the engine script, the image builds and pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

MODE="${1:-quick}"
PY="${PY:-.venv/bin/python}"
say() { echo "test-docker: $*"; }

started_here=no
if ! docker/engine.sh status; then
    started_here=yes
fi
stop_engine() {
    local code=$?
    # Containers a failed run left behind would stop with dockerd; say so rather than hide it.
    if [[ "$started_here" == yes ]] && docker/engine.sh status; then
        docker/engine.sh stop || code=1
    fi
    exit "$code"
}
trap stop_engine EXIT

setup_started=$SECONDS
if [[ "$MODE" == full ]]; then
    docker/engine.sh ensure
else
    RMQ_ENGINE_COMPOSE=skip docker/engine.sh ensure
fi
if ! docker/engine.sh status; then
    # engine.sh said why (and failed already under RMQ_REQUIRE=docker).
    say "skipped: no Docker engine"
    exit 0
fi
# Absolute, but not resolved: a venv's python is a symlink to the base interpreter.
images=(coordinator kafka)
[[ "$MODE" == full ]] && images+=(spark)
PYTHON="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")" docker/images.sh "${images[@]}"
if [[ "$MODE" == full ]]; then
    docker compose -f docker/compose.yaml config -q
    say "docker compose -f docker/compose.yaml config: ok"
fi
say "set-up took $((SECONDS - setup_started)) s"

suite_started=$SECONDS
# The compose scenario (marker compose) needs the compose plugin and the Spark image: full only.
marker="containers and not compose"
[[ "$MODE" == full ]] && marker=containers
RMQ_REQUIRE=docker TESTCONTAINERS_RYUK_DISABLED=true \
    "$PY" -m pytest -m "$marker" tests/containers
if [[ "$MODE" == full ]]; then
    # The default run, its broker now the Kafka image under testcontainers.
    TESTCONTAINERS_RYUK_DISABLED=true "$PY" -m pytest
fi
say "suites took $((SECONDS - suite_started)) s"
