#!/usr/bin/env bash
# PostgreSQL for the barrier tests (tests/barrier): the server binaries only, no cluster and
# no service (each test session runs its own server in a temp dir, see tests/barrier/postgres.py).
#   tests/barrier/postgres.sh ensure   install Debian's postgresql (root + apt-get) if missing
#   tests/barrier/postgres.sh status   exit 0 when initdb and pg_ctl are there
# Quick when installed. When it cannot be had it prints one reason and exits 0 (exit 3 when
# RMQ_REQUIRE, a comma list, names postgres: CI fails instead of skipping).
# Shell, like docker/engine.sh: it runs before any venv exists and only drives apt-get.
set -euo pipefail

STATE_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/rmq-semantics/postgres"
say() { echo "postgres: $*"; }

installed() {
    compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || command -v initdb >/dev/null
}

# --force-confold keeps a createcluster.conf written before the package.
apt_install() {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        -o Dpkg::Options::=--force-confold postgresql
}

no_postgres() {
    say "no PostgreSQL: $*"
    if [[ ",${RMQ_REQUIRE:-}," == *",postgres,"* ]]; then
        say "RMQ_REQUIRE=postgres: failing"
        exit 3
    fi
    exit 0
}

ensure() {
    installed && return 0
    if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null; then
        no_postgres "postgresql is not installed and this is not root with apt-get"
    fi
    mkdir -p "$STATE_DIR"
    # No default cluster and so no service on port 5432: the tests start their own servers.
    if [[ ! -e /etc/postgresql-common/createcluster.conf ]]; then
        mkdir -p /etc/postgresql-common
        echo "create_main_cluster = false" >/etc/postgresql-common/createcluster.conf
    fi
    say "installing Debian's postgresql (log: $STATE_DIR/apt.log)"
    # The apt lists may be missing on a fresh machine: update once, then try again.
    if ! apt_install >"$STATE_DIR/apt.log" 2>&1; then
        apt-get update -q >>"$STATE_DIR/apt.log" 2>&1 || true
        apt_install >>"$STATE_DIR/apt.log" 2>&1 \
            || no_postgres "apt-get install postgresql failed (see $STATE_DIR/apt.log)"
    fi
    installed || no_postgres "postgresql installed but no initdb found"
}

case "${1:-}" in
    ensure) ensure ;;
    status) installed ;;
    *) echo "usage: $0 ensure|status" >&2; exit 2 ;;
esac
