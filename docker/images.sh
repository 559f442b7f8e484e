#!/usr/bin/env bash
# `make images`: build the project's images, each only when its inputs changed.
#   docker/images.sh [coordinator] [kafka] [spark]     (default: all three)
# Every image is tagged NAME:src-<hash of its Dockerfile, inputs and base image id>; when that
# tag exists the build is skipped and only the public tag is pointed at it again.
# Base: $BASE_IMAGE, else python:3.11-slim when it is here or can be pulled, else a local
# Debian base made without a registry (docker/base.sh). Python packages come from a
# wheelhouse made here on the host, Kafka's jars from the embedded broker's Maven resolution,
# so no build step inside a container needs a package registry.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
BUILD=docker/.build
DEFAULT_BASE=python:3.11-slim
VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)"
KAFKA_VERSION="$(sed -n 's:.*<kafka\.version>\(.*\)</kafka\.version>.*:\1:p' \
    rmq_semantics/kafka/pom.xml)"
KAFKA_TOOLS_VERSION="$(sed -n 's:.*<kafka\.version>\(.*\)</kafka\.version>.*:\1:p' \
    docker/kafka/tools-pom.xml)"
COORDINATOR_IMAGE="rmq-semantics-coordinator:$VERSION"
SPARK_VERSION="$(sed -n 's:.*<spark\.version>\(.*\)</spark\.version>.*:\1:p' spark/pom.xml)"
SPARK_IMAGE="rmq-semantics-spark:$VERSION"
KAFKA_IMAGE="${RMQ_KAFKA_IMAGE:-rmq-semantics-kafka:$KAFKA_VERSION}"
LABEL=org.rmq-semantics.inputs

say() { echo "images: $*" >&2; }

# KIND is python or jre: which local base to make when the default one can't be had.
base_for() {
    if [[ -n "${BASE_IMAGE:-}" ]]; then
        echo "$BASE_IMAGE"
    elif docker image inspect "$DEFAULT_BASE" >/dev/null 2>&1 \
            || timeout 300 docker pull -q "$DEFAULT_BASE" >/dev/null 2>&1; then
        echo "$DEFAULT_BASE"
    else
        say "$DEFAULT_BASE can't be pulled here; using a local Debian base ($1)"
        docker/base.sh "$1"
    fi
}

# One hash over file names and contents (sorted, caches left out) plus extra strings.
inputs_hash() {
    local extra="$1"
    shift
    {
        find "$@" -type f -not -path '*/__pycache__/*' -not -name '*.pyc' -print0 \
            | sort -z | xargs -0 sha256sum
        echo "$extra"
    } | sha256sum | cut -c1-12
}

# build IMAGE DOCKERFILE CONTEXT BASE PREPARE INPUTS...
build() {
    local image="$1" dockerfile="$2" context="$3" base="$4" prepare="$5"
    shift 5
    local name="${image%:*}" base_id hash
    base_id="$(docker image inspect --format '{{.Id}}' "$base")"
    hash="$(inputs_hash "$base_id" "$dockerfile" "$@")"
    if docker image inspect "$name:src-$hash" >/dev/null 2>&1; then
        docker tag "$name:src-$hash" "$image"
        say "$image is up to date ($name:src-$hash)"
        return 0
    fi
    "$prepare"
    local started=$SECONDS log="$BUILD/${name##*/}.build.log"
    say "building $image on $base"
    if ! docker build -f "$dockerfile" --build-arg "BASE_IMAGE=$base" \
            --label "$LABEL=$hash" -t "$name:src-$hash" -t "$image" "$context" \
            >"$log" 2>&1; then
        tail -n 20 "$log" >&2
        say "building $image failed (full log: $log)"
        return 1
    fi
    say "built $image ($name:src-$hash) in $((SECONDS - started)) s"
    # Older content tags of this image are superseded: drop them, keep the layers in use.
    docker images "$name" --format '{{.Tag}}' | grep '^src-' | grep -vx "src-$hash" \
        | sed "s|^|$name:|" | xargs -r docker rmi >/dev/null 2>&1 || true
}

