"""The fault campaign's history and checkers (issue 30).

- history.py: the JSON-lines history format (documented there), ``Recorder``, ``load``;
- events.py: typed constructors of every event kind;
- checkers.py (and consumer_checks.py): one checker per promise, ``run_all``;
- txn_tools.py: parsers of ``kafka-transactions.sh`` and ``rmq-semantics txn`` output and a
  runner of Kafka's TransactionsCommand;
- summary.py: the closing table and the replay line;
- planted.py: a small clean history with every event kind (the tests' base, and an example).
"""
