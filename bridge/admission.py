"""Whether the bridge takes on one more stream: asked before the request is stored, so a refusal
is an ordinary 503 with Retry-After and the streams already accepted keep their share.

Three limits:
- open streams: at most `max_streams` at once (0: no cap), the capacity an operator sized from
  `loadtest.scale --find-max`;
- delivery running late: while frames reach this bridge more than `max_delivery_lag_s` (smoothed)
  after their worker published them, the bridge is not keeping up with the streams it holds.
  One more would make every one of them later; left to grow, the backlog passes nats-server's
  max_pending for this connection, the server cuts it off as a slow consumer and every open
  stream fails. The lag is read against the worker's clock, as `laneway_frame_lag_seconds` is.
- one tenant's open streams: at most `tenant_max_streams` of this bridge's (429: that tenant is
  over its share, not the bridge full), so one tenant's flood leaves room for the others.
"""

from __future__ import annotations

from bridge.errors import EdgeError
from schemas.errors import ErrorCode


def admit(open_streams: int, lag_s: float, tenant_streams: int, *, max_streams: int, max_delivery_lag_s: float,
          tenant_max_streams: int) -> None:
    """Raise `overloaded` (503, Retry-After) when the bridge must not take another stream, or
    `rate_limited` (429) when the tenant holds its share of them."""
    if tenant_max_streams and tenant_streams >= tenant_max_streams:
        raise EdgeError(ErrorCode.rate_limited, f"this tenant holds {tenant_max_streams} open streams on this "
                        "bridge, its limit; retry when one ends",
                        headers={"x-laneway-overload": "tenant_streams", "Retry-After": "1"})
    if max_streams and open_streams >= max_streams:
        raise EdgeError(ErrorCode.overloaded, f"this bridge holds {max_streams} open streams, its limit; "
                        "retry shortly", headers={"x-laneway-overload": "streams"})
    if max_delivery_lag_s and lag_s > max_delivery_lag_s:
        raise EdgeError(ErrorCode.overloaded, f"this bridge is delivering tokens {lag_s * 1000:.0f} ms late "
                        f"(limit {max_delivery_lag_s * 1000:.0f} ms) and takes no new stream until it "
                        "catches up; retry shortly", headers={"x-laneway-overload": "delivery_lag"})
