"""``python -m coordinator.healthcheck``: exit 0 when the local coordinator's ``/healthz``
says ``ok``, 1 otherwise (one line on stdout says why). The container image's HEALTHCHECK;
the port comes from ``--port`` or env ``RMQ_METRICS_PORT`` (as for the coordinator)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request

__all__ = ["check", "main"]

# A healthy coordinator answers in milliseconds; Docker's own --timeout is the outer bound.
TIMEOUT_S = 3.0


def check(port: int, host: str = "127.0.0.1", timeout_s: float = TIMEOUT_S) -> tuple[bool, str]:
    """(healthy, one-line reason) from ``GET http://host:port/healthz``."""
    url = f"http://{host}:{port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            body = json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:  # 503 carries the JSON status too
        return False, f"{url}: HTTP {exc.code}"
    except (OSError, ValueError) as exc:
        return False, f"{url}: {exc}"
    status = body.get("status") if isinstance(body, dict) else None
    return status == "ok", f"{url}: {status}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m coordinator.healthcheck", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--port",
        type=int,
        default=os.environ.get("RMQ_METRICS_PORT"),
        help="metrics port of the coordinator (env RMQ_METRICS_PORT)",
    )
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args(argv)
    if args.port is None:
        print("no metrics port: pass --port or set RMQ_METRICS_PORT")
        return 1
    healthy, detail = check(args.port, args.host)
    print(detail)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
