"""The bench: ``rmq-semantics bench`` or ``python -m benchmarks``, from a source checkout
only (the wheel leaves it out; its results and plots are in ``bench/``).

:mod:`.runner` holds the run and the CLI; :mod:`.cases` every case as one run; :mod:`.txn`
the transactional cases, :mod:`.threads`, :mod:`.copier`, :mod:`.coordinators`,
:mod:`.orderly` (its killed victim is :mod:`.orderly_child`) and :mod:`.spark` the others;
:mod:`.collector` the measuring consumer; :mod:`.machine` the machine and its load;
:mod:`.console` the progress and final table; :mod:`.readme` the benchmarks page's block;
:mod:`.plots` the PNGs; :mod:`.common` settings and figures. The bench imports the library
and the coordinator; nothing of theirs imports the bench but the CLI's ``bench``, lazily.

Kept empty so the collector and victim processes import only what they use.
"""
