"""The SimpleConsumer on the benchmarks page (issue 36): the ``simple`` case's rows in the
figures table (:mod:`.simple`), one per variant, and a note on where its time goes."""

from __future__ import annotations

from typing import Any

from benchmarks.page_text import TIMES, fig, median, ms, num, pcts, rate, whole

__all__ = ["simple_note", "simple_rows"]

VARIANTS = (
    ("simple_unordered", "records without a message group"),
    ("simple_fifo", "records of {groups} message groups (FIFO: one in flight per group)"),
)


def _variants(r: dict) -> list[tuple[str, dict]]:
    return [(label, r[key]) for key, label in VARIANTS if isinstance(r.get(key), dict)]


def simple_rows(r: dict) -> list[tuple[str, str, str, str]]:
    rows = []
    batch, count = r.get("simple_batch", "?"), num(r.get("simple_messages", "?"))
    for label, v in _variants(r):
        rows.append(
            (
                "simple",
                f"SimpleConsumer, `receive({batch})` then an `ack` of each until {count} "
                f"{label.format(groups=v.get('groups', '?'))} are acked, against the plain "
                f"consumer on the same topic (batches of {batch}, offsets stored after)",
                f"{fig(v.get('simple_msgs_per_s'), rate, '/s')} against "
                f"{fig(v.get('plain_msgs_per_s'), rate, '/s')}: "
                f"{fig(v.get('ratio'), lambda x: f'{x:.3f}', TIMES)}; one `receive({batch})` "
                f"{pcts(v.get('receive_ms'), ('p50', 'p99'))}, one `ack` p50 "
                f"{fig((v.get('ack_us') or {}).get('p50'), ms, ' µs')}",
                "",
            )
        )
    return rows


def _per_msg_us(f: Any) -> float | None:
    value = median(f)
    return 1e6 / value if value else None


def _us(v: float | None) -> str:
    return "?" if v is None else f"{v:.2f}" if v < 10 else f"{v:.0f}"


def simple_note(r: dict) -> list[str]:
    variants = _variants(r)
    if not variants:
        return []  # a results file from before the case
    v = variants[0][1]
    batch = r.get("simple_batch", "?")
    simple_us = _per_msg_us(v.get("simple_msgs_per_s"))
    p50 = median((v.get("receive_ms") or {}).get("p50"))
    receive_us = None if p50 is None or not isinstance(batch, int) else p50 * 1000 / batch
    share = "" if receive_us is None or not simple_us else f", {receive_us / simple_us:.0%} of it"
    ack = median((v.get("ack_us") or {}).get("p50"))
    return [
        f"The SimpleConsumer's rows: a record takes the SimpleConsumer about "
        f"{_us(simple_us)} µs, the plain consumer {_us(_per_msg_us(v.get('plain_msgs_per_s')))} "
        f"µs (the inverse of the median rates above, records without a group). A `receive` "
        f"makes one synchronous offset commit before it hands its batch out (the offsets, "
        f"the done records and the new leases of its partitions, so that a delivery's attempt "
        f"and deadline outlive the instance: one round trip to the group coordinator per "
        f"batch) besides the engine's bookkeeping and a `MessageView` per record: at its p50 "
        f"{_us(receive_us)} µs a record{share}. An `ack` ({_us(ack)} µs at its p50) is in "
        f"memory, under the consumer's lock, and travels with the next commit. The plain "
        f"consumer hands over librdkafka's messages and stores a batch's offsets for the next "
        f"asynchronous auto commit. The FIFO variant hands out at most one message of a group "
        f"at a time ({r.get('simple_fifo', {}).get('groups', '?')} groups). No message was "
        f"delivered twice in these runs (redeliveries: "
        f"{', '.join(fig(x.get('redelivered'), whole) for _, x in variants)}).",
        "",
    ]
