#!/usr/bin/env bash
# The fault campaign's tools (tests/campaign): Debian's faketime (libfaketime, for producers
# whose clock runs ahead or behind), iptables (partitions inside the campaign's network
# namespace) and util-linux's unshare/setpriv; plus a small preload that fixes libfaketime's
# monotonic sleeps (faketime_fix.c), built with the machine's C compiler into the cache.
#   tests/campaign/tools.sh ensure   install what is missing (root + apt-get), build the fix
#   tests/campaign/tools.sh status   exit 0 when everything is there
#   tests/campaign/tools.sh fixlib   print the path of the built fix
# When something cannot be had it prints one reason and exits 0 (exit 3 when RMQ_REQUIRE, a
# comma list, names campaign: CI fails instead of skipping).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE_DIR="${RMQ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rmq-semantics}/campaign"
FIXLIB="$STATE_DIR/libfaketime_fix.so"
say() { echo "campaign tools: $*"; }

faketime_lib() {
    local lib
    for lib in /usr/lib/*/faketime/libfaketimeMT.so.1 /usr/lib/faketime/libfaketimeMT.so.1; do
        [[ -e "$lib" ]] && { echo "$lib"; return 0; }
    done
    return 1
}

packages_installed() {
    faketime_lib >/dev/null && command -v iptables >/dev/null && command -v unshare >/dev/null \
        && command -v setpriv >/dev/null
}

fix_built() {
    [[ -e "$FIXLIB" && "$FIXLIB" -nt "$HERE/faketime_fix.c" ]]
}

missing() {
    say "missing: $*"
    if [[ ",${RMQ_REQUIRE:-}," == *",campaign,"* ]]; then
        say "RMQ_REQUIRE=campaign: failing"
        exit 3
    fi
    exit 0
}

apt_install() {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        faketime iptables util-linux
}

build_fix() {
    command -v cc >/dev/null || missing "no C compiler (cc) to build $FIXLIB"
    mkdir -p "$STATE_DIR"
    cc -shared -fPIC -O2 -o "$FIXLIB.partial" "$HERE/faketime_fix.c" -ldl \
        && mv "$FIXLIB.partial" "$FIXLIB" || missing "building $FIXLIB failed"
}

ensure() {
    if ! packages_installed; then
        if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null; then
            missing "faketime/iptables are not installed and this is not root with apt-get"
        fi
        mkdir -p "$STATE_DIR"
        say "installing Debian's faketime and iptables (log: $STATE_DIR/apt.log)"
        # The apt lists may be missing or stale on a fresh machine: update once, then retry.
        if ! apt_install >"$STATE_DIR/apt.log" 2>&1; then
            apt-get update -q >>"$STATE_DIR/apt.log" 2>&1 || true
            apt_install >>"$STATE_DIR/apt.log" 2>&1 \
                || missing "apt-get install failed (see $STATE_DIR/apt.log)"
        fi
        packages_installed || missing "faketime, iptables, unshare or setpriv after the install"
    fi
    fix_built || build_fix
}

case "${1:-}" in
    ensure) ensure ;;
    status) packages_installed && fix_built ;;
    fixlib) echo "$FIXLIB" ;;
    *) echo "usage: $0 ensure|status|fixlib" >&2; exit 2 ;;
esac
