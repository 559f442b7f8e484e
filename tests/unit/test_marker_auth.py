"""Authenticated Op markers without a broker: signing and verifying (coordinator/marker_auth.py),
where the key comes from (coordinator/marker_keys.py), and the settings that carry it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.marker_auth import MarkerKey, MarkerVerifier, Verdict, canonical, is_marker
from coordinator.marker_keys import _parse, configured_key, security_on
from coordinator.server import Server
from coordinator.settings import CoordinatorSettings
from rmq_semantics.cli import build_parser
from rmq_semantics.errors import ConfigError
from rmq_semantics.records.codec import decode, encode
from rmq_semantics.records.txn import (
    CheckMarker,
    DoneEntry,
    DoneMarker,
    DoneMarkers,
    EndRequest,
    EndState,
    Outcome,
)
from rmq_semantics.settings import load

ROOT = Path(__file__).resolve().parents[2]
OP = "__rmq_op"
KEY = MarkerKey(b"k" * 32)
T = 1_700_000_000_000
DONE = DoneMarkers(
    (DoneEntry(5, "t5", Outcome.COMMITTED, 0), DoneEntry(7, "t7", Outcome.ROLLED_BACK, 1)), T
)
CHECK = CheckMarker(6, "t6", 2, 1, 1, T + 60000, T)
PLAINTEXT = {"bootstrap.servers": "127.0.0.1:1"}
SASL = {**PLAINTEXT, "security.protocol": "SASL_SSL"}


def verifier(watermarks: dict[int, int] | None = None) -> MarkerVerifier:
    return MarkerVerifier(KEY, OP, watermarks or {})


# -- sign and verify ---------------------------------------------------------------------
@pytest.mark.parametrize("record", [DONE, CHECK], ids=lambda r: type(r).__name__)
def test_a_signed_marker_verifies_after_the_wire_round_trip(record):
    signed = decode(encode(KEY.sign(OP, 3, record)))
    assert len(signed.mac) == 32
    assert verifier().verdict(3, 100, signed) is Verdict.SIGNED
    assert Verdict.SIGNED.accepted


@pytest.mark.parametrize(
    "tamper",
    [
        lambda r: dataclasses.replace(r, entries=(DoneEntry(5, "t5", Outcome.COMMITTED, 0),)),
        lambda r: dataclasses.replace(
            r, entries=(DoneEntry(9, "t5", Outcome.COMMITTED, 0), r.entries[1])
        ),
        lambda r: dataclasses.replace(
            r, entries=(DoneEntry(5, "t5", Outcome.DISCARDED, 0), r.entries[1])
        ),
        lambda r: dataclasses.replace(r, ts=r.ts + 1),
    ],
    ids=["entry dropped", "offset changed", "outcome changed", "ts changed"],
)
def test_a_tampered_body_does_not_verify(tamper):
    signed = KEY.sign(OP, 3, DONE)
    assert verifier().verdict(3, 100, tamper(signed)) is Verdict.BAD_MAC


def test_a_tampered_check_marker_does_not_verify():
    signed = KEY.sign(OP, 3, CHECK)
    later = dataclasses.replace(signed, next_check_ts=signed.next_check_ts + 86_400_000)
    assert verifier().verdict(3, 100, later) is Verdict.BAD_MAC


def test_a_marker_signed_with_another_key_does_not_verify():
    forged = MarkerKey(b"x" * 32).sign(OP, 3, DONE)
    assert verifier().verdict(3, 100, forged) is Verdict.BAD_MAC
    assert not Verdict.BAD_MAC.accepted


def test_a_signed_marker_copied_to_another_partition_or_prefix_does_not_verify():
    signed = KEY.sign(OP, 3, DONE)
    assert verifier().verdict(4, 100, signed) is Verdict.BAD_MAC
    assert MarkerVerifier(KEY, "other_op", {}).verdict(3, 100, signed) is Verdict.BAD_MAC


def test_below_the_watermark_history_is_read_as_written_whatever_its_mac():
    """Markers from before the first start with this key: unsigned (older versions) or
    signed with the key the coordinators had before (rotation), they count as they did."""
    old_key = MarkerKey(b"o" * 32).sign(OP, 3, DONE)
    garbage = dataclasses.replace(DONE, mac=b"\x00" * 5)
    judge = verifier({3: 1000})
    assert judge.verdict(3, 999, old_key) is Verdict.LEGACY
    assert judge.verdict(3, 999, garbage) is Verdict.LEGACY
    assert judge.verdict(3, 1000, garbage) is Verdict.BAD_MAC


@pytest.mark.parametrize(
    "record",
    [DONE, CHECK, DoneMarker(5, "t5", Outcome.COMMITTED, 0, T)],
    ids=lambda r: type(r).__name__,
)
def test_an_unsigned_marker_counts_only_below_its_partitions_watermark(record):
    judge = verifier({3: 100})
    assert judge.verdict(3, 99, record) is Verdict.LEGACY and Verdict.LEGACY.accepted
    assert judge.verdict(3, 100, record) is Verdict.UNSIGNED
    assert judge.verdict(3, 5000, record) is Verdict.UNSIGNED
    assert judge.verdict(2, 0, record) is Verdict.UNSIGNED  # no watermark: trusts none
    assert not Verdict.UNSIGNED.accepted


def test_only_markers_are_judged_and_only_v2_types_are_signed():
    end = EndRequest("t", "pg", 0, 1, EndState.COMMIT, False, 0, T)
    assert not is_marker(end) and KEY.sign(OP, 0, end) is end
    legacy = DoneMarker(5, "t5", Outcome.COMMITTED, 0, T)
    assert is_marker(legacy) and KEY.sign(OP, 0, legacy) is legacy
    assert is_marker(DONE) and is_marker(CHECK)


def test_canonical_bytes_leave_out_the_mac_and_name_type_and_place():
    signed = KEY.sign(OP, 3, DONE)
    assert canonical(OP, 3, signed) == canonical(OP, 3, DONE)
    assert canonical(OP, 3, DONE) != canonical(OP, 4, DONE)
    assert b"DoneMarkers" in canonical(OP, 3, DONE)


def test_the_key_is_never_shown_and_must_be_long_enough():
    secret = b"super-secret-key-material-0123456789"
    key = MarkerKey(secret)
    assert secret.decode() not in repr(key) and secret.decode() not in str(key)
    assert key == MarkerKey(secret) and key != MarkerKey(b"y" * 32)
    assert (
        key.fingerprint() == MarkerKey(secret).fingerprint() != MarkerKey(b"y" * 32).fingerprint()
    )
    with pytest.raises(ConfigError, match="at least 16 bytes"):
        MarkerKey(b"short")


# -- where the key comes from --------------------------------------------------------------
def test_the_key_comes_from_the_setting_env_or_a_file(tmp_path):
    assert configured_key(CoordinatorSettings(marker_key="k" * 32), SASL) == KEY
    env = load(CoordinatorSettings, {}, env={"RMQ_MARKER_KEY": "k" * 32})
    assert configured_key(env, SASL) == KEY
    path = tmp_path / "marker.key"
    path.write_bytes(b"k" * 32 + b"\n")
    from_file = load(CoordinatorSettings, {}, env={"RMQ_MARKER_KEY_FILE": str(path)})
    assert configured_key(from_file, SASL) == KEY
    args = build_parser().parse_args(
        ["coordinator", "--bootstrap-servers", "b:1", "--marker-key-file", str(path)]
    )
    assert configured_key(load(CoordinatorSettings, args, env={}), SASL) == KEY


def test_no_key_is_fine_with_security_off_and_refused_with_it_on():
    assert configured_key(CoordinatorSettings(), PLAINTEXT) is None
    assert (
        configured_key(CoordinatorSettings(), {**PLAINTEXT, "security.protocol": "plaintext"})
        is None
    )
    assert not security_on(PLAINTEXT) and security_on(SASL)
    with pytest.raises(
        ConfigError,
        match=r"security is on \(security.protocol=SASL_SSL\).*"
        r"RMQ_MARKER_KEY.*--marker-key-file",
    ):
        configured_key(CoordinatorSettings(), SASL)
    with pytest.raises(ConfigError, match="no marker key"):
        Server(SASL)  # before any I/O


def test_bad_key_settings_are_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="not both"):
        CoordinatorSettings(marker_key="k" * 32, marker_key_file="/some/file")
    with pytest.raises(ConfigError, match="cannot read it"):
        configured_key(CoordinatorSettings(marker_key_file=str(tmp_path / "missing")), SASL)
    with pytest.raises(ConfigError, match="at least 16 bytes"):
        configured_key(CoordinatorSettings(marker_key="short"), SASL)


def test_the_raw_key_is_no_cli_flag_and_never_in_the_settings_repr(capsys):
    settings = CoordinatorSettings(marker_key="k" * 32)
    assert "k" * 32 not in repr(settings)
    parser = build_parser()
    for argv in (["--marker-key", "the-secret"], ["--marker-key=the-secret"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["coordinator", "--bootstrap-servers", "b:1", *argv])
        err = capsys.readouterr().err
        assert "set env RMQ_MARKER_KEY instead" in err and "the-secret" not in err
    with pytest.raises(SystemExit):
        parser.parse_args(["coordinator", "--help"])
    usage = capsys.readouterr().out
    assert "--marker-key-file" in usage and "--marker-key " not in usage


def test_the_coordinator_with_security_on_and_no_key_refuses_to_start_with_one_line():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "coordinator",
            "--bootstrap-servers",
            "127.0.0.1:1",
            "--kafka-option",
            "security.protocol=SASL_PLAINTEXT",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={"PATH": "", "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no marker key" in lines[0], proc.stderr


@pytest.mark.parametrize(
    "value, ok",
    [
        (b'{"v":1,"kind":"key","key":"abc"}', True),
        (b'{"v":1,"kind":"fingerprint","fingerprint":"ab"}', True),
        (b'{"v":1,"kind":"watermark","partition":0,"offset":5}', True),
        (b'{"v":1,"kind":"watermark","partition":"0","offset":5}', False),
        (b'{"v":2,"kind":"key","key":"abc"}', False),
        (b'{"v":1,"kind":"other"}', False),
        (b"[1]", False),
        (b"\xff", False),
        (None, False),
    ],
)
def test_only_well_formed_keys_records_are_read(value, ok):
    assert (_parse(value) is not None) is ok
