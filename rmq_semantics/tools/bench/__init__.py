"""``rmq-semantics bench``: :mod:`.runner` holds the run, the CLI and the transactional and
Spark cases; :mod:`.orderly` the orderly consumer case, whose killed victim is the process
:mod:`.orderly_child`; :mod:`.plots` the PNGs; :mod:`.common` what every case shares.

Kept empty so the collector and victim processes import only what they use.
"""
