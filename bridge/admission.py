"""Whether the bridge takes on one more stream: asked before the request is stored, so a refusal
is an ordinary 503 with Retry-After and the streams already accepted keep their share.

Four limits:
- open streams, as measured: at most `StreamLimit.limit` at once, a number this bridge finds
  from its own delivery lag and event-loop lag (below), so that the defaults hold on any
  machine without an operator sizing them;
- open streams, as configured: at most `max_streams` at once (0: no cap), a ceiling;
- delivery running late: while frames reach this bridge more than `max_delivery_lag_s` (smoothed)
  after their worker published them, the bridge is not keeping up with the streams it holds.
  One more would make every one of them later; left to grow, the backlog passes nats-server's
  max_pending for this connection, the server cuts it off as a slow consumer and every open
  stream fails. The lag is read against the worker's clock, as `laneway_frame_lag_seconds` is.
- one tenant's open streams: at most `tenant_max_streams` of this bridge's (429: that tenant is
  over its share, not the bridge full), so one tenant's flood leaves room for the others.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass

from bridge.config import BridgeConfig
from bridge.demux import Demux
from bridge.errors import EdgeError
from bridge.metrics import BridgeMetrics
from core.looplag import LoopLag
from schemas.errors import ErrorCode


@dataclass(slots=True)
class StreamLimit:
    """How many streams this bridge holds at once, found as TCP finds its window (AIMD).

    Streams are long: one accepted too many keeps every other late until streams end, and a
    refusal costs a client one retry. So the limit rises slowly and only while it is what holds
    the bridge back (open streams near it) and delivery is on time (frame lag and the loop's own
    lag under `healthy_s`), and falls fast: by `cut` below the streams open once either lag
    passes `congested_s`, then waits `cooldown_s` to see the cut's effect before cutting again.
    Pure: the bridge feeds it measurements and a clock."""

    limit: float = 256.0
    floor: int = 32
    ceiling: int = 0                # 0: none (max_streams, when set, is one)
    # Smoothed lags: a mean of 10 ms keeps the p99 well under 100 ms; at 40 ms it is near it.
    healthy_s: float = 0.01
    congested_s: float = 0.04
    growth: float = 0.025           # per `tick_s` while healthy and binding: ~5 %/s
    cut: float = 0.8
    tick_s: float = 0.5
    cooldown_s: float = 2.0
    _ticked: float = float("-inf")
    _cut_at: float = float("-inf")

    def observe(self, now: float, *, open_streams: int, lag_s: float, loop_lag_s: float) -> int:
        """Update from what is measured now (at most once per tick); the limit to admit against."""
        if now - self._ticked >= self.tick_s:
            self._ticked = now
            worst = max(lag_s, loop_lag_s)
            if worst > self.congested_s:
                if now - self._cut_at >= self.cooldown_s:
                    self._cut_at = now
                    self.limit = max(float(self.floor), min(self.limit, open_streams) * self.cut)
            elif worst < self.healthy_s and open_streams >= 0.9 * self.limit:
                self.limit *= 1 + self.growth
                if self.ceiling:
                    self.limit = min(self.limit, float(self.ceiling))
        return int(self.limit)


class RetryAfter:
    """How long an `overloaded` refusal tells its client to wait, so that the clients being
    refused come back at about `budget` a second however many they are: a refusal costs the
    bridge a request's parsing, and thousands a second would take the CPU its streams need.
    The clients told to wait and not yet due are counted; each new one waits that many /
    `budget` seconds. Clients that honour Retry-After (the OpenAI SDKs do, up to 60 s) then cost
    the bridge about `budget` refusals a second, and a lone refusal waits `least_s`."""

    def __init__(self, budget: float = 200.0, least_s: int = 2, most_s: int = 30) -> None:
        self.budget = budget
        self.least_s = least_s
        self.most_s = most_s
        self._due: list[float] = []      # a heap: when each client told to wait comes back

    def refused(self, now: float) -> int:
        """Count one refusal now; the Retry-After to give it."""
        due = self._due
        while due and due[0] <= now:
            heapq.heappop(due)
        seconds = min(self.most_s, max(self.least_s, math.ceil(len(due) / self.budget)))
        heapq.heappush(due, now + seconds)
        return seconds


def admit(open_streams: int, lag_s: float, tenant_streams: int, *, max_streams: int, max_delivery_lag_s: float,
          tenant_max_streams: int, measured_limit: int = 0) -> None:
    """Raise `overloaded` (503, Retry-After) when the bridge must not take another stream, or
    `rate_limited` (429) when the tenant holds its share of them. `measured_limit` is
    `StreamLimit`'s (0: not measured)."""
    if tenant_max_streams and tenant_streams >= tenant_max_streams:
        raise EdgeError(ErrorCode.rate_limited, f"this tenant holds {tenant_max_streams} open streams on this "
                        "bridge, its limit; retry when one ends",
                        headers={"x-laneway-overload": "tenant_streams", "Retry-After": "1"})
    if max_streams and open_streams >= max_streams:
        raise EdgeError(ErrorCode.overloaded, f"this bridge holds {max_streams} open streams, its limit; "
                        "retry shortly", headers={"x-laneway-overload": "streams"})
    if measured_limit and open_streams >= measured_limit:
        raise EdgeError(ErrorCode.overloaded, f"this bridge holds {open_streams} open streams, what it can "
                        "deliver on time now; retry shortly", headers={"x-laneway-overload": "measured_streams"})
    if max_delivery_lag_s and lag_s > max_delivery_lag_s:
        raise EdgeError(ErrorCode.overloaded, f"this bridge is delivering tokens {lag_s * 1000:.0f} ms late "
                        f"(limit {max_delivery_lag_s * 1000:.0f} ms) and takes no new stream until it "
                        "catches up; retry shortly", headers={"x-laneway-overload": "delivery_lag"})


class EdgeAdmission:
    """The bridge's admission: the limits above over what it measures now (its open streams, its
    frames' lag, its loop's lag), asked once per request before its body is read."""

    def __init__(self, config: BridgeConfig, demux: Demux, loop_lag: LoopLag, metrics: BridgeMetrics) -> None:
        self.config = config
        self.demux = demux
        self.loop_lag = loop_lag
        self.limit = (StreamLimit(limit=float(config.initial_stream_limit), ceiling=config.max_streams)
                      if config.initial_stream_limit else None)
        self.retry_after = RetryAfter()
        # Read at scrape time, not written on every admission.
        metrics.loop_lag.set_function(loop_lag.current)
        if self.limit is not None:
            limit = self.limit
            metrics.stream_limit.set_function(lambda: int(limit.limit))

    def __call__(self, tenant: str) -> None:
        now = time.monotonic()
        open_streams, lag = len(self.demux), self.demux.lag.current(now)
        measured = 0
        if self.limit is not None:
            measured = self.limit.observe(now, open_streams=open_streams, lag_s=lag,
                                          loop_lag_s=self.loop_lag.current(now))
        try:
            admit(open_streams, lag, self.demux.held_by(tenant), max_streams=self.config.max_streams,
                  max_delivery_lag_s=self.config.max_delivery_lag_s,
                  tenant_max_streams=self.config.tenant_max_streams, measured_limit=measured)
        except EdgeError as refusal:
            if refusal.code is ErrorCode.overloaded:
                refusal.headers["Retry-After"] = str(self.retry_after.refused(now))
            raise
