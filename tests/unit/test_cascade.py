"""The cascade policy: verdicts on the first tokens, the stream gate, and the report."""

from __future__ import annotations

import msgspec
import pytest

from core.policy.cascade import (
    CascadeSample,
    CascadeSettings,
    StreamGate,
    Verdict,
    cascade_report,
    decide,
    format_report,
    pick_threshold,
)
from schemas.openai import ChatBody
from schemas.requests import GenerateRequest
from schemas.work import Dispatch
from workers.cascade import stream_gate

S = CascadeSettings(min_mean_logprob=-1.0, window=4)


def test_verdict_waits_for_the_window() -> None:
    assert decide([-0.1, -0.2], S) is Verdict.PENDING
    assert decide([-0.1, -0.2, -0.1, -0.3], S) is Verdict.ACCEPT
    assert decide([-0.1, -3.0, -2.0, -0.5], S) is Verdict.ESCALATE  # mean -1.4
    assert decide([-0.1, -0.1, -0.1, -0.1, -9, -9], S) is Verdict.ACCEPT  # only the window counts


def test_short_and_empty_answers() -> None:
    assert decide([-0.2], S, finished=True) is Verdict.ACCEPT
    assert decide([-2.5], S, finished=True) is Verdict.ESCALATE
    assert decide([], S, finished=True) is Verdict.ESCALATE


def test_an_engine_without_logprobs_is_served_without_a_gate() -> None:
    """No confidence signal: the small pool's answer stands rather than always escalating."""
    request = GenerateRequest(
        request_id="r1",
        tenant="t",
        klass="chat",
        model="m",
        reply_to="_INBOX.x",
        created_at=0.0,
        deadline=0.0,
        chat=ChatBody(model="m", messages=[]),
    )
    dispatch = Dispatch(request, "$JS.ACK.x", 1, escalate_to="large", cascade_window=4, cascade_min_logprob=-1.0)

    class WithLogprobs:
        supports_logprobs = True

    class WithoutLogprobs:
        supports_logprobs = False

    assert isinstance(stream_gate(dispatch, WithLogprobs()), StreamGate)
    assert stream_gate(dispatch, WithoutLogprobs()) is None
    assert stream_gate(msgspec.structs.replace(dispatch, escalate_to=""), WithLogprobs()) is None


def test_stream_gate_holds_tokens_until_the_verdict() -> None:
    gate: StreamGate[str] = StreamGate(S)
    assert gate.push("The", [-0.1]) == []
    assert gate.push(" answer", [-0.2, -0.1]) == []  # a delta may carry several tokens
    assert gate.push(" is", [-0.3]) == ["The", " answer", " is"]
    assert gate.verdict is Verdict.ACCEPT
    assert gate.push(" 42", [-5.0]) == [" 42"]  # after accepting: pass-through
    assert gate.finish() == []


def test_stream_gate_drops_everything_on_escalation() -> None:
    gate: StreamGate[str] = StreamGate(S)
    for token in ("I", " think", " maybe"):
        assert gate.push(token, [-2.0]) == []
    assert gate.push(" it", [-2.0]) == []
    assert gate.verdict is Verdict.ESCALATE and gate.score == pytest.approx(-2.0)
    assert gate.push(" is", [-0.1]) == []


def test_stream_gate_decides_a_short_stream_at_its_end() -> None:
    gate: StreamGate[str] = StreamGate(S)
    assert gate.push("Paris", [-0.05]) == []
    assert gate.finish() == ["Paris"]


SAMPLES = [
    CascadeSample("easy1", 1.0, 1.0, (-0.1, -0.1), 0.001, 0.01),
    CascadeSample("easy2", 1.0, 1.0, (-0.3, -0.2), 0.001, 0.01),
    CascadeSample("lucky", 1.0, 1.0, (-1.5, -1.5), 0.001, 0.01),  # right but unsure
    CascadeSample("hard1", 0.0, 1.0, (-2.5, -2.0), 0.001, 0.01),
    CascadeSample("hard2", 0.5, 1.0, (-0.8, -0.8), 0.001, 0.01),  # confidently half-wrong
]


def test_report_share_escalated_and_quality_vs_always_large() -> None:
    r = cascade_report(SAMPLES, CascadeSettings(min_mean_logprob=-1.0))
    assert r.escalated_share == pytest.approx(0.4)  # lucky and hard1
    assert r.kept_off_large == pytest.approx(0.6)
    assert r.quality_large == 100.0
    assert r.quality_small == pytest.approx(70.0)
    assert r.quality_cascade == pytest.approx(90.0)  # only hard2 keeps a half answer
    assert r.quality_delta == pytest.approx(-10.0)
    assert r.cost_cascade == pytest.approx(5 * 0.001 + 2 * 0.01)
    assert r.cost_large == pytest.approx(0.05)
    assert "kept off large:  60.0%" in format_report(r)


def test_pick_threshold_keeps_quality_within_one_point() -> None:
    best = pick_threshold(SAMPLES, CascadeSettings(), [-0.1, -0.5, -0.9, -1.0, -2.0])
    assert best is not None and best.quality_cascade >= best.quality_large - 1.0
    assert best.threshold == -0.5  # escalates lucky, hard1, hard2
    assert best.escalated_share == pytest.approx(0.6)
    assert pick_threshold(SAMPLES, CascadeSettings(), [-3.0]) is None
