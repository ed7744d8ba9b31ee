"""A circuit breaker for an upstream: pure state, no I/O, an injectable clock.

CLOSED → OPEN on `failure_threshold` consecutive failures, or when the failure rate over the last
`window_s` seconds reaches `error_rate` with at least `min_volume` calls in the window.
OPEN → HALF_OPEN once `cooldown_s` has passed (checked lazily, whenever the state is read).
HALF_OPEN lets `half_open_probes` calls through at a time; a success closes the breaker, a
failure re-opens it for another cool-down.

Every call goes through `acquire()`, which returns a `Permit` (or None: reject now), and is then
judged with `success(permit)`, `failure(permit)` or `release(permit)` (neither: a cancelled or
malformed request says nothing about the upstream). A permit remembers the breaker's generation,
so a verdict that arrives after the state has moved on (a slow call admitted while CLOSED that
fails after the breaker opened) cannot re-open, close, or steal a probe slot.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum


class BreakerState(IntEnum):
    # Integer values so a Prometheus gauge can export the state directly.
    CLOSED = 0
    OPEN = 1
    HALF_OPEN = 2


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    failure_threshold: int = 5  # consecutive failures that open the breaker
    error_rate: float = 0.5  # failure share in the window that opens it ...
    window_s: float = 30.0
    min_volume: int = 20  # ... once the window holds at least this many calls
    cooldown_s: float = 10.0  # OPEN for this long, then HALF_OPEN
    half_open_probes: int = 1  # calls let through at a time while HALF_OPEN

    def __post_init__(self) -> None:
        if self.failure_threshold < 1:
            raise ValueError("failure_threshold must be >= 1")
        if not 0.0 < self.error_rate <= 1.0:
            raise ValueError("error_rate must be in (0, 1]")
        if self.window_s <= 0 or self.cooldown_s < 0:
            raise ValueError("window_s must be > 0 and cooldown_s >= 0")
        if self.min_volume < 1 or self.half_open_probes < 1:
            raise ValueError("min_volume and half_open_probes must be >= 1")


@dataclass(frozen=True, slots=True)
class Permit:
    generation: int
    probe: bool  # holds one of the HALF_OPEN probe slots


StateHook = Callable[[BreakerState, BreakerState], None]  # (old, new)


class CircuitBreaker:
    def __init__(
        self,
        config: BreakerConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_change: StateHook | None = None,
    ) -> None:
        self.config = config or BreakerConfig()
        self._clock = clock
        self._on_change = on_change
        self._state = BreakerState.CLOSED
        self._generation = 0
        self._opened_at = 0.0
        self._consecutive = 0
        self._probes = 0  # probe permits out, HALF_OPEN only
        self._window: deque[tuple[float, bool]] = deque()  # (time, failed) in the window
        self._window_failures = 0

    @property
    def state(self) -> BreakerState:
        self._apply_due()
        return self._state

    def allowance(self) -> int | None:
        """Calls `acquire()` would admit right now: None for no limit (CLOSED)."""
        state = self.state
        if state is BreakerState.CLOSED:
            return None
        if state is BreakerState.OPEN:
            return 0
        return self.config.half_open_probes - self._probes

    def retry_after(self) -> float:
        """Seconds until an OPEN breaker half-opens (0 when not OPEN)."""
        if self.state is not BreakerState.OPEN:
            return 0.0
        return max(0.0, self._opened_at + self.config.cooldown_s - self._clock())

    def acquire(self) -> Permit | None:
        state = self.state
        if state is BreakerState.CLOSED:
            return Permit(self._generation, probe=False)
        if state is BreakerState.HALF_OPEN and self._probes < self.config.half_open_probes:
            self._probes += 1
            return Permit(self._generation, probe=True)
        return None

    def success(self, permit: Permit) -> None:
        if not self._current(permit):
            return
        if self._state is BreakerState.HALF_OPEN:
            self._move(BreakerState.CLOSED)
            return
        self._consecutive = 0
        self._record(failed=False)

    def failure(self, permit: Permit) -> None:
        if not self._current(permit):
            return
        if self._state is BreakerState.HALF_OPEN:
            self._move(BreakerState.OPEN)
            return
        self._consecutive += 1
        self._record(failed=True)
        if self._consecutive >= self.config.failure_threshold or self._rate_exceeded():
            self._move(BreakerState.OPEN)

    def release(self, permit: Permit) -> None:
        """The call ended without a verdict on the upstream; give back its probe slot."""
        if self._current(permit) and permit.probe:
            self._probes -= 1

    # -- internals ---------------------------------------------------------------------------

    def _current(self, permit: Permit) -> bool:
        self._apply_due()  # first, so generations are up to date
        return permit.generation == self._generation and self._state is not BreakerState.OPEN

    def _apply_due(self) -> None:
        """A due OPEN → HALF_OPEN move (the cooldown has passed)."""
        if self._state is BreakerState.OPEN and self._clock() - self._opened_at >= self.config.cooldown_s:
            self._move(BreakerState.HALF_OPEN)

    def _record(self, *, failed: bool) -> None:
        now = self._clock()
        self._window.append((now, failed))
        self._window_failures += failed
        horizon = now - self.config.window_s
        while self._window and self._window[0][0] < horizon:
            _, old_failed = self._window.popleft()
            self._window_failures -= old_failed

    def _rate_exceeded(self) -> bool:
        volume = len(self._window)
        return volume >= self.config.min_volume and self._window_failures / volume >= self.config.error_rate

    def _move(self, new: BreakerState) -> None:
        old = self._state
        self._state = new
        self._generation += 1  # verdicts on permits from the old state are now stale
        self._probes = 0
        self._consecutive = 0
        self._window.clear()  # a fresh start: old failures must not re-open a closed breaker
        self._window_failures = 0
        if new is BreakerState.OPEN:
            self._opened_at = self._clock()
        if self._on_change is not None:
            self._on_change(old, new)