# The project's wheel and its dependencies' wheels for CPython 3.11 on this architecture
# (both bases run 3.11), whatever Python the host has. PySpark is published as an sdist only:
# its (pure Python) wheel is built here first.
wheelhouse() {
    local wheels="$BUILD/wheelhouse/$1" requirement="$2" arch log="$BUILD/wheelhouse/pip.log"
    arch="$(uname -m)"
    rm -rf "$wheels" && mkdir -p "$wheels"
    if ! { "$PYTHON" -m pip wheel -q --no-deps --wheel-dir "$wheels" . \
            && if [[ "$1" == spark ]]; then
                "$PYTHON" -m pip wheel -q --no-deps --wheel-dir "$wheels" "pyspark==$SPARK_VERSION"
            fi \
            && "$PYTHON" -m pip download -q --only-binary=:all: --python-version 3.11 \
                --implementation cp --platform "manylinux2014_$arch" \
                --platform "manylinux_2_28_$arch" --platform "manylinux_2_34_$arch" \
                --find-links "$wheels" --dest "$wheels" \
                "$(echo "$wheels"/rmq_semantics-*.whl)$requirement"; } >"$log" 2>&1; then
        tail -n 5 "$log" >&2
        say "making the $1 wheelhouse failed (full log: $log)"
        return 1
    fi
}

prepare_coordinator() { wheelhouse coordinator "[otel]"; }

# The wheels with PySpark, and the Kafka source jars in the layout spark/jars.py reads
# under RMQ_CACHE_DIR (spark-kafka-<version>/libs).
prepare_spark() {
    wheelhouse spark "[spark]"
    local libs
    libs="$(PYTHONPATH="$PWD" "$PYTHON" -c 'from spark.jars import spark_jars, spark_version
from rmq_semantics.embedded import cache_dir
spark_jars(); print(cache_dir() / f"spark-kafka-{spark_version()}" / "libs")')"
    rm -rf "$BUILD/spark-cache" && mkdir -p "$BUILD/spark-cache/spark-kafka-$SPARK_VERSION"
    cp -r "$libs" "$BUILD/spark-cache/spark-kafka-$SPARK_VERSION/libs"
}

prepare_kafka() {
    local context="$BUILD/kafka" libs
    libs="$(PYTHONPATH="$PWD" "$PYTHON" -c \
        'from rmq_semantics.embedded import kafka_classpath; print(kafka_classpath())')"
    rm -rf "$context" && mkdir -p "$context/bin"
    cp -r "${libs%/\*}" "$context/libs"
    # The tools with their own dependencies, apart from the broker's jars: they are a client
    # (they talk to the broker over the network), and kafka-tools may lag the broker's
    # release (tools-pom.xml). An absolute directory: Maven resolves a relative one against
    # the pom's own.
    if ! mvn -q -B -s rmq_semantics/kafka/maven-settings.xml -f docker/kafka/tools-pom.xml \
            dependency:copy-dependencies -DincludeScope=runtime \
            "-DoutputDirectory=$PWD/$context/tools-libs" \
            >"$BUILD/kafka-tools.mvn.log" 2>&1; then
        tail -n 5 "$BUILD/kafka-tools.mvn.log" >&2
        say "resolving kafka-tools $KAFKA_TOOLS_VERSION failed (full log: $BUILD/kafka-tools.mvn.log)"
        return 1
    fi
    local tool
    for tool in kafka-broker-api-versions.sh kafka-topics.sh; do
        cp docker/kafka/kafka-tool.sh "$context/bin/$tool"
    done
    cp docker/kafka/entrypoint.sh docker/kafka/log4j2.properties \
        docker/kafka/tools-log4j2.properties "$context/"
}

# What the project's wheel is built from. README.md (the wheel's long description) is left
# out: editing the docs should not rebuild the images.
PYTHON_INPUTS=(pyproject.toml rmq_semantics coordinator spark)

targets=("$@")
((${#targets[@]})) || targets=(coordinator kafka spark)
mkdir -p "$BUILD"
for target in "${targets[@]}"; do
    case "$target" in
        coordinator)
            build "$COORDINATOR_IMAGE" docker/Dockerfile . "$(base_for python)" \
                prepare_coordinator "${PYTHON_INPUTS[@]}"
            ;;
        spark)
            build "$SPARK_IMAGE" docker/Dockerfile.spark . "$(base_for jre)" prepare_spark \
                "${PYTHON_INPUTS[@]}"
            ;;
        kafka)
            build "$KAFKA_IMAGE" docker/Dockerfile.kafka "$BUILD/kafka" "$(base_for jre)" \
                prepare_kafka docker/kafka rmq_semantics/kafka/pom.xml
            ;;
        *) say "unknown image '$target' (coordinator, kafka, spark)"; exit 2 ;;
    esac
done
