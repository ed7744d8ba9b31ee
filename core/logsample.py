"""A log line a flood could repeat without end, sampled: the first per key each interval, and
with it the count of those left out since the last one written.

What a sender controls (a malformed message, a refused request) must not decide how much the
log grows: one line per junk message turned 20,000 messages into 2.2 MB of broker log. Exact
counts belong in metrics; the log keeps an example and a tally. Keys are few and bounded (a
reason, never a tenant or a subject).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable


class SampledLog:
    def __init__(
        self, logger: logging.Logger, interval_s: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._log = logger
        self.interval_s = interval_s
        self._clock = clock
        self._last: dict[str, float] = {}  # key → when its last line was written
        self._left_out: dict[str, int] = {}  # key → lines left out since then

    def warning(self, key: str, message: str, *args: object) -> bool:
        """Write `message % args` at WARNING unless a line for `key` was written less than
        `interval_s` ago; then count it. True when it was written."""
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            self._left_out[key] = self._left_out.get(key, 0) + 1
            return False
        self._last[key] = now
        left_out = self._left_out.pop(key, 0)
        if left_out:  # lines were left out only after one was written: `last` is set
            assert last is not None
            message += " (and %d more like it in the last %.0f s, not logged)"
            args = (*args, left_out, now - last)
        self._log.warning(message, *args)
        return True
