"""The bridge's admission: a stream cap and a delivery-lag limit, refused as 503 `overloaded`, and
one tenant's configured cap on its streams, refused as 429 `rate_limited`. (Order by class and
fair shares between tenants: tests/unit/test_admission_order.py.)"""

from __future__ import annotations

import pytest

from bridge.errors import EdgeError
from bridge.generate.admission import Held, admit
from bridge.streams.lag import FLOOR_WINDOW_S, LAG_FRESH_S, DeliveryLag
from core.policy.classes import DEFAULT_CLASSES
from schemas.errors import ErrorCode

INTERACTIVE = DEFAULT_CLASSES[0]


def held(total: int, tenant: int = 0) -> Held:
    """`total` open streams, `tenant` of them the asking tenant's (to an interactive request,
    every stream is one it competes with)."""
    return Held(
        total=total, below=total, in_class=total, sharing=1 if total else 0, tenant=tenant, tenant_in_class=tenant
    )


def test_under_both_limits_a_stream_is_admitted():
    admit(held(9, 4), 0.2, INTERACTIVE, max_streams=10, max_delivery_lag_s=0.5, tenant_max_streams=5)
    admit(
        held(10_000, 10_000), 30.0, INTERACTIVE, max_streams=0, max_delivery_lag_s=0, tenant_max_streams=0
    )  # 0: each off


@pytest.mark.parametrize("open_streams,lag,kind", [(10, 0.0, "streams"), (0, 0.6, "delivery_lag")])
def test_past_a_limit_the_answer_is_a_503_with_retry_after(open_streams, lag, kind):
    with pytest.raises(EdgeError) as refused:
        admit(held(open_streams), lag, INTERACTIVE, max_streams=10, max_delivery_lag_s=0.5, tenant_max_streams=5)
    e = refused.value
    assert e.code is ErrorCode.overloaded and e.status == 503 and e.type == "server_error"
    assert int(e.headers["Retry-After"]) > 0 and e.headers["x-laneway-overload"] == kind


def test_a_tenant_at_its_share_gets_a_429_while_the_bridge_has_room():
    with pytest.raises(EdgeError) as refused:
        admit(held(5, 5), 0.0, INTERACTIVE, max_streams=10, max_delivery_lag_s=0.5, tenant_max_streams=5)
    e = refused.value
    assert e.code is ErrorCode.rate_limited and e.status == 429 and e.code_name == "rate_limit_exceeded"
    assert e.headers["x-laneway-overload"] == "tenant_streams" and int(e.headers["Retry-After"]) > 0
    admit(held(5, 4), 0.0, INTERACTIVE, max_streams=10, max_delivery_lag_s=0.5, tenant_max_streams=5)  # another tenant


def test_one_late_frame_is_not_a_trend_but_a_run_of_them_is():
    lag = DeliveryLag()
    lag.observe(0.01, now=0.0)
    lag.observe(2.0, now=0.01)
    assert lag.current(0.01) < 0.5
    t = 0.01
    while lag.current(t) <= 0.5:
        t += 0.01
        lag.observe(2.0, now=t)
        assert t < 1.0, "a run of late frames never moved the smoothed lag"


def test_without_frames_lately_nothing_is_late():
    lag = DeliveryLag()
    assert lag.current(0.0) == 0.0
    lag.observe(3.0, now=0.0)
    assert lag.current(0.0) == 3.0
    assert lag.current(LAG_FRESH_S + 0.01) == 0.0
    lag.observe(0.05, now=LAG_FRESH_S + 0.02)  # a stale estimate starts over
    assert lag.current(LAG_FRESH_S + 0.02) == 0.05


def test_the_floor_is_the_least_lag_lately_and_moves_with_the_clocks():
    lag = DeliveryLag()
    assert lag.floor() == 0.0 and lag.queued(0.0) == 0.0
    for i, seen in enumerate((0.030, 0.012, 0.050, 0.020)):  # the worker's clock 12 ms behind, then queues
        lag.observe(seen, now=i * 0.1)
    assert lag.floor() == 0.012
    assert 0.0 < lag.queued(0.3) == lag.current(0.3) - 0.012
    # The clocks drift 10 ms apart: a window later the floor is the new offset, not the old one.
    for i in range(int(2 * FLOOR_WINDOW_S / 0.5) + 2):
        lag.observe(0.022, now=1.0 + i * 0.5)
    assert lag.floor() == 0.022 and lag.queued(1.0 + i * 0.5) < 1e-6
