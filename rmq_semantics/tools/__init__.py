"""Tools around the library: ``demo``, ``bench``, the ``txn``/dlq admin CLI, and the one
helper that runs a coordinator process for them and for the tests.

Like :mod:`rmq_semantics.cli`, and unlike every other module of :mod:`rmq_semantics`, these
may use the sidecar (``coordinator``) and the Spark job (``spark``), but only lazily, inside
functions: importing a tool never loads the sidecar or PySpark.
"""
