"""SimpleConsumer and FIFO message groups (issue 36), in progress: the pure lease engine
(:mod:`.engine`), its commit-metadata field (:mod:`.leases`), the Kafka edge (:mod:`.poller`)
and the ``SimpleConsumer`` class (:mod:`.consumer`, not exported from ``rmq_semantics`` yet);
docs/design/simple-consumer.md is the design."""
