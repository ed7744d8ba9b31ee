"""How late this process's event loop runs: a ticker sleeps `interval_s` and records how much
later than asked it woke. A loop starved of CPU (other processes, or its own backlog) wakes
late; an idle one on time. The bridge sizes its admission with it, and a worker reports it in
its heartbeat, so that a busy process is told apart from a dead one."""

from __future__ import annotations

import time
from collections import deque

from core.tasks import pause


class LoopLag:
    def __init__(self, interval_s: float = 0.05, window_s: float = 2.0) -> None:
        self.interval_s = interval_s
        self.window_s = window_s
        self._late: deque[tuple[float, float]] = deque()  # (woke at, seconds late), monotonic
        self._sum = 0.0  # of the lateness in `_late`

    async def run(self) -> None:
        """Tick until cancelled."""
        while True:
            asked = time.monotonic() + self.interval_s
            await pause(self.interval_s)
            now = time.monotonic()
            self.observe(now, max(0.0, now - asked))

    def observe(self, now: float, late_s: float) -> None:
        self._late.append((now, late_s))
        self._sum += late_s
        while now - self._late[0][0] > self.window_s:
            self._sum -= self._late.popleft()[1]

    def current(self, now: float | None = None) -> float:
        """The mean lateness over the last window of ticks (one collector pause is not a starved
        loop), or the tick overdue right now if that is later. O(1): asked on every admission."""
        if not self._late:
            return 0.0
        now = time.monotonic() if now is None else now
        overdue = now - self._late[-1][0] - self.interval_s
        return max(self._sum / len(self._late), overdue, 0.0)
