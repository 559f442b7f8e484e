"""A producer process whose wall clock runs ahead or behind: Debian's libfaketime.

``FAKETIME_DONT_FAKE_MONOTONIC=1`` keeps the monotonic clock real, so librdkafka's timers
and Python's timeouts keep working; only ``time.time()`` (record timestamps, the product's
wall-clock deadlines) moves. Debian's 0.9.10 breaks absolute monotonic sleeps that way
(every ``time.sleep`` of Python 3.11+ fails with EINVAL), so the campaign's small fix
(``faketime_fix.c``, built by ``tools.sh ensure``) is preloaded in front of it.

- :func:`skewed_env` starts one process with a fixed offset (``"+120s"``, ``"-90s"``);
- :func:`clock_file_env` starts one whose offset is read from a file (re-read about every
  second), and :class:`ClockSkew` moves it during the run and back to ``+0`` on heal.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
from pathlib import Path

from tests.campaign.faultkit import Fault, ProcTarget

__all__ = ["ClockSkew", "clock_file_env", "faketime_available", "skewed_env"]

HERE = Path(__file__).resolve().parent
OFFSET = re.compile(r"[+-]\d+(\.\d+)?[smhd]?")


def _faketime_lib() -> str | None:
    found = sorted(
        glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1")
        + glob.glob("/usr/lib/faketime/libfaketimeMT.so.1")
    )
    return found[0] if found else None


def _fix_lib() -> str | None:
    proc = subprocess.run(
        [str(HERE / "tools.sh"), "fixlib"], capture_output=True, text=True, timeout=10
    )
    path = proc.stdout.strip()
    return path if path and os.path.exists(path) else None


def faketime_available() -> str | None:
    """None when a skewed process can be started, else why not (for a skip)."""
    if _faketime_lib() is None:
        return "Debian's faketime is not installed (tests/campaign/tools.sh ensure)"
    if _fix_lib() is None:
        return "the faketime fix is not built (tests/campaign/tools.sh ensure)"
    return None


def _preload(env: dict[str, str]) -> dict[str, str]:
    why = faketime_available()
    if why is not None:
        raise RuntimeError(why)
    libs = [_fix_lib(), _faketime_lib()]
    if env.get("LD_PRELOAD"):
        libs.append(env["LD_PRELOAD"])
    return {
        **env,
        "LD_PRELOAD": ":".join(str(lib) for lib in libs),
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }


def _checked(offset: str) -> str:
    if not OFFSET.fullmatch(offset):
        raise ValueError(f"clock offset {offset!r}: want e.g. '+120s', '-90s', '+2m'")
    # libfaketime reads a bare number as seconds and knows m/h/d, not 's'.
    return offset[:-1] if offset.endswith("s") else offset


def skewed_env(offset: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of one process whose wall clock is ``offset`` off (``"+120s"``)."""
    base = dict(os.environ if env is None else env)
    return {**_preload(base), "FAKETIME": _checked(offset)}


def clock_file_env(
    path: Path, offset: str = "+0", env: dict[str, str] | None = None
) -> dict[str, str]:
    """The environment of one process whose offset is read from ``path`` (written now with
    ``offset``); :class:`ClockSkew` changes it while the process runs."""
    Path(path).write_text(_checked(offset) + "\n")
    base = dict(os.environ if env is None else env)
    base.pop("FAKETIME", None)
    # Re-read when the second changes (libfaketime compares whole seconds).
    return {**_preload(base), "FAKETIME_TIMESTAMP_FILE": str(path), "FAKETIME_CACHE_DURATION": "0"}


class ClockSkew(Fault):
    """A producer's wall clock jumps ``offset`` ahead or behind (its faketime file), within
    about a second; heal puts it back to ``+0``."""

    kind = "clock_skew"

    def __init__(self, target: ProcTarget, offset: str = "+120s", seed: int | None = None) -> None:
        super().__init__(target.name, seed)
        if target.clock_file is None:
            raise ValueError(f"{target.name} has no clock_file: start it with clock_file_env")
        self.path = Path(target.clock_file)
        self.offset = _checked(offset)

    def _apply(self) -> None:
        self.detail["offset"] = self.offset
        self.path.write_text(self.offset + "\n")

    def _heal(self) -> None:
        self.path.write_text("+0\n")
