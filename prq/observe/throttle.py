"""Keeping a log line that repeats from flooding the log: per key, the first occurrence in each
interval is let through, with how many were kept quiet since the last one let through.
Thread-safe (the blocking facade logs from several threads)."""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable

__all__ = ["LogThrottle"]


class LogThrottle:
    """Which occurrences of a repeated log line to write: the first of each key per `every_s`."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self._lock = threading.Lock()
        self._last: dict[Hashable, float] = {}
        self._quiet: dict[Hashable, int] = {}

    def admit(self, key: Hashable, count: int = 1) -> int | None:
        """None to stay quiet (the `count` things this occurrence is about are added to the
        quiet ones); else how many were kept quiet since the last one let through."""
        now = time.monotonic()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.every_s:
                self._quiet[key] = self._quiet.get(key, 0) + count
                return None
            self._last[key] = now
            return self._quiet.pop(key, 0)
