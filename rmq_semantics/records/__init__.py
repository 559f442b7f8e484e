"""The wire contract: every record and header the client library and the coordinator share.

- :mod:`.headers`: every ``rmq.*`` header name;
- :mod:`.half`: the headers of a half message, written and parsed;
- :mod:`.txn`: end requests, done and check markers, check requests;
- :mod:`.locks`: the lock key and its routing, lock requests, replies and state;
- :mod:`.timer`: timer records and cancels, the timing wheel's level arithmetic;
- :mod:`.codec`: records to bytes and back (typed, versioned Avro).

Nothing is imported here: ``message`` imports ``.headers``, and ``.half`` imports ``message``.
"""
