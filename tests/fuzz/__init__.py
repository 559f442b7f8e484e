"""The fuzzer of issue 12: generators of random and mutated system records
(:mod:`.generators`, :mod:`.categories`), an in-memory run of the coordinator's transaction
service (:mod:`.sim`, used by ``tests/unit/test_fuzz.py``), and the run through a real
coordinator on a broker (:mod:`.coordinator_run`, ``make fuzz`` and
``tests/integration/test_fuzz_coordinator.py``).

House rule: every new record type (``RecordType``) or ``rmq.*`` header (``H``) joins the
generators; a unit test fails when one has none.
"""
