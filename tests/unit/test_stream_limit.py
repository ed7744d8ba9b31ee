"""The bridge's measured stream limit (AIMD on its own lag), the loop-lag meter, and the liveness
rule that tells a late worker or a late bridge from a dead worker. Pure: a clock is passed in."""

from __future__ import annotations

import pytest

from bridge.errors import EdgeError
from bridge.generate.admission import Held, RetryAfter, StreamLimit, admit
from bridge.readiness import Readiness
from core.looplag import LoopLag
from core.policy.classes import DEFAULT_CLASSES
from core.routing.health import stale_after
from schemas import codec
from schemas.errors import ErrorCode
from schemas.work import Heartbeat


def run(
    limit: StreamLimit,
    seconds: float,
    *,
    open_streams,
    lag_s: float = 0.0,
    loop_lag_s: float = 0.0,
    start: float = 0.0,
    step: float = 0.1,
    refusing: bool | None = None,
) -> float:
    """Feed the limit every `step` seconds; `open_streams` may follow the limit (a callable). More
    clients than it admits are refused (`refused`) when `refusing`, by default when the streams
    open reach the limit."""
    t = start
    while t < start + seconds:
        n = open_streams(limit) if callable(open_streams) else open_streams
        limit.observe(t, open_streams=n, lag_s=lag_s, loop_lag_s=loop_lag_s)
        if refusing if refusing is not None else n >= int(limit.limit):
            limit.refused()
        t += step
    return t


def test_the_limit_grows_only_while_it_binds_and_delivery_is_on_time() -> None:
    limit = StreamLimit(limit=100)
    t = run(limit, 10, open_streams=10)  # far below it: nothing to learn
    assert limit.limit == 100
    t = run(limit, 10, open_streams=95, refusing=False, start=t)  # near it, but nobody refused
    assert limit.limit == 100
    t = run(limit, 10, open_streams=lambda lim: int(lim.limit), lag_s=0.02, start=t)  # binding, but late
    assert limit.limit == 100
    run(limit, 10, open_streams=lambda lim: int(lim.limit), start=t)  # binding and on time
    assert 150 < limit.limit < 180, "about 5 % a second"


def test_a_flood_held_at_a_share_of_the_limit_still_grows_it_while_on_time() -> None:
    """One tenant's batch flood is held at 0.81 of the limit (batch's 0.9, the tenant's 0.9 of
    that): its refusals say the limit binds, though the streams open never come near it."""
    limit = StreamLimit(limit=100)
    run(limit, 10, open_streams=lambda lim: int(0.81 * lim.limit), refusing=True)
    assert 150 < limit.limit < 180


def test_late_delivery_cuts_below_the_open_streams_once_per_cooldown() -> None:
    limit = StreamLimit(limit=1000)
    limit.observe(0.0, open_streams=600, lag_s=0.5, loop_lag_s=0.0)
    assert limit.limit == pytest.approx(480)  # 0.8 × what is open, not × the limit
    limit.observe(1.0, open_streams=600, lag_s=0.5, loop_lag_s=0.0)
    assert limit.limit == pytest.approx(480), "the last cut's effect is not visible yet"
    limit.observe(2.0, open_streams=600, lag_s=0.0, loop_lag_s=0.5)  # the loop's own lag counts too
    assert limit.limit == pytest.approx(384)


def test_late_but_not_congested_the_limit_eases_off_to_where_delivery_is_on_time() -> None:
    """Between `healthy_s` and `congested_s` a limit with no `ease` holds wherever it stood when
    the lag crossed `healthy_s`; the lower classes' limit eases off toward the streams open, so it
    settles where the lag is on time, whatever it started from (a retry storm that found it at
    361 after a batch flood held 200 streams at 5 ms of lag, its chats 2.5x alone)."""

    def lag(streams: int) -> float:  # 5 ms at 200 streams, 2.5 ms at 75
        return 0.001 + 0.004 * streams / 200

    settled = []
    for ease in (0.0, 0.025):
        limit = StreamLimit(limit=361, healthy_s=0.0025, congested_s=0.0075, ease=ease)
        t = 0.0
        for _ in range(600):  # a minute of ticks, the storm as many streams as the limit lets in
            n = min(200, int(limit.limit))
            limit.observe(t, open_streams=n, lag_s=lag(n), loop_lag_s=0.0)
            limit.refused()
            t += 0.1
        settled.append(limit.limit)
    held, eased = settled
    assert held == 361, "no ease: held in the band, 200 streams at 5 ms"
    assert 60 < eased < 85, "eased: around the 75 streams at which the lag is on time"


