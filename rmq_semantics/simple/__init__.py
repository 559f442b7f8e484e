"""SimpleConsumer and FIFO message groups (issue 36), in progress: the pure lease engine
(:mod:`.engine`) and its commit-metadata field (:mod:`.leases`). No public class uses them
yet; docs/design/simple-consumer.md is the design."""
