"""Which other brokers are alive, from their heartbeats on `lw.evt.broker.<id>`. No I/O."""

from __future__ import annotations


class Peers:
    def __init__(self, own_id: str, stale_s: float) -> None:
        self._own = own_id
        self._stale_s = stale_s
        self._seen: dict[str, float] = {}  # broker id → monotonic time of its last heartbeat

    def saw(self, broker_id: str, now: float) -> None:
        if broker_id != self._own:
            self._seen[broker_id] = now

    def forget(self, broker_id: str) -> None:
        """It said it is leaving, or it was the scheduler whose lease lapsed: gone now."""
        self._seen.pop(broker_id, None)

    def alive(self, now: float) -> int:
        """How many other brokers sent a heartbeat within `stale_s`; forgets the rest."""
        self._seen = {b: t for b, t in self._seen.items() if now - t <= self._stale_s}
        return len(self._seen)
