"""SimpleConsumer and FIFO message groups (issue 36): the pure lease engine
(:mod:`.engine`), its commit-metadata field (:mod:`.leases`), the Kafka edge (:mod:`.poller`)
and the ``SimpleConsumer`` class (:mod:`.consumer`, exported from ``rmq_semantics``);
docs/design/simple-consumer.md is the design, docs/guides/simple-consumer.md the guide."""
