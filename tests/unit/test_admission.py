"""The bridge's admission: a stream cap and a delivery-lag limit, refused as 503 `overloaded`."""

from __future__ import annotations

import time

import pytest
from nats.aio.msg import Msg

from broker.bridge.admission import admit
from broker.bridge.errors import EdgeError
from broker.demux import LAG_FRESH_S, OFFSET_WINDOW_S, ClockOffsets, DeliveryLag, Demux
from schemas import codec
from schemas.errors import ErrorCode
from schemas.frames import TokenFrame


def test_under_both_limits_a_stream_is_admitted():
    admit(9, 0.2, max_streams=10, max_delivery_lag_s=0.5)
    admit(10_000, 30.0, max_streams=0, max_delivery_lag_s=0)      # 0: each limit off


@pytest.mark.parametrize("open_streams,lag,kind", [(10, 0.0, "streams"), (0, 0.6, "delivery_lag")])
def test_past_a_limit_the_answer_is_a_503_with_retry_after(open_streams, lag, kind):
    with pytest.raises(EdgeError) as refused:
        admit(open_streams, lag, max_streams=10, max_delivery_lag_s=0.5)
    e = refused.value
    assert e.code is ErrorCode.overloaded and e.status == 503 and e.type == "server_error"
    assert int(e.headers["Retry-After"]) > 0 and e.headers["x-laneway-overload"] == kind


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
    lag.observe(0.05, now=LAG_FRESH_S + 0.02)       # a stale estimate starts over
    assert lag.current(LAG_FRESH_S + 0.02) == 0.05


def test_lag_is_read_past_each_workers_clock_offset():
    offsets = ClockOffsets()
    assert offsets.late_s("behind", 5.001, now=0.0) == 0.0      # a worker whose clock is 5 s behind
    assert offsets.late_s("behind", 5.003, now=0.1) == pytest.approx(0.002)
    assert offsets.late_s("ahead", -2.0, now=0.2) == 0.0        # another, 2 s ahead: its own offset
    assert offsets.late_s("behind", 5.801, now=0.3) == pytest.approx(0.8)   # late is late
    assert offsets.late_s("ahead", -1.2, now=0.4) == pytest.approx(0.8)


def test_a_stepped_clock_is_learnt_within_two_windows():
    offsets = ClockOffsets()
    offsets.late_s("w", 0.001, now=0.0)
    t = 0.0
    while offsets.late_s("w", 3.001, now=t) > 0.0:     # its clock stepped 3 s back
        t += 1.0
        assert t <= 2 * OFFSET_WINDOW_S, "a stepped clock was never learnt"


async def test_a_worker_clock_behind_does_not_close_the_bridge():
    """Frames from a worker whose clock runs 5 s behind: on time, so new streams are admitted."""
    demux = Demux()
    for _ in range(20):
        frame = TokenFrame("worker-behind", [], sent_at=time.time() - 5.0)
        await demux.on_frame(Msg(None, subject="lw.tok.acme.edge", data=codec.encode(frame)))
    lag = demux.lag.current(time.monotonic())
    assert lag < 0.5
    admit(0, lag, max_streams=0, max_delivery_lag_s=0.5)
