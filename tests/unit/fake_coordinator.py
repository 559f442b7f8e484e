"""A stand-in for ``python -m coordinator`` that tests of the process helper run instead:
it logs the line the real one logs once up, then behaves as FAKE_COORDINATOR says
("obliging": exits 0 on SIGTERM; "stubborn": ignores SIGTERM; "failing": exits 1 at once)."""

from __future__ import annotations

import os
import signal
import sys
import threading

# Long enough for any test, short enough that a leaked process goes away on its own.
LIFETIME_S = 60.0


def main() -> int:
    mode = os.environ.get("FAKE_COORDINATOR", "obliging")
    print(f"args: {' '.join(sys.argv[1:])}", flush=True)
    if mode == "failing":
        print("coordinator stopped: broker unreachable", file=sys.stderr, flush=True)
        return 1
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    print("INFO coordinator.txn_service: transaction service fake-1 running (prefix x)", flush=True)
    if mode == "stubborn":
        threading.Event().wait(LIFETIME_S)
        return 0
    received = signal.sigtimedwait({signal.SIGTERM}, LIFETIME_S)
    print("coordinator stopped" if received else "never asked to stop", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
