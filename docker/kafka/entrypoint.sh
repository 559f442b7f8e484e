#!/usr/bin/env bash
# One KRaft node (broker + controller) configured like the official apache/kafka image:
# every KAFKA_FOO_BAR variable becomes foo.bar in server.properties (`__` -> `_`,
# `___` -> `-`), CLUSTER_ID formats the storage on first start. Defaults: one node on
# PLAINTEXT :9092 (advertised localhost:9092), controller :9093, replication factor 1.
set -euo pipefail

: "${CLUSTER_ID:=llwj7qQcQ26-KOldK-LRcw}"
: "${KAFKA_NODE_ID:=1}"
: "${KAFKA_PROCESS_ROLES:=broker,controller}"
: "${KAFKA_LISTENERS:=PLAINTEXT://:9092,CONTROLLER://:9093}"
: "${KAFKA_ADVERTISED_LISTENERS:=PLAINTEXT://localhost:9092}"
: "${KAFKA_CONTROLLER_LISTENER_NAMES:=CONTROLLER}"
: "${KAFKA_CONTROLLER_QUORUM_VOTERS:=${KAFKA_NODE_ID}@localhost:9093}"
: "${KAFKA_LISTENER_SECURITY_PROTOCOL_MAP:=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT}"
: "${KAFKA_INTER_BROKER_LISTENER_NAME:=PLAINTEXT}"
: "${KAFKA_LOG_DIRS:=/var/lib/kafka/data}"
# A single node can only have replication factor 1 and min ISR 1 for its internal topics.
: "${KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR:=1}"
: "${KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR:=1}"
: "${KAFKA_TRANSACTION_STATE_LOG_MIN_ISR:=1}"
: "${KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR:=1}"
: "${KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR:=1}"
: "${KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS:=0}"

# JVM settings, not broker properties (the names the official image uses).
SKIP=" KAFKA_HEAP_OPTS KAFKA_JVM_PERFORMANCE_OPTS KAFKA_OPTS KAFKA_HOME "
props="$(mktemp /tmp/server.XXXXXX.properties)"
for var in "${!KAFKA_@}"; do
    [[ "$SKIP" == *" $var "* ]] && continue
    key="$(sed -e 's/^KAFKA_//' -e 's/___/-/g' -e 's/__/@/g' -e 's/_/./g' -e 's/@/_/g' \
        <<<"$var" | tr '[:upper:]' '[:lower:]')"
    printf '%s=%s\n' "$key" "${!var}" >>"$props"
done

CP="/opt/kafka/libs/*"
java -cp "$CP" kafka.tools.StorageTool format -t "$CLUSTER_ID" -c "$props" \
    --ignore-formatted >/dev/null
# exec: Java becomes PID 1, so the SIGTERM of `docker stop` reaches the broker itself.
# shellcheck disable=SC2086  # the option strings are word lists
exec java ${KAFKA_HEAP_OPTS:--Xmx512m -Xms512m} \
    ${KAFKA_JVM_PERFORMANCE_OPTS:--XX:+UseG1GC -XX:TieredStopAtLevel=1} ${KAFKA_OPTS:-} \
    -Djava.awt.headless=true -Dlog4j2.configurationFile=/opt/kafka/log4j2.properties \
    -cp "$CP" kafka.Kafka "$props"
