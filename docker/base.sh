#!/usr/bin/env bash
# A Debian bookworm base image made without any image registry (debootstrap + docker import),
# for machines where `python:3.11-slim` can't be pulled.
#   docker/base.sh python   Python 3 + venv + CA certificates  -> prints the image name
#   docker/base.sh jre      the same plus a headless Java 17   -> prints the image name
# The tag carries a hash of the package list, the mirror and this script, so a base is made
# once per machine and again only when one of those changes. Needs root and debootstrap.
set -euo pipefail

KIND="${1:?usage: $0 python|jre}"
STATE_DIR="${RMQ_IMAGE_STATE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rmq-semantics/images}"
SUITE=bookworm

packages="python3,python3-venv,ca-certificates,passwd"
case "$KIND" in
    python) ;;
    jre) packages="$packages,default-jre-headless" ;;
    *) echo "usage: $0 python|jre" >&2; exit 2 ;;
esac

# The host's own Debian mirror (deb822 or one-line sources), else Debian's default.
host_mirror() {
    local uri
    uri="$(grep -hsE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null \
        | awk '{print $2}' | grep -v security | head -n 1 || true)"
    if [[ -z "$uri" ]]; then
        uri="$(grep -hsE '^deb\s+(\[[^]]*\]\s+)?https?://\S+\s+'"$SUITE"'\s' \
            /etc/apt/sources.list 2>/dev/null | grep -oE 'https?://\S+' | head -n 1 || true)"
    fi
    echo "${uri:-http://deb.debian.org/debian}"
}

MIRROR="${RMQ_DEBIAN_MIRROR:-$(host_mirror)}"
hash="$(printf '%s\n%s\n%s\n' "$packages" "$MIRROR" "$(cat "$0")" | sha256sum | cut -c1-12)"
IMAGE="rmq-semantics-base:$SUITE-$KIND-$hash"

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
    echo "$IMAGE"
    exit 0
fi
# A fresh machine has no debootstrap: install it as engine.sh installs docker.io.
if ! command -v debootstrap >/dev/null && [[ "$(id -u)" == 0 ]] \
        && command -v apt-get >/dev/null; then
    echo "base: installing debootstrap" >&2
    mkdir -p "$STATE_DIR"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap \
        >"$STATE_DIR/apt.log" 2>&1 || {
        apt-get update -q >>"$STATE_DIR/apt.log" 2>&1 || true
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            debootstrap >>"$STATE_DIR/apt.log" 2>&1 || true
    }
fi
command -v debootstrap >/dev/null || {
    echo "base: debootstrap is missing and could not be installed (apt-get install" \
         "debootstrap; see $STATE_DIR/apt.log)" >&2
    exit 1
}
mkdir -p "$STATE_DIR/debs"
rootfs="$STATE_DIR/rootfs-$KIND-$hash"
rm -rf "$rootfs"
trap 'rm -rf "$rootfs"' EXIT
echo "base: debootstrap $SUITE ($packages) from $MIRROR" >&2
# The shared --cache-dir lets the jre base reuse the packages the python base fetched.
debootstrap --variant=minbase --include="$packages" --cache-dir="$STATE_DIR/debs" \
    "$SUITE" "$rootfs" "$MIRROR" >"$STATE_DIR/debootstrap-$KIND.log" 2>&1 || {
    echo "base: debootstrap failed, see $STATE_DIR/debootstrap-$KIND.log" >&2
    exit 1
}
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb
# An imported image has no config: give it the PATH and locale a Debian image has.
tar -C "$rootfs" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["bash"]' - "$IMAGE" >/dev/null
echo "$IMAGE"
