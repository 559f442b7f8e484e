#!/usr/bin/env bash
# Headless Chromium for the docs site's browser test (tests/site): Debian's chromium and
# chromium-driver packages (the system chromedriver; Selenium downloads no driver).
#   tests/site/chromium.sh ensure   install them (root + apt-get) if missing
#   tests/site/chromium.sh status   exit 0 when chromium and chromedriver are there
# Quick when installed. When they cannot be had it prints one reason and exits 0 (exit 3 when
# RMQ_REQUIRE, a comma list, names chromium: CI fails instead of skipping).
set -euo pipefail

STATE_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/rmq-semantics/chromium"
say() { echo "chromium: $*"; }

installed() {
    command -v chromium >/dev/null && command -v chromedriver >/dev/null
}

apt_install() {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        -o Dpkg::Options::=--force-confold chromium chromium-driver
}

no_chromium() {
    say "no Chromium: $*"
    if [[ ",${RMQ_REQUIRE:-}," == *",chromium,"* ]]; then
        say "RMQ_REQUIRE=chromium: failing"
        exit 3
    fi
    exit 0
}

ensure() {
    installed && return 0
    if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null; then
        no_chromium "chromium is not installed and this is not root with apt-get"
    fi
    mkdir -p "$STATE_DIR"
    say "installing Debian's chromium and chromium-driver (log: $STATE_DIR/apt.log)"
    local ok=1
    # The apt lists may be missing or stale on a fresh machine: update once, then try again.
    if ! apt_install >"$STATE_DIR/apt.log" 2>&1; then
        apt-get update -q >>"$STATE_DIR/apt.log" 2>&1 || true
        apt_install >>"$STATE_DIR/apt.log" 2>&1 || ok=0
    fi
    [[ "$ok" == 1 ]] || no_chromium "apt-get install chromium chromium-driver failed (see $STATE_DIR/apt.log)"
    installed || no_chromium "installed but no chromium/chromedriver on PATH"
}

case "${1:-}" in
    ensure) ensure ;;
    status) installed ;;
    *) echo "usage: $0 ensure|status" >&2; exit 2 ;;
esac
