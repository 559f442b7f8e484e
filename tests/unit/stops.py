"""A stop flag for tests of loops that pause on it."""

from __future__ import annotations

import threading


class RecordingStop(threading.Event):
    """A stop flag whose waits return at once and are recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout or 0.0)
        return self.is_set()
