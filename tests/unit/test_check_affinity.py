"""Check affinity without a broker: the headers a producer instance writes, their parse (an
odd value is a malformed record), and where the coordinator writes the check."""

from __future__ import annotations

import pytest

from coordinator.promote import _check_destination
from rmq_semantics.errors import MalformedRecordError
from rmq_semantics.records.half import affinity_headers, parse_half
from rmq_semantics.records.headers import H

BASE = [(H.TXN_ID, b"t1"), (H.REAL_TOPIC, b"orders"), (H.PRODUCER_GROUP, b"pg"), (H.BORN_TS, b"1")]


def half(extra):
    return parse_half(0, 7, 1, None, b"v", BASE + list(extra))


def test_an_instance_names_itself_and_the_partitions_it_holds_or_nothing():
    assert affinity_headers("A", (1, 3)) == [(H.CHECK_AFFINITY, b"A"), (H.CHECK_PARTITIONS, b"1,3")]
    assert affinity_headers("A", ()) == []  # holds nothing yet: spread
    parsed = half(affinity_headers("A", (1, 3)))
    assert (parsed.check_affinity, parsed.check_partitions) == ("A", (1, 3))
    assert half([]).check_partitions == ()


@pytest.mark.parametrize(
    "raw", [b"-1", b"1,,2", b"a", b"1;2", b" 1", b"99999999999", b"0," * 300 + b"0", b"\xff"]
)
def test_odd_check_partitions_make_the_record_malformed(raw):
    with pytest.raises(MalformedRecordError, match="check_partitions"):
        half([(H.CHECK_PARTITIONS, raw)])


@pytest.mark.parametrize("raw", [b"x" * 129, b"id\x00", b"caf\xc3\xa9"])
def test_an_odd_instance_id_makes_the_record_malformed(raw):
    with pytest.raises(MalformedRecordError, match="check_affinity"):
        half([(H.CHECK_AFFINITY, raw)])


def test_a_check_goes_to_a_partition_the_instance_held_else_by_transaction_id():
    held = half(affinity_headers("A", (1, 3)))
    assert _check_destination(held, 4) in ({"partition": 1}, {"partition": 3})
    spread = {
        _check_destination(half([*affinity_headers("A", (1, 3)), (H.TXN_ID, t)]), 4)["partition"]
        for t in (b"a", b"b", b"c", b"d", b"e", b"f", b"g", b"h")
    }
    assert spread == {1, 3}  # chosen by transaction id among them
    assert _check_destination(half([]), 4) == {"key": b"t1"}
    # A partition the check topic lacks (a forged or stale header) is never written to.
    assert _check_destination(half(affinity_headers("A", (9,))), 4) == {"key": b"t1"}
