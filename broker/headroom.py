"""Headroom sized to the top class's bursts at each worker. No I/O.

A class's `max_slot_share` leaves the classes above it a fixed part of a worker's slots: 0.95
leaves 13 of 256 but 2 of 32, and chats arriving three at once at a 32-slot worker that a
standard-class storm held to its share waited in the lanes for one of the storm's to end (p95
36-88 ms; `python -m loadtest.noisy --max-seqs 32 --cases retry-storm`). So each class below the
top one also leaves free, at a worker, the most slots the top class held there in the last
WINDOW_S, plus one: the burst its chats came with lately, and room for one more. Only the top
class counts: a batch job under a standard storm that just ended is not held back by the
storm's peak, only by its share, as before. A top class idle for WINDOW_S reserves nothing.
"""

from __future__ import annotations

from collections import deque

WINDOW_S = 10.0  # a burst's peak is remembered this long (chats at 2/s: ~20 arrivals)


class Bursts:
    """The top class's most slots at each worker in the last WINDOW_S, from its pulls' credits."""

    def __init__(self) -> None:
        # worker → (when, slots), slots falling from the front: the front is the window's most.
        self._seen: dict[str, deque[tuple[float, int]]] = {}
        self._swept = 0.0

    def heard(self, worker: str, held: int, now: float) -> None:
        if now - self._swept > WINDOW_S:  # a worker gone (or renamed on restart) is forgotten
            self._swept = now
            for name, old in list(self._seen.items()):
                self._expire(old, now)
                if not old:
                    del self._seen[name]
        seen = self._seen.setdefault(worker, deque())
        while seen and seen[-1][1] <= held:
            seen.pop()
        seen.append((now, held))
        self._expire(seen, now)

    def reserve(self, worker: str, now: float) -> int:
        """Slots the classes below the top keep free at `worker`: its recent most, plus one."""
        seen = self._seen.get(worker)
        if not seen:
            return 0
        self._expire(seen, now)
        peak = seen[0][1] if seen else 0
        return peak + 1 if peak else 0

    @staticmethod
    def _expire(seen: deque[tuple[float, int]], now: float) -> None:
        while seen and now - seen[0][0] > WINDOW_S:
            seen.popleft()
