"""Whether the bridge takes on one more stream: asked before the request is stored, so a refusal
is an ordinary 503 with Retry-After and the streams already accepted keep their share.

The limits:
- open streams, as measured: at most `StreamLimit.limit` at once, a number this bridge finds
  from its own delivery lag and event-loop lag (below), so that the defaults hold on any
  machine without an operator sizing them;
- open streams, as configured: at most `max_streams` at once (0: no cap), a ceiling;
- order at this door (DESIGN.md, "Order before the lanes"): of the binding one of those two
  limits, a class and the classes after it (rank ≥ its rank) may hold its `max_slot_share`
  (`ClassPolicy.slot_cap`, as a worker's slots), and one tenant, while others want them, a share
  (`tenant_stream_share`) of what its class may fill. See `admit`.
- delivery running late: while frames reach this bridge more than `max_delivery_lag_s` (smoothed)
  after their worker published them, the bridge is not keeping up with the streams it holds.
  One more would make every one of them later; left to grow, the backlog passes nats-server's
  max_pending for this connection, the server cuts it off as a slow consumer and every open
  stream fails. The lag is read against the worker's clock, as `laneway_frame_lag_seconds` is.
  It is the bridge's health, not a share: every class is refused alike.
- one tenant's open streams: at most `tenant_max_streams` of this bridge's (429: that tenant is
  over its configured cap, not the bridge full).
- a lower class yields delivery: while a higher class streams, the classes under it count
  against a measured limit of their own, found as the first but on time at `lower_class_lag_s`
  (2.5 ms) rather than 10 ms over the least lag of the last half minute (the hosts' clock
  offset and the path's own time, `DeliveryLag.floor`), and easing off while late at all, so
  that it settles where the lag is on time rather than anywhere short of congested. A chat's
  frames share this bridge's one event loop with every other stream's: at the lag the first
  limit settles at, a chat beside a flood of 250 standard streams met its first token 40-60 ms
  late, its engine time unchanged.
  See `EdgeAdmission`.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from bridge.config import BridgeConfig
from bridge.errors import EdgeError
from bridge.metrics import BridgeMetrics
from bridge.streams.demux import Demux
from core.looplag import LoopLag
from core.policy.classes import ClassPolicy
from schemas.errors import ErrorCode


@dataclass(slots=True)
class StreamLimit:
    """How many streams this bridge holds at once, found as TCP finds its window (AIMD).

    Streams are long: one accepted too many keeps every other late until streams end, and a
    refusal costs a client one retry. So the limit rises slowly and only while it is what holds
    the bridge back and delivery is on time (frame lag and the loop's own lag under `healthy_s`),
    and falls fast: by `cut` below the streams open once either lag passes `congested_s`, then
    waits `cooldown_s` to see the cut's effect before cutting again.

    "What holds the bridge back" is a refusal by this limit since the last tick (`refused`), not
    open streams near it: a class or a tenant is refused at a share of the limit (`admit`), so
    a flood of batch from one tenant is held at 0.81 of it, and a limit that grew only near
    full would never grow under the flood it turns away.
    Pure: the bridge feeds it measurements and a clock."""

    limit: float = 256.0
    floor: int = 32
    ceiling: int = 0  # 0: none (max_streams, when set, is one)
    # Smoothed lags: a mean of 10 ms keeps the p99 well under 100 ms; at 40 ms it is near it.
    healthy_s: float = 0.01
    congested_s: float = 0.04
    growth: float = 0.025  # per `tick_s` while healthy and binding: ~5 %/s
    cut: float = 0.8
    # Per `tick_s` while late but not congested (0: hold there). Holding, the limit settles
    # anywhere between the two lags, as it stood when the lag crossed `healthy_s`; easing off,
    # it settles where the lag is `healthy_s`, wherever it started.
    ease: float = 0.0
    tick_s: float = 0.5
    cooldown_s: float = 2.0
    _ticked: float = float("-inf")
    _cut_at: float = float("-inf")
    _binding: bool = False  # a request was refused by this limit since the last tick

    def refused(self) -> None:
        """This limit (or a class's or a tenant's share of it) refused a request: it binds."""
        self._binding = True

    def observe(self, now: float, *, open_streams: int, lag_s: float, loop_lag_s: float) -> int:
        """Update from what is measured now (at most once per tick); the limit to admit against."""
        if now - self._ticked >= self.tick_s:
            self._ticked = now
            binding, self._binding = self._binding, False
            worst = max(lag_s, loop_lag_s)
            if worst > self.congested_s:
                if now - self._cut_at >= self.cooldown_s:
                    self._cut_at = now
                    self.limit = max(float(self.floor), min(self.limit, open_streams) * self.cut)
            elif worst < self.healthy_s:
                if binding:
                    self.limit *= 1 + self.growth
                    if self.ceiling:
                        self.limit = min(self.limit, float(self.ceiling))
            elif self.ease:
                self.limit = max(float(self.floor), min(self.limit, open_streams) * (1 - self.ease))
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
        self._due: list[float] = []  # a heap: when each client told to wait comes back

    def refused(self, now: float) -> int:
        """Count one refusal now; the Retry-After to give it."""
        due = self._due
        while due and due[0] <= now:
            heapq.heappop(due)
        seconds = min(self.most_s, max(self.least_s, math.ceil(len(due) / self.budget)))
        heapq.heappush(due, now + seconds)
        return seconds


STREAMS = "streams"  # x-laneway-overload: refused by --max-streams (or a share of it)
MEASURED = "measured_streams"  # … by the measured limit (or a share of it)
OVERLOAD_HEADER = "x-laneway-overload"
# A class with a stream open, or asking for one, this recently is streaming. As long as a lower
# class's stream lives (seconds to minutes), not as a gap between two chats: a stream admitted in
# a gap is still open when the next chat comes. At 2 s, a Poisson 2/s chat's gaps let a retry
# storm take the first limit's room (99 -> 176 streams in a second) and the chats after met it.
STREAMING_S = 30.0


@dataclass(frozen=True, slots=True)
class Held:
    """The open streams a request of one class counts against at this bridge."""

    total: int = 0  # every open stream
    below: int = 0  # of its class and the classes after it (rank ≥ its rank): those it competes with
    in_class: int = 0  # of its class (part of `below`)
    sharing: int = 0  # tenants holding streams of its class
    tenant: int = 0  # its tenant's, of every class
    tenant_in_class: int = 0  # its tenant's, of its class


def fair_from(room: int, tenant_share: float) -> int:
    """Where a class's room turns contested: one tenant alone may hold this many of it, and the
    rest (`1 - tenant_share` of the room, rounded down) is kept for the other tenants. A room
    too small to spare a whole stream spares none (`room`: fairness off at this size)."""
    return room - int(room * (1.0 - tenant_share) + 1e-9)


def admit(
    held: Held,
    lag_s: float,
    policy: ClassPolicy,
    *,
    max_streams: int,
    max_delivery_lag_s: float,
    tenant_max_streams: int,
    measured_limit: int = 0,
    tenant_share: float = 1.0,
    lower: ClassPolicy | None = None,
) -> None:
    """Raise `overloaded` (503, Retry-After) when the bridge must not take another stream of this
    class from this tenant, or `rate_limited` (429) when the tenant holds its configured cap.
    `measured_limit` is `StreamLimit`'s (0: not measured); `lower`, of the classes after this
    one, the one with the largest share (None: it is the last).

    Order at this door, of `limit` (the lower of the configured and the measured limits):
    - every stream counts against `limit`, the classes after this one's no more than they may
      fill (`lower.slot_cap(limit)`): when the measured limit is cut below what a flood holds
      (its streams are accepted work, never preempted), the flood's excess must not refuse the
      classes above it until its streams end. A chat still finds the headroom no lower class
      may take; the bridge then holds more than `limit` by that headroom at most;
    - a class's `room` is `policy.slot_cap(limit)`, shared with the classes after it: batch at
      0.9 holds at most 90 % with standard, and the last 10 % only standard (at 0.95) and
      interactive (1.0) can take. A lower class is refused first, and a chat finds room at once
      while a flood of batch holds the bridge. The room kept is what higher classes may take
      before any stream ends: nothing is preempted (a stream is accepted work), so headroom is
      the one way a newcomer finds room now, as at a worker's slots;
    - tenants share a class fairly. What the class may fill is its room less the streams of the
      other classes it shares the room with (`below - in_class`); past `fair_from` of that (0.9)
      a tenant is refused that holds that much of the class itself, or more than its equal share
      of the class's streams (`in_class / sharing`, itself counted among the tenants sharing).
      So a flood leaves room another tenant takes at once, and as the flood's streams end the
      others take theirs too, until the tenants there hold about equal shares. A fixed cap per
      tenant would leave a second tenant the 10 % forever: the flood, with thousands of clients
      retrying, wins every stream that ends. In the contested top a tenant at its equal share is
      admitted, so tenants that all want more fill the room instead of refusing each other short
      of it. Shares are per class, not over the classes after it too: a tenant's own batch flood
      never counts against its chat (as at the gate, where a chat behind its own tenant's flood
      is the next one through), and the rooms above already keep the classes in order.
    A refusal by any share of `limit` is a refusal by that limit (`x-laneway-overload` names which)."""
    if tenant_max_streams and held.tenant >= tenant_max_streams:
        raise EdgeError(
            ErrorCode.rate_limited,
            f"this tenant holds {tenant_max_streams} open streams on this bridge, its limit; retry when one ends",
            headers={OVERLOAD_HEADER: "tenant_streams", "Retry-After": "1"},
        )
    if max_streams and (not measured_limit or max_streams <= measured_limit):
        limit, kind, what = max_streams, STREAMS, "its limit"
    else:
        limit, kind, what = measured_limit, MEASURED, "what it can deliver on time now"
    if limit:
        held = _lower_counted_to_their_room(held, lower, limit)
        if held.total >= limit:
            raise EdgeError(
                ErrorCode.overloaded,
                f"this bridge holds {held.total} open streams, {what} ({limit}); retry shortly",
                headers={OVERLOAD_HEADER: kind},
            )
        room = policy.slot_cap(limit)
        if held.below >= room:
            raise EdgeError(
                ErrorCode.overloaded,
                f"class {policy.name!r} and the classes after it hold {held.below} "
                f"open streams on this bridge, their share of its {limit}; the rest is kept for "
                "higher classes; retry shortly",
                headers={OVERLOAD_HEADER: kind},
            )
        fair = fair_from(room - (held.below - held.in_class), tenant_share)
        sharing = held.sharing + (0 if held.tenant_in_class else 1)
        mine = held.tenant_in_class
        if held.in_class >= fair and (mine >= fair or mine * sharing > held.in_class):
            raise EdgeError(
                ErrorCode.overloaded,
                f"this tenant holds {mine} of the {held.in_class} open streams "
                f"of class {policy.name!r} on this bridge, over its share while other tenants want "
                "them; retry shortly",
                headers={OVERLOAD_HEADER: kind},
            )
    if max_delivery_lag_s and lag_s > max_delivery_lag_s:
        raise EdgeError(
            ErrorCode.overloaded,
            f"this bridge is delivering tokens {lag_s * 1000:.0f} ms late "
            f"(limit {max_delivery_lag_s * 1000:.0f} ms) and takes no new stream until it "
            "catches up; retry shortly",
            headers={OVERLOAD_HEADER: "delivery_lag"},
        )


def _lower_counted_to_their_room(held: Held, lower: ClassPolicy | None, limit: int) -> Held:
    """`held` with the streams of the classes after the asking one counted up to what they may
    fill of `limit` (the largest room among them, `lower`'s), as a request of a higher class sees
    them."""
    after = held.below - held.in_class
    if lower is None or after <= (room := lower.slot_cap(limit)):
        return held
    return replace(held, total=held.total - after + room, below=held.in_class + room)


class EdgeAdmission:
    """The bridge's admission: the limits above over what it measures now (its open streams by
    class and tenant, its frames' lag, its loop's lag), asked once per request before its body is
    read. `rank` gives a class's rank (the catalogue's: an unknown class counts as the last);
    `classes`, the live classes (the catalogue's, read at each request)."""

    def __init__(
        self,
        config: BridgeConfig,
        demux: Demux,
        loop_lag: LoopLag,
        metrics: BridgeMetrics,
        rank: Callable[[str], int],
        classes: Mapping[str, ClassPolicy],
    ) -> None:
        self.config = config
        self.demux = demux
        self.loop_lag = loop_lag
        self.rank = rank
        self.classes = classes
        self.limit = (
            StreamLimit(limit=float(config.initial_stream_limit), ceiling=config.max_streams)
            if config.initial_stream_limit
            else None
        )
        # The lower classes' limit while a higher one streams: measured all along, so that it is
        # what the lag allows the moment a chat arrives, not what it allowed before the flood.
        self.lower_limit = (
            StreamLimit(
                limit=float(config.initial_stream_limit),
                ceiling=config.max_streams,
                healthy_s=config.lower_class_lag_s,
                congested_s=3 * config.lower_class_lag_s,
                ease=0.025,
            )
            if config.initial_stream_limit and config.lower_class_lag_s
            else None
        )
        self._streaming: dict[int, float] = {}  # a class's rank → when it last streamed (monotonic)
        self.retry_after = RetryAfter()
        # Read at scrape time, not written on every admission.
        metrics.loop_lag.set_function(loop_lag.current)
        if self.limit is not None:
            limit = self.limit
            metrics.stream_limit.set_function(lambda: int(limit.limit))
        if self.lower_limit is not None:
            lower = self.lower_limit
            metrics.lower_stream_limit.set_function(lambda: int(lower.limit))

    def held(self, tenant: str, policy: ClassPolicy) -> Held:
        """What a request of `policy`'s class from `tenant` counts against now: a few dict reads
        (one per class in use), not a walk over the streams."""
        demux, klass = self.demux, policy.name
        by_class = demux.by_class()
        return Held(
            total=len(demux),
            below=sum(n for name, n in by_class.items() if self.rank(name) >= policy.rank),
            in_class=by_class.get(klass, 0),
            sharing=demux.holders(klass),
            tenant=demux.held_by(tenant),
            tenant_in_class=demux.classes_of(tenant).get(klass, 0),
        )

    def lower(self, policy: ClassPolicy) -> ClassPolicy | None:
        """Of the classes after `policy`, the one that may fill the most (its headroom's bound)."""
        after = [p for p in self.classes.values() if p.rank > policy.rank]
        return max(after, key=lambda p: p.max_slot_share, default=None)

    def under_a_higher_class(self, policy: ClassPolicy, now: float) -> bool:
        """Whether a class ranked above `policy`'s streams here now, or did within `STREAMING_S`
        (a chat's streams are short and come one after another: between two it still streams)."""
        streaming = self._streaming
        streaming[policy.rank] = now
        for name, n in self.demux.by_class().items():
            if n:
                streaming[self.rank(name)] = now
        return any(rank < policy.rank and now - at <= STREAMING_S for rank, at in streaming.items())

    def __call__(self, tenant: str, policy: ClassPolicy) -> None:
        now = time.monotonic()
        lag = self.demux.lag.current(now)
        measured, measuring = 0, self.limit
        if self.limit is not None:
            streams, loop_lag = len(self.demux), self.loop_lag.current(now)
            measured = self.limit.observe(now, open_streams=streams, lag_s=lag, loop_lag_s=loop_lag)
            if self.lower_limit is not None:
                # Over the lag's floor: a clock offset between hosts is no reason to take fewer.
                queued = self.demux.lag.queued(now)
                lower = self.lower_limit.observe(now, open_streams=streams, lag_s=queued, loop_lag_s=loop_lag)
                if self.under_a_higher_class(policy, now) and lower < measured:
                    measured, measuring = lower, self.lower_limit
        try:
            admit(
                self.held(tenant, policy),
                lag,
                policy,
                max_streams=self.config.max_streams,
                max_delivery_lag_s=self.config.max_delivery_lag_s,
                tenant_max_streams=self.config.tenant_max_streams,
                measured_limit=measured,
                tenant_share=self.config.tenant_stream_share,
                lower=self.lower(policy),
            )
        except EdgeError as refusal:
            if refusal.code is ErrorCode.overloaded:
                if measuring is not None and refusal.headers.get(OVERLOAD_HEADER) == MEASURED:
                    measuring.refused()
                refusal.headers["Retry-After"] = str(self.retry_after.refused(now))
            raise
