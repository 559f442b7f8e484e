"""``rmq-semantics bench``: :mod:`.runner` holds the run and the CLI; :mod:`.cases` every
case as one run; :mod:`.txn` the transactional cases, :mod:`.threads`, :mod:`.copier`,
:mod:`.coordinators`, :mod:`.orderly` (its killed victim is :mod:`.orderly_child`) and
:mod:`.spark` the others; :mod:`.collector` the measuring consumer; :mod:`.machine` the
machine and its load; :mod:`.console` the progress and final table; :mod:`.readme` the
benchmarks page's block; :mod:`.plots` the PNGs; :mod:`.common` settings and figures.

Kept empty so the collector and victim processes import only what they use.
"""
