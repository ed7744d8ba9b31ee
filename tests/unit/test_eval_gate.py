"""The eval gate: golden set, scorer, a rule set's expected quality and cost, and the gate rule.

Pool answers come from a simulated pair of models (a small one that knows easy facts and is
unsure otherwise, a large one that knows everything): real functions returning text, scored by
the real scorer. The HTTP path is checked against a real local aiohttp server.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from core.policy.cascade import cascade_report
from core.routing.eval_gate import (
    Completion,
    EvalUnavailable,
    GoldenItem,
    assess,
    cascade_samples,
    exact_match,
    gate,
    gate_record,
    gate_unmeasured,
    load_golden,
    normalize,
    pools_needed,
    results_evaluator,
    run_pools,
    save_results,
    score_answer,
    token_f1,
)
from core.routing.rules import RuleSet, decode
from laneway import ops_eval

GOLDEN = load_golden()
HARD = {"reasoning"}
HARD_IDS = {"fact-04", "fact-05"}  # Ottawa, Canberra: a 135M model's usual misses


def is_hard(item: GoldenItem) -> bool:
    return item.category in HARD or item.id in HARD_IDS


async def simulated(pool: str, item: GoldenItem) -> Completion:
    """`large` and `api` always right; `small` right and confident on easy items, else unsure."""
    answer = (
        f"Let me work it out.\nFinal answer: {item.reference}" if item.extract == "last_line" else f"{item.reference}."
    )
    if pool == "small" and is_hard(item):
        return Completion("I am not sure, maybe 7.", 20, 8, [-2.3, -1.9, -2.8, -2.0])
    return Completion(answer, 20, 6, [-0.2, -0.1, -0.3, -0.2])


def rules(auto_pools: dict, simple_pools: dict | None = None, escalate: str | None = None) -> RuleSet:
    doc = {
        "pools": {
            "small": {"cost_in_per_1m": 0.05, "cost_out_per_1m": 0.10},
            "large": {"cost_in_per_1m": 0.60, "cost_out_per_1m": 1.20},
            "api": {"hosted": True, "cost_in_per_1m": 3.0, "cost_out_per_1m": 6.0},
        },
        "models": ["auto"],
        "rules": [{"rule_id": "auto", "match": {"model": "auto"}, "pools": auto_pools}],
        "cascade": {"min_mean_logprob": -1.0, "window": 4},
    }
    if simple_pools:
        rule = {"rule_id": "simple", "match": {"model": "auto", "intent": "simple"}, "pools": simple_pools}
        if escalate:
            rule["escalate_to"] = escalate
        doc["rules"].insert(0, rule)
    return decode(json.dumps(doc).encode())


@pytest.fixture(scope="module")
async def results():
    return await run_pools(GOLDEN, ["small", "large", "api"], simulated)


# -- golden set and scorer ------------------------------------------------------------------------


def test_golden_set_shape() -> None:
    assert len(GOLDEN) >= 40
    assert len({i.id for i in GOLDEN}) == len(GOLDEN)
    assert {"factual", "arithmetic", "sentiment", "units", "words", "reasoning", "code"} <= {i.category for i in GOLDEN}
    for item in GOLDEN:  # the scorer accepts every reference and alias as given
        for ref in (item.reference, *item.aliases):
            assert score_answer(ref, item) == 1.0, item.id


def test_normalized_match() -> None:
    assert normalize("The answer is: 1,000.00!") == "answer is 1000"
    assert normalize("Seven") == "7" and exact_match("seven", "7")
    assert normalize("H2O.") == "h2o" and normalize("3.5") == "3.5"
    item = GoldenItem("x", "factual", "Capital of France?", "Paris")
    assert score_answer("Paris", item) == 1.0
    assert score_answer("The capital of France is Paris.\nIt is large.", item) == 1.0
    assert score_answer("Lyon", item) == 0.0


def test_token_f1_and_aliases() -> None:
    assert token_f1("William Shakespeare", "William Shakespeare") == 1.0
    assert token_f1("Shakespeare wrote it", "William Shakespeare") == pytest.approx(0.4)
    item = GoldenItem("x", "factual", "Who?", "Leonardo da Vinci", aliases=["da Vinci"])
    assert score_answer("It was da Vinci", item) == 1.0
    assert score_answer("Leonardo", item) == pytest.approx(0.5)


def test_naming_every_label_is_no_answer() -> None:
    item = GoldenItem("x", "sentiment", "?", "positive", choices=["positive", "negative"])
    assert score_answer("Positive", item) == 1.0
    assert score_answer("The sentiment is positive.", item) == 1.0
    assert score_answer("positive or negative", item) < 1.0


def test_last_line_extraction() -> None:
    item = GoldenItem("x", "reasoning", "?", "6", extract="last_line")
    assert score_answer("3 + 5 = 8, minus 2.\nFinal answer: 6", item) == 1.0
    assert score_answer("6 apples at first\nthen 8", item) == 0.0


# -- the gate -------------------------------------------------------------------------------------


def test_gate_allows_down_to_one_point_below_baseline() -> None:
    assert gate(87.0, 88.0).allowed
    blocked = gate(86.99, 88.0)
    assert not blocked.allowed and "below baseline" in blocked.message
    assert gate(95.0, None).allowed  # nothing to regress from


def test_gate_forced_only_with_a_reason_that_is_recorded() -> None:
    assert not gate(50.0, 88.0, "   ").allowed
    forced = gate(50.0, 88.0, "incident 42: large pool down")
    assert forced.allowed and forced.forced
    record = gate_record(None, forced)
    assert record.forced_reason == "incident 42: large pool down" and record.candidate_quality == 50.0
    assert gate_record(None, gate(90.0, 88.0, "unneeded")).forced_reason is None


def test_unmeasured_changes_need_a_reason_unless_first() -> None:
    assert gate_unmeasured(False, None, "no evaluator").allowed
    assert not gate_unmeasured(True, None, "no evaluator").allowed
    forced = gate_unmeasured(True, "hotfix", "no evaluator")
    assert forced.allowed and forced.forced and forced.candidate_quality is None


# -- a rule set's expected quality and cost -------------------------------------------------------


async def test_assess_quality_cost_and_shares(results) -> None:
    n = len(GOLDEN)
    n_hard = sum(is_hard(i) for i in GOLDEN)
    large = assess(rules({"large": 1}), GOLDEN, results)
    small = assess(rules({"small": 1}), GOLDEN, results)
    assert large.quality == 100.0 and large.pool_share == {"large": 1.0}
    assert small.quality == pytest.approx(100.0 * (n - n_hard) / n)
    assert small.cost_per_1k < large.cost_per_1k
    # Cost from the $/1M table: large answers use 20 prompt + 6 completion tokens each.
    assert large.cost_per_1k == pytest.approx(1000 * (20 * 0.60 + 6 * 1.20) / 1e6)
    half = assess(rules({"small": 1, "large": 1}), GOLDEN, results)
    assert half.quality == pytest.approx((large.quality + small.quality) / 2)
    assert half.pool_share == {"large": 0.5, "small": 0.5}


async def test_cascade_rules_are_scored_with_the_small_pools_logprobs(results) -> None:
    cascade = rules({"large": 1}, simple_pools={"small": 1}, escalate="large")
    a = assess(cascade, GOLDEN, results)
    # Hard prompts the classifier calls simple go to small, are unsure there and escalate.
    assert a.quality == 100.0
    assert 0 < a.escalated_share < a.pool_share["small"] + a.escalated_share
    assert pools_needed(cascade, GOLDEN) == {"small", "large"}
    report = cascade_report(cascade_samples(GOLDEN, results, "small", "large", cascade), cascade.cascade)
    assert report.quality_cascade == report.quality_large == 100.0
    assert report.escalated_share == pytest.approx(sum(is_hard(i) for i in GOLDEN) / len(GOLDEN))
    assert report.cost_cascade < report.cost_large


async def test_evaluator_blocks_a_bad_change(results) -> None:
    evaluate = results_evaluator(GOLDEN, results)
    outcome = await evaluate(rules({"small": 1}), rules({"large": 1}))
    verdict = gate(outcome.candidate.quality, outcome.baseline.quality)
    assert not verdict.allowed
    ok = await evaluate(rules({"large": 1}, simple_pools={"small": 1}, escalate="large"), rules({"large": 1}))
    assert gate(ok.candidate.quality, ok.baseline.quality).allowed
    with pytest.raises(EvalUnavailable) as exc:
        await results_evaluator(GOLDEN, {"small": results["small"]})(rules({"large": 1}), None)
    assert exc.value.pool == "large"


# -- `laneway eval` and the HTTP runner -----------------------------------------------------------


def _args(tmp_path: Path, candidate: RuleSet, baseline: RuleSet, **extra) -> argparse.Namespace:
    from core.routing.rules import encode

    (tmp_path / "candidate.json").write_bytes(encode(candidate))
    (tmp_path / "baseline.json").write_bytes(encode(baseline))
    parser = argparse.ArgumentParser()
    ops_eval.configure(parser)
    argv = ["--rules", str(tmp_path / "candidate.json"), "--baseline", str(tmp_path / "baseline.json")]
    for key, value in extra.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    return parser.parse_args(argv)


async def test_eval_command_prints_side_by_side_and_exits_by_the_gate(tmp_path: Path, results, capsys) -> None:
    save_results(tmp_path / "scores.json", results)
    good = _args(
        tmp_path,
        rules({"large": 1}, simple_pools={"small": 1}, escalate="large"),
        rules({"large": 1}),
        scores=tmp_path / "scores.json",
        cascade="small:large",
    )
    assert await ops_eval.run(good) == 0
    out = capsys.readouterr().out
    assert "candidate" in out and "current" in out and "gate: PASS" in out and "kept off large" in out
    bad = _args(tmp_path, rules({"small": 1}), rules({"large": 1}), scores=tmp_path / "scores.json")
    assert await ops_eval.run(bad) == 3
    assert "gate: BLOCKED" in capsys.readouterr().out
    missing = _args(tmp_path, rules({"api": 1}), rules({"large": 1}))
    assert await ops_eval.run(missing) == 2


async def test_http_runner_pins_pools_through_logical_models() -> None:
    seen: list[str] = []

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body["model"])
        assert request.headers["Authorization"] == "Bearer k" and body["temperature"] == 0
        if body["model"] == "pool-broken":
            return web.json_response({"error": {"message": "no worker", "type": "server_error"}}, status=503)
        reply = "Paris" if body["model"] == "pool-large" else "Lyon"
        return web.json_response(
            {
                "choices": [
                    {"message": {"role": "assistant", "content": reply}, "logprobs": {"content": [{"logprob": -0.5}]}}
                ],
                "usage": {"prompt_tokens": 11, "completion_tokens": 1},
            }
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    item = GoldenItem("q", "factual", "Capital of France?", "Paris")
    try:
        async with aiohttp.ClientSession() as session:
            complete = ops_eval.http_completer(
                session,
                url,
                "k",
                {"large": "pool-large", "small": "pool-small", "broken": "pool-broken"},
                logprobs=True,
            )
            got = await run_pools([item], ["large", "small"], complete)
            with pytest.raises(EvalUnavailable):
                await complete("broken", item)
    finally:
        await runner.cleanup()
    assert got["large"]["q"].score == 1.0 and got["small"]["q"].score == 0.0
    assert got["large"]["q"].logprobs == [-0.5] and got["large"]["q"].prompt_tokens == 11
    assert sorted(seen) == ["pool-broken", "pool-large", "pool-small"]
