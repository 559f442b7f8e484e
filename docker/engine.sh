#!/usr/bin/env bash
# A Docker Engine for the container builds and suites, set up from this repository alone.
#   docker/engine.sh ensure   install docker.io (root + apt-get) if missing, start dockerd if
#                             none answers, install the compose v2 plugin if missing
#   docker/engine.sh stop     stop dockerd, only if `ensure` started it (its pidfile)
#   docker/engine.sh status   exit 0 when an engine answers
# RMQ_ENGINE_COMPOSE=skip: `ensure` leaves the compose plugin out (a Go build on a fresh
# machine; only the compose scenarios need it).
# Shell, not Python: it runs before any venv exists and only drives apt-get, dockerd and go.
# When no engine can be had at all it prints one reason and exits 0 (exit 3 under
# RMQ_REQUIRE=docker; it is a comma list, e.g. docker,postgres: CI fails instead of skipping).
set -euo pipefail

STATE_DIR="${RMQ_DOCKER_STATE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rmq-semantics/dockerd}"
PIDFILE="$STATE_DIR/dockerd.pid"
LOGFILE="$STATE_DIR/dockerd.log"
SOCKET="/var/run/docker.sock"
COMPOSE_VERSION="${RMQ_COMPOSE_VERSION:-v2.29.7}"
PLUGIN_DIR="${DOCKER_CONFIG:-$HOME/.docker}/cli-plugins"
START_TIMEOUT_S=60

say() { echo "engine: $*"; }

# The one exit for "no engine can be had": a skip, unless the caller requires docker.
no_engine() {
    say "no Docker engine: $*"
    if [[ ",${RMQ_REQUIRE:-}," == *",docker,"* ]]; then
        say "RMQ_REQUIRE=docker: failing"
        exit 3
    fi
    exit 0
}

answers() { timeout 10 docker info >/dev/null 2>&1; }

install_engine() {
    command -v dockerd >/dev/null && return 0
    if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null; then
        no_engine "dockerd is not installed and this is not root with apt-get"
    fi
    say "installing Debian's docker.io"
    # iptables comes with docker.io; the apt lists may be missing on a fresh machine.
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            docker.io >"$STATE_DIR/apt.log" 2>&1; then
        apt-get update -q >>"$STATE_DIR/apt.log" 2>&1 || true
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            docker.io >>"$STATE_DIR/apt.log" 2>&1 \
            || no_engine "apt-get install docker.io failed (see $STATE_DIR/apt.log)"
    fi
}

start_daemon() {
    answers && return 0
    [[ "$(id -u)" == 0 ]] || no_engine "no engine answers and only root can start dockerd"
    say "starting dockerd (log: $LOGFILE)"
    # Only the unix socket: no TCP listener. setsid keeps it alive after this shell exits.
    setsid dockerd --host "unix://$SOCKET" --pidfile "$PIDFILE" \
        </dev/null >>"$LOGFILE" 2>&1 &
    local deadline=$((SECONDS + START_TIMEOUT_S))
    until answers; do
        if ((SECONDS > deadline)); then
            no_engine "dockerd did not answer within ${START_TIMEOUT_S}s: $(tail -n 1 "$LOGFILE")"
        fi
        kill -0 $! 2>/dev/null || no_engine "dockerd exited: $(tail -n 1 "$LOGFILE")"
        sleep 1
    done
    touch "$STATE_DIR/started-by-us"
    say "dockerd running, pid $(cat "$PIDFILE")"
}

install_compose() {
    docker compose version >/dev/null 2>&1 && return 0
    command -v go >/dev/null || { say "compose plugin missing and no Go toolchain"; return 1; }
    say "building docker compose $COMPOSE_VERSION from its Go module"
    local gobin="$STATE_DIR/gobin"
    mkdir -p "$gobin" "$PLUGIN_DIR"
    GOBIN="$gobin" GOFLAGS="-p=2" go install \
        -ldflags "-s -w -X github.com/docker/compose/v2/internal.Version=$COMPOSE_VERSION" \
        "github.com/docker/compose/v2/cmd@$COMPOSE_VERSION" >"$STATE_DIR/go.log" 2>&1 \
        || { say "go install failed (see $STATE_DIR/go.log)"; return 1; }
    install -m 0755 "$gobin/cmd" "$PLUGIN_DIR/docker-compose"
    say "$(docker compose version)"
}

stop_daemon() {
    if [[ ! -f "$STATE_DIR/started-by-us" || ! -f "$PIDFILE" ]]; then
        say "dockerd was not started by engine.sh; leaving it alone"
        return 0
    fi
    local pid
    pid="$(cat "$PIDFILE")"
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid"
        # dockerd stops its containers first (their grace periods), so allow a while.
        local deadline=$((SECONDS + 90))
        while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 1; done
        kill -0 "$pid" 2>/dev/null && { say "dockerd $pid did not stop"; return 1; }
    fi
    rm -f "$STATE_DIR/started-by-us"
    say "dockerd stopped"
}

mkdir -p "$STATE_DIR"
case "${1:-ensure}" in
    ensure)
        if ! answers; then
            install_engine
            start_daemon
        fi
        if [[ "${RMQ_ENGINE_COMPOSE:-}" != skip ]]; then
            install_compose || say "continuing without docker compose"
        fi
        ;;
    stop) stop_daemon ;;
    status) answers ;;
    *) echo "usage: $0 ensure|stop|status" >&2; exit 2 ;;
esac
