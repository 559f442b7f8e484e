"""The fault campaign (issue 30): a workload of producer and consumer processes on a
3-node cluster, a nemesis acting on them, and checkers over the recorded history.

``python -m tests.campaign --seed N --duration S [--short] [--out DIR]`` runs one campaign;
``runner.py`` orchestrates, ``workload.py`` holds what the worker processes share.

- history.py: the JSON-lines history format (documented there), ``Recorder``, ``load``;
- events.py: typed constructors of every event kind;
- checkers.py (and consumer_checks.py): one checker per promise, ``run_all``;
- txn_tools.py: parsers of ``kafka-transactions.sh`` and ``rmq-semantics txn`` output and a
  runner of Kafka's TransactionsCommand;
- summary.py: the closing table and the replay line;
- planted.py: a small clean history with every event kind (the tests' base, and an example).
"""
