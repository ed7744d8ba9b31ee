"""The circuit breaker's state machine, driven by a fake clock."""

from __future__ import annotations

import pytest

from workers.engines.openai.circuit import BreakerConfig, BreakerState, CircuitBreaker, Permit


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(**overrides: float) -> tuple[CircuitBreaker, FakeClock, list[tuple[BreakerState, BreakerState]]]:
    settings: dict = dict(
        failure_threshold=3, error_rate=0.5, window_s=10.0, min_volume=4, cooldown_s=5.0, half_open_probes=1
    )
    settings.update(overrides)
    clock = FakeClock()
    changes: list[tuple[BreakerState, BreakerState]] = []
    breaker = CircuitBreaker(BreakerConfig(**settings), clock=clock, on_change=lambda o, n: changes.append((o, n)))
    return breaker, clock, changes


def permit(breaker: CircuitBreaker) -> Permit:
    p = breaker.acquire()
    assert p is not None
    return p


def fail(breaker: CircuitBreaker, times: int = 1) -> None:
    for _ in range(times):
        breaker.failure(permit(breaker))


def succeed(breaker: CircuitBreaker, times: int = 1) -> None:
    for _ in range(times):
        breaker.success(permit(breaker))


def test_opens_after_consecutive_failures() -> None:
    breaker, _, changes = make()
    fail(breaker, 2)
    assert breaker.state is BreakerState.CLOSED
    fail(breaker)
    assert breaker.state is BreakerState.OPEN
    assert changes == [(BreakerState.CLOSED, BreakerState.OPEN)]
    assert breaker.acquire() is None
    assert breaker.allowance() == 0


def test_success_resets_the_consecutive_count() -> None:
    breaker, _, _ = make(min_volume=100)
    for _ in range(5):
        fail(breaker, 2)
        succeed(breaker)
    assert breaker.state is BreakerState.CLOSED


def test_opens_on_error_rate_once_volume_is_reached() -> None:
    breaker, _, _ = make(failure_threshold=100, min_volume=4, error_rate=0.5)
    succeed(breaker)
    fail(breaker)
    succeed(breaker)
    assert breaker.state is BreakerState.CLOSED  # 1/3 failed, volume below minimum
    fail(breaker)
    assert breaker.state is BreakerState.OPEN  # 2/4 failed


def test_error_rate_needs_minimum_volume() -> None:
    breaker, _, _ = make(failure_threshold=100, min_volume=10, error_rate=0.5)
    fail(breaker)
    succeed(breaker)
    fail(breaker)
    assert breaker.state is BreakerState.CLOSED


def test_window_slides_old_failures_out() -> None:
    breaker, clock, _ = make(failure_threshold=100, min_volume=4, error_rate=0.5, window_s=10.0)
    fail(breaker)
    fail(breaker)
    clock.now += 11.0  # both failures leave the window
    succeed(breaker, 3)
    fail(breaker)
    assert breaker.state is BreakerState.CLOSED  # 1/4 in the window


def test_cooldown_then_half_open_probe_closes() -> None:
    breaker, clock, changes = make(half_open_probes=2)
    fail(breaker, 3)
    clock.now += 4.9
    assert breaker.state is BreakerState.OPEN
    assert breaker.retry_after() == pytest.approx(0.1)
    clock.now += 0.1
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.allowance() == 2
    first, second = permit(breaker), permit(breaker)
    assert breaker.acquire() is None  # only K probes at a time
    assert breaker.allowance() == 0
    breaker.success(first)
    assert breaker.state is BreakerState.CLOSED
    assert breaker.allowance() is None
    breaker.failure(second)  # stale verdict from the old generation
    assert breaker.state is BreakerState.CLOSED
    assert changes == [
        (BreakerState.CLOSED, BreakerState.OPEN),
        (BreakerState.OPEN, BreakerState.HALF_OPEN),
        (BreakerState.HALF_OPEN, BreakerState.CLOSED),
    ]


def test_half_open_failure_reopens_for_a_new_cooldown() -> None:
    breaker, clock, _ = make()
    fail(breaker, 3)
    clock.now += 5.0
    fail(breaker)
    assert breaker.state is BreakerState.OPEN
    assert breaker.retry_after() == pytest.approx(5.0)


def test_release_returns_the_probe_slot() -> None:
    breaker, clock, _ = make()
    fail(breaker, 3)
    clock.now += 5.0
    probe = permit(breaker)
    assert breaker.acquire() is None
    breaker.release(probe)  # cancelled: no verdict on the upstream
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.acquire() is not None


def test_late_verdicts_from_before_opening_are_ignored() -> None:
    breaker, clock, _ = make()
    slow = permit(breaker)  # admitted while CLOSED
    fail(breaker, 3)
    clock.now += 5.0
    assert breaker.state is BreakerState.HALF_OPEN
    breaker.success(slow)  # must not close the breaker unprobed
    assert breaker.state is BreakerState.HALF_OPEN
    breaker.failure(slow)
    assert breaker.state is BreakerState.HALF_OPEN


def test_closing_starts_from_a_clean_slate() -> None:
    breaker, clock, _ = make()
    fail(breaker, 3)
    clock.now += 5.0
    succeed(breaker)
    fail(breaker, 2)
    assert breaker.state is BreakerState.CLOSED


def test_state_is_an_int_for_gauges() -> None:
    assert [int(s) for s in BreakerState] == [0, 1, 2]


@pytest.mark.parametrize(
    "field,value",
    [
        ("failure_threshold", 0),
        ("error_rate", 0.0),
        ("error_rate", 1.5),
        ("window_s", 0.0),
        ("min_volume", 0),
        ("half_open_probes", 0),
    ],
)
def test_config_rejects_nonsense(field: str, value: float) -> None:
    with pytest.raises(ValueError):
        BreakerConfig(**{field: value})
