"""A wall clock for tests of minute and month windows (quotas): pinned at a known point, so a
test never straddles a window's edge by accident, yet running on as real time does."""

from __future__ import annotations

import time
from datetime import UTC, datetime

T0 = datetime(2026, 11, 10, 12, 0, 5, tzinfo=UTC).timestamp()  # 5 s into a minute


class Clock:
    """Wall time as if the test started at `T0`; `advance` jumps ahead (a minute, a month)."""

    def __init__(self, t: float = T0) -> None:
        self.t = t
        self._start = time.monotonic()

    def advance(self, seconds: float) -> None:
        self.t += seconds

    def set(self, t: float) -> None:
        self.t = t - (time.monotonic() - self._start)

    def __call__(self) -> float:
        return self.t + time.monotonic() - self._start

    @classmethod
    def early_in_this_minute(cls) -> Clock:
        """From 5 s into the current minute: its window's edge is 55 s away, and the jump back
        stays inside the window that leases taken on the real clock belong to (for a service
        already running, whose clock a test swaps)."""
        return cls(time.time() // 60 * 60 + 5)
