#!/usr/bin/env bash
# Apache Kafka's command-line tools that docker/compose.yaml runs, under the names and at the
# path the apache/kafka image has them (/opt/kafka/bin), so the compose file works on either
# image. docker/images.sh installs this one script under each name; the name picks the class.
#   kafka-broker-api-versions.sh  the healthcheck: exit 0 once the broker answers ApiVersions
#                                 (a bare TCP connect does not prove that)
#   kafka-topics.sh               the `topics` service creates the business topic
set -euo pipefail
case "$(basename "$0")" in
    kafka-broker-api-versions.sh) class=org.apache.kafka.tools.BrokerApiVersionsCommand ;;
    kafka-topics.sh) class=org.apache.kafka.tools.TopicCommand ;;
    *) echo "kafka-tool.sh: no Kafka tool is named $(basename "$0")" >&2; exit 2 ;;
esac
# A small client JVM: the healthcheck runs this every few seconds next to the broker.
exec java -Xmx64m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true \
    -Dlog4j2.configurationFile=/opt/kafka/tools-log4j2.properties \
    -cp "/opt/kafka/tools-libs/*" "$class" "$@"
