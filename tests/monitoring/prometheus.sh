#!/usr/bin/env bash
# Prometheus for the monitoring tests (tests/monitoring): Debian's prometheus package for its
# binaries only (/usr/bin/prometheus, /usr/bin/promtool); its service is kept from running
# (each test session starts its own server on 127.0.0.1 with a temp data dir).
#   tests/monitoring/prometheus.sh ensure   install it (root + apt-get) if missing
#   tests/monitoring/prometheus.sh status   exit 0 when prometheus and promtool are there
# Quick when installed. When it cannot be had it prints one reason and exits 0 (exit 3 when
# RMQ_REQUIRE, a comma list, names prometheus: CI fails instead of skipping).
set -euo pipefail

STATE_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/rmq-semantics/prometheus"
POLICY=/usr/sbin/policy-rc.d
say() { echo "prometheus: $*"; }

installed() {
    command -v prometheus >/dev/null && command -v promtool >/dev/null
}

apt_install() {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        -o Dpkg::Options::=--force-confold prometheus
}

no_prometheus() {
    say "no Prometheus: $*"
    if [[ ",${RMQ_REQUIRE:-}," == *",prometheus,"* ]]; then
        say "RMQ_REQUIRE=prometheus: failing"
        exit 3
    fi
    exit 0
}

# The package's service (port 9090, all interfaces) is not ours: stop it and keep it off.
quiet_service() {
    if command -v systemctl >/dev/null && [[ -d /run/systemd/system ]]; then
        systemctl disable --now prometheus >/dev/null 2>&1 || true
    elif [[ -x /etc/init.d/prometheus ]]; then
        /etc/init.d/prometheus stop >/dev/null 2>&1 || true
        update-rc.d prometheus disable >/dev/null 2>&1 || true
    fi
}

ensure() {
    installed && return 0
    if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null; then
        no_prometheus "prometheus is not installed and this is not root with apt-get"
    fi
    mkdir -p "$STATE_DIR"
    # No service start during the install (invoke-rc.d asks policy-rc.d; 101 = not allowed);
    # a policy file that was already there is left as it is.
    local own_policy=0
    if [[ ! -e "$POLICY" ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$POLICY" && chmod 0755 "$POLICY" && own_policy=1
    fi
    say "installing Debian's prometheus (log: $STATE_DIR/apt.log)"
    local ok=1
    # The apt lists may be missing or stale on a fresh machine: update once, then try again.
    if ! apt_install >"$STATE_DIR/apt.log" 2>&1; then
        apt-get update -q >>"$STATE_DIR/apt.log" 2>&1 || true
        apt_install >>"$STATE_DIR/apt.log" 2>&1 || ok=0
    fi
    [[ "$own_policy" == 1 ]] && rm -f "$POLICY"
    quiet_service
    [[ "$ok" == 1 ]] || no_prometheus "apt-get install prometheus failed (see $STATE_DIR/apt.log)"
    installed || no_prometheus "prometheus installed but no prometheus/promtool on PATH"
}

case "${1:-}" in
    ensure) ensure ;;
    status) installed ;;
    *) echo "usage: $0 ensure|status" >&2; exit 2 ;;
esac
