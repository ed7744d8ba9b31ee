"""The load generator's processes: how flows are shared out, and results' way back intact."""

from __future__ import annotations

from loadtest.http_client import Result
from loadtest.scenarios import Flow
from loadtest.swarm import Tally, _pack, _unpack, split


def test_closed_loop_users_are_dealt_out_and_open_loop_rates_divided():
    shares = split([Flow("chat", "a", "interactive", users=5), Flow("bg", "b", "batch", rate=9.0)], 2)
    assert [sum(f.users for f in share if not f.open_loop) for share in shares] == [3, 2]
    assert [f.rate for share in shares for f in share if f.open_loop] == [4.5, 4.5]
    assert split([Flow("one", "a", "interactive", users=1)], 3)[2] == []  # no empty users flow


def test_results_come_back_whole():
    r = Result(
        ttft=0.25,
        e2e=3.5,
        tokens=3,
        gaps=[0.1, 0.2],
        status=200,
        started_at=1700000000.5,
        klass="interactive",
        tenant="t00",
        flow="stream",
        completion_tokens=3,
    )
    cut = Result(status=503, error="overloaded", cut=False, klass="interactive", tenant="t01", flow="stream")
    back = _unpack(_pack([r, cut]))
    for mine, theirs in zip([r, cut], back, strict=True):
        for field in (
            "ttft",
            "e2e",
            "tokens",
            "gaps",
            "status",
            "error",
            "started_at",
            "klass",
            "tenant",
            "flow",
            "completion_tokens",
            "cut",
        ):
            assert getattr(theirs, field) == getattr(mine, field), field


def test_the_tally_sums_the_latest_line_of_each_child():
    tally = Tally(2)
    tally.update(0, {"sent": 3, "errors": 1, "tokens": 10, "streaming": 2, "inflight": {"s": 2}, "waiting": {"s": 1}})
    tally.update(1, {"sent": 4, "errors": 0, "tokens": 5, "streaming": 4, "inflight": {"s": 4}, "waiting": {}})
    tally.update(0, {"sent": 5, "errors": 1, "tokens": 20, "streaming": 3, "inflight": {"s": 3}, "waiting": {}})
    assert (tally.sent, tally.errors, tally.tokens(), tally.streaming, tally.in_flight()) == (9, 1, 25, 7, 7)
    sample = tally.sample(12.0)
    assert sample.inflight == {"s": 7} and sample.waiting == {} and sample.open_streams == 12.0


def test_a_phase_split_between_this_process_and_children_is_read_as_one():
    from loadtest.swarm import Joined
    from loadtest.traffic import Call, Recorder

    rec = Recorder()
    rec.begin(Call("chat", "acme", "interactive", "m", "hi", 8))
    tally = Tally(1)
    tally.update(
        0, {"sent": 40, "errors": 2, "tokens": 100, "inflight": {"noise": 30, "chat": 1}, "waiting": {"noise": 5}}
    )
    joined = Joined(rec, tally)
    assert (joined.sent, joined.errors, joined.tokens()) == (41, 2, 100)
    sample = joined.sample(3.0)
    assert sample.inflight == {"chat": 2, "noise": 30} and sample.waiting == {"chat": 1, "noise": 5}
    assert joined.samples == [sample] and sample.open_streams == 3.0
