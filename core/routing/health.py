"""Live pool health for `choose_pool`: ready workers from heartbeats, queue depth from the lanes,
recent TTFT p95 from whoever sees first tokens. Pure state with an injectable clock, no I/O:
the broker feeds it from the messages it already receives."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from core.routing.rules import PoolHealth
from schemas.work import Heartbeat


def stale_after(beat: Heartbeat, cap_s: float) -> float:
    """Seconds of silence after which a worker counts as gone: 3 missed beats, at most `cap_s`,
    and 3 times more the lateness its loop last reported, at most `cap_s` again (a starved worker
    beats late, a dead one not at all). The one rule for the broker's routing and the bridge's
    readiness and worker-loss checks."""
    return min(cap_s, 3 * beat.interval_s + 1) + min(cap_s, 3 * beat.loop_lag_s)


def serving(beat: Heartbeat) -> bool:
    """Takes new work: warmed up and not draining."""
    return beat.ready and not beat.stopping


@dataclass(slots=True)
class _Worker:
    pool: str
    ready: bool
    free_slots: int
    seen: float
    stale_after: float


@dataclass(slots=True)
class _Ttft:
    samples: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=512))


class HealthBoard:
    def __init__(
        self, stale_after_s: float = 15.0, ttft_window_s: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._stale_after_s = stale_after_s
        self._window_s = ttft_window_s
        self._clock = clock
        self._workers: dict[str, _Worker] = {}
        self._depths: dict[str, int] = {}
        self._ttft: dict[str, _Ttft] = {}

    def on_heartbeat(self, beat: Heartbeat) -> None:
        self._workers[beat.worker_id] = _Worker(
            beat.pool, serving(beat), beat.free_slots, self._clock(), stale_after(beat, self._stale_after_s)
        )

    def gone(self, worker_id: str, slack_s: float = 0.0, now: float | None = None) -> bool:
        """Heard from once, silent since past its bound (and `slack_s`, the reader's own lateness)."""
        w = self._workers.get(worker_id)
        now = self._clock() if now is None else now
        return w is not None and now - w.seen > w.stale_after + slack_s

    def set_queue_depth(self, pool: str, depth: int) -> None:
        self._depths[pool] = depth

    def observe_ttft(self, pool: str, seconds: float) -> None:
        self._ttft.setdefault(pool, _Ttft()).samples.append((self._clock(), seconds))

    def ttft_p95(self, pool: str, now: float | None = None) -> float | None:
        series = self._ttft.get(pool)
        if series is None:
            return None
        now = self._clock() if now is None else now
        while series.samples and now - series.samples[0][0] > self._window_s:
            series.samples.popleft()
        values = sorted(v for _, v in series.samples)
        if not values:
            return None
        return values[min(len(values) - 1, int(0.95 * len(values)))]

    def snapshot(self) -> dict[str, PoolHealth]:
        now = self._clock()
        ready: dict[str, int] = {}
        free: dict[str, int] = {}
        for wid, w in list(self._workers.items()):
            if now - w.seen > w.stale_after:
                if now - w.seen > 10 * w.stale_after:
                    del self._workers[wid]  # long gone: forget it
                continue
            if w.ready:
                ready[w.pool] = ready.get(w.pool, 0) + 1
                free[w.pool] = free.get(w.pool, 0) + w.free_slots
        pools = {w.pool for w in self._workers.values()} | set(self._depths) | set(self._ttft)
        return {
            p: PoolHealth(
                ready_workers=ready.get(p, 0),
                queue_depth=self._depths.get(p, 0),
                ttft_p95_s=self.ttft_p95(p, now),
                free_slots=free.get(p),
            )
            for p in pools
        }