def test_the_limit_stays_between_its_floor_and_ceiling() -> None:
    limit = StreamLimit(limit=100, floor=32, ceiling=120)
    t = run(limit, 60, open_streams=lambda lim: int(lim.limit))
    assert limit.limit == 120
    run(limit, 60, open_streams=5, lag_s=1.0, start=t)
    assert limit.limit == 32


def test_admission_refuses_at_the_measured_limit_before_the_configured_one() -> None:
    interactive = DEFAULT_CLASSES[0]
    admit(
        Held(total=99, below=99),
        0.0,
        interactive,
        max_streams=0,
        max_delivery_lag_s=0.5,
        tenant_max_streams=0,
        measured_limit=100,
    )
    with pytest.raises(EdgeError) as refused:
        admit(
            Held(total=100, below=100),
            0.0,
            interactive,
            max_streams=0,
            max_delivery_lag_s=0.5,
            tenant_max_streams=0,
            measured_limit=100,
        )
    assert refused.value.code is ErrorCode.overloaded
    assert refused.value.headers["x-laneway-overload"] == "measured_streams"


def test_loop_lag_is_the_mean_lateness_or_the_tick_overdue_now() -> None:
    lag = LoopLag(interval_s=0.05, window_s=2.0)
    assert lag.current(0.0) == 0.0
    for i in range(20):
        lag.observe(i * 0.1, 0.2 if i == 5 else 0.0)  # one collector pause among on-time ticks
    assert lag.current(1.95) == pytest.approx(0.01)
    assert lag.current(5.0) == pytest.approx(5.0 - 1.9 - 0.05), "a loop stuck now is as late as that"


def beat(loop_lag_s: float = 0.0) -> Heartbeat:
    return Heartbeat(
        worker_id="w1",
        pool="p",
        engine="sim",
        model="m",
        ready=True,
        total_slots=8,
        free_slots=8,
        token_budget=0,
        interval_s=2.0,
        loop_lag_s=loop_lag_s,
    )


class _Msg:
    def __init__(self, data: bytes) -> None:
        self.data = data


async def test_silence_is_judged_against_the_workers_and_the_bridges_own_lateness() -> None:
    readiness = Readiness(stale_after_s=15.0)
    await readiness.on_heartbeat(_Msg(codec.encode(beat())))
    heard = readiness._workers["w1"].at
    bound = stale_after(beat(), 15.0)
    assert bound == 7.0
    assert readiness.alive("w1", heard + bound)
    assert not readiness.alive("w1", heard + bound + 0.5), "a silent worker is gone after today's bound"
    assert readiness.alive("w1", heard + bound + 0.5, heard_at=heard + 1.0), "its frames say it is alive"
    assert readiness.alive("w1", heard + bound + 0.5, slack_s=1.0), "this bridge reads its messages late"
    assert stale_after(beat(loop_lag_s=2.0), 15.0) == 13.0, "a worker that runs late beats late"
    assert stale_after(beat(loop_lag_s=60.0), 15.0) == 22.0, "one long stall stretches it by the cap at most"


def test_retry_after_spreads_the_refused_clients_to_a_budget_a_second() -> None:
    """2,400 clients refused, each back after the Retry-After it got (jittered, as the load
    generator does): the bridge answers about `budget` refusals a second, not thousands."""
    import heapq
    import random

    rng = random.Random(7)
    retry = RetryAfter(budget=200.0)
    due = [(rng.uniform(0, 2), i) for i in range(2400)]
    heapq.heapify(due)
    refusals_at = []
    while due[0][0] < 120:
        t, i = heapq.heappop(due)
        heapq.heappush(due, (t + retry.refused(t) * rng.uniform(1.0, 1.5), i))
        refusals_at.append(t)
    last_20_s = sum(1 for t in refusals_at if t >= 100) / 20
    assert 100 <= last_20_s <= 300, last_20_s
    assert retry.least_s < retry.refused(120.0) < retry.most_s
    assert RetryAfter().refused(0.0) == 2, "a lone refusal waits the least"
