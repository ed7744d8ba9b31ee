"""How late token frames reach this bridge: each frame's lag is the bridge's clock minus its
worker's at publishing, so it holds the two hosts' clock offset and the path's own time as well as
the queueing admission cares about. The smoothed lag is what the bridge's limits read; the floor,
the least lag a frame had lately, is the part that no queue adds (bridge/generate/admission.py)."""

from __future__ import annotations

LAG_WEIGHT = 0.1  # each frame's share of the smoothed lag: one late frame is not a trend
LAG_FRESH_S = 1.0  # a smoothed lag older than this (no frames since) says nothing about now
FLOOR_WINDOW_S = 30.0  # the floor is the least lag of the last 30-60 s: clocks drift slowly


class DeliveryLag:
    """Frame lag, smoothed over frames (an exponentially weighted mean), and its floor; times are
    monotonic."""

    __slots__ = ("smoothed_s", "_at", "_least", "_least_before", "_window_at")

    def __init__(self) -> None:
        self.smoothed_s = 0.0
        self._at = float("-inf")
        self._least = float("inf")  # of this window
        self._least_before = float("inf")  # of the window before it
        self._window_at = float("-inf")

    def observe(self, lag_s: float, now: float) -> None:
        if now - self._at > LAG_FRESH_S:
            self.smoothed_s = lag_s
        else:
            self.smoothed_s += LAG_WEIGHT * (lag_s - self.smoothed_s)
        self._at = now
        if now - self._window_at >= FLOOR_WINDOW_S:
            self._least_before, self._least, self._window_at = self._least, lag_s, now
        elif lag_s < self._least:
            self._least = lag_s

    def current(self, now: float) -> float:
        """The smoothed lag; 0 when no frame arrived lately (nothing is waiting on delivery)."""
        return self.smoothed_s if now - self._at <= LAG_FRESH_S else 0.0

    def floor(self) -> float:
        """The least lag a frame had in the last 30-60 s (0 before any): the clocks' offset and
        the path's own time, which no queue of this bridge's adds to."""
        least = min(self._least, self._least_before)
        return 0.0 if least == float("inf") else least

    def queued(self, now: float) -> float:
        """The smoothed lag over its floor: how late frames run for this bridge's queues, whatever
        the hosts' clocks read against each other."""
        return max(0.0, self.current(now) - self.floor())
