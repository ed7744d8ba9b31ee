"""Routing rules: matching, weights, live-health spill to the hosted pool, validation errors."""

from __future__ import annotations

import json
from collections import Counter

import msgspec
import pytest

from core.policy.refusal import Refusal
from core.routing.health import HealthBoard
from core.routing.rules import (
    Features,
    PoolHealth,
    PoolSpec,
    Reason,
    RuleSet,
    RuleSetError,
    all_healthy,
    choose_pool,
    decide_request,
    decode,
    encode,
    escalated_decision,
    features_of,
    route_distribution,
    validate,
)
from schemas.errors import ErrorCode
from schemas.requests import GenerateRequest
from schemas.work import Heartbeat
from tests.requests import chat

RULES = {
    "pools": {
        "small": {"cost_in_per_1m": 0.05, "cost_out_per_1m": 0.10, "max_queue_depth": 10, "max_ttft_p95_s": 1.0},
        "large": {"cost_in_per_1m": 0.60, "cost_out_per_1m": 1.20, "max_queue_depth": 10},
        "api": {"hosted": True, "cost_in_per_1m": 3.0, "cost_out_per_1m": 6.0},
    },
    "rules": [
        {"rule_id": "acme-long", "match": {"tenant": "acme", "min_prompt_tokens": 1000}, "pools": {"large": 1}},
        {"rule_id": "in-house", "match": {"tenant": "bank"}, "pools": {"small": 1}, "spill": False},
        {"rule_id": "batch", "match": {"class": "batch"}, "pools": {"small": 1}},
        {
            "rule_id": "auto-simple",
            "match": {"model": "auto", "intent": "simple"},
            "pools": {"small": 1},
            "escalate_to": "large",
        },
        {"rule_id": "auto", "match": {"model": "auto"}, "pools": {"large": 1}},
        {"rule_id": "fast", "match": {"model": "fast"}, "pools": {"small": 1}},
        {"rule_id": "balanced", "match": {"model": "balanced"}, "pools": {"small": 3, "large": 1}},
        {"rule_id": "quality", "match": {"model": "quality"}, "pools": {"large": 1}},
    ],
}


def ruleset(**changes) -> RuleSet:
    doc = json.loads(json.dumps(RULES))
    doc.update(changes)
    return decode(json.dumps(doc).encode())


def feat(
    model: str = "balanced",
    rid: str = "r1",
    tenant: str = "t",
    klass: str = "interactive",
    tokens: int = 50,
    intent: str | None = None,
) -> Features:
    return Features(rid, tenant, klass, model, tokens, intent)


def health(**pools: PoolHealth) -> dict[str, PoolHealth]:
    base = {"small": PoolHealth(2), "large": PoolHealth(2), "api": PoolHealth(1, free_slots=64)}
    base.update(pools)
    return base


# -- matching -------------------------------------------------------------------------------------


def test_first_matching_rule_wins_in_order() -> None:
    rs = ruleset()
    assert choose_pool(feat("fast", klass="batch"), rs, health()).rule_id == "batch"
    assert choose_pool(feat("quality"), rs, health()).rule_id == "quality"
    assert choose_pool(feat("quality", tenant="acme", tokens=1000), rs, health()).rule_id == "acme-long"
    assert choose_pool(feat("quality", tenant="acme", tokens=999), rs, health()).rule_id == "quality"


def test_intent_routes_auto() -> None:
    rs = ruleset()
    simple = choose_pool(feat("auto", intent="simple"), rs, health())
    assert (simple.pool, simple.rule_id, simple.escalate_to) == ("small", "auto-simple", "large")
    complex_ = choose_pool(feat("auto", intent="complex"), rs, health())
    assert (complex_.pool, complex_.rule_id, complex_.escalate_to) == ("large", "auto", None)
    assert rs.needs_intent("auto") and not rs.needs_intent("fast")
    # No escalation into a pool that is down or saturated: the small answer stands.
    for large in (PoolHealth(0), PoolHealth(2, queue_depth=11)):
        d = choose_pool(feat("auto", intent="simple"), rs, health(large=large))
        assert (d.pool, d.escalate_to) == ("small", None)


def test_prompt_length_bounds_are_inclusive() -> None:
    rs = ruleset(
        rules=[
            {"rule_id": "short", "match": {"max_prompt_tokens": 100}, "pools": {"small": 1}},
            {"rule_id": "all", "pools": {"large": 1}},
        ]
    )
    assert choose_pool(feat(tokens=100), rs, health()).pool == "small"
    assert choose_pool(feat(tokens=101), rs, health()).pool == "large"


def test_features_of_a_request_and_the_gate_entry_point() -> None:
    req = GenerateRequest(
        request_id="abc",
        tenant="acme",
        klass="interactive",
        model="auto",
        reply_to="x",
        created_at=0,
        deadline=1,
        chat=chat("x" * 400, model="auto"),
    )
    assert features_of(req, "code") == Features("abc", "acme", "interactive", "auto", 100, "code")
    asked: list[str] = []

    def intent_of(r: GenerateRequest) -> str:
        asked.append(r.request_id)
        return "simple"

    rs = ruleset()
    assert decide_request(req, rs, health(), intent_of).rule_id == "auto-simple"
    fast = msgspec.structs.replace(req, model="fast")
    assert decide_request(fast, rs, health(), intent_of).rule_id == "fast"
    assert asked == ["abc"]  # the classifier runs only where a rule needs it
    up = escalated_decision(req, rs, health(), intent_of)
    assert (up.pool, up.rule_id, up.reason) == ("large", "auto-simple", Reason.ESCALATED)
    down = escalated_decision(req, rs, health(large=PoolHealth(0)), intent_of)
    assert (down.pool, down.reason) == ("small", Reason.WEIGHTED)


# -- weights --------------------------------------------------------------------------------------


def test_weights_split_traffic_deterministically_per_request_id() -> None:
    rs = ruleset()
    picks = [choose_pool(feat(rid=f"req-{i}"), rs, health()).pool for i in range(4000)]
    share = Counter(picks)["small"] / len(picks)
    assert 0.72 < share < 0.78  # weights 3 : 1
    again = [choose_pool(feat(rid=f"req-{i}"), rs, health()).pool for i in range(4000)]
    assert picks == again  # the same id always lands on the same pool
    _, shares = route_distribution(feat(), rs)
    assert shares == {"large": 0.25, "small": 0.75}


# -- live health ----------------------------------------------------------------------------------


def test_a_pool_without_ready_workers_is_skipped() -> None:
    rs = ruleset()
    for i in range(200):
        d = choose_pool(feat(rid=str(i)), rs, health(large=PoolHealth(0)))
        assert (d.pool, d.reason) == ("small", Reason.WEIGHTED)
    d = choose_pool(feat(rid="x"), rs, {"small": PoolHealth(1)})  # large and api unknown = down
    assert d.pool == "small"


@pytest.mark.parametrize("busy", [PoolHealth(2, queue_depth=11), PoolHealth(2, ttft_p95_s=1.2)])
def test_a_saturated_pool_is_skipped(busy: PoolHealth) -> None:
    rs = ruleset()
    assert {choose_pool(feat(rid=str(i)), rs, health(small=busy)).pool for i in range(100)} == {"large"}


def test_spill_to_hosted_when_saturated_or_down() -> None:
    rs = ruleset()
    d = choose_pool(feat("quality"), rs, health(large=PoolHealth(2, queue_depth=50)))
    assert (d.pool, d.reason, d.spilled) == ("api", Reason.SPILL_SATURATED, True)
    d = choose_pool(feat("quality"), rs, health(large=PoolHealth(0)))
    assert (d.pool, d.reason) == ("api", Reason.SPILL_DOWN)


def test_hosted_breaker_open_overflows_to_the_least_loaded_live_pool() -> None:
    rs = ruleset()
    h = health(
        small=PoolHealth(1, queue_depth=40), large=PoolHealth(4, queue_depth=60), api=PoolHealth(1, free_slots=0)
    )  # the openai engine reports no slots while open
    d = choose_pool(feat("balanced"), rs, h)
    assert (d.pool, d.reason) == ("large", Reason.OVERFLOW)  # 60/4 waiting per worker < 40/1


def test_no_spill_for_rules_that_keep_data_in_house() -> None:
    rs = ruleset()
    d = choose_pool(feat("fast", tenant="bank"), rs, health(small=PoolHealth(1, queue_depth=99)))
    assert (d.pool, d.reason) == ("small", Reason.OVERFLOW)
    with pytest.raises(Refusal) as exc:
        choose_pool(feat("fast", tenant="bank"), rs, health(small=PoolHealth(0)))
    assert exc.value.code is ErrorCode.no_worker


def test_nothing_ready_anywhere_is_refused() -> None:
    with pytest.raises(Refusal) as exc:
        choose_pool(feat("quality"), ruleset(), {})
    assert exc.value.code is ErrorCode.no_worker


def test_unknown_logical_model_is_refused_as_unknown_model() -> None:
    rs = ruleset(rules=[{"rule_id": "q", "match": {"model": "quality"}, "pools": {"large": 1}}], models=["quality"])
    with pytest.raises(Refusal) as exc:
        choose_pool(feat("fast"), rs, health())
    assert (exc.value.code, exc.value.param) == (ErrorCode.unknown_model, "model")
    assert not rs.serves("fast")


def test_health_board_from_heartbeats_depths_and_ttft() -> None:
    now = [100.0]
    board = HealthBoard(ttft_window_s=60, clock=lambda: now[0])
    beat = dict(engine="sim", model="m", total_slots=8, free_slots=3, token_budget=1000, interval_s=2.0)
    board.on_heartbeat(Heartbeat(worker_id="w1", pool="small", ready=True, **beat))
    board.on_heartbeat(Heartbeat(worker_id="w2", pool="small", ready=True, **beat))
    board.on_heartbeat(Heartbeat(worker_id="w3", pool="large", ready=False, **beat))
    board.set_queue_depth("small", 7)
    for i in range(100):
        board.observe_ttft("small", i / 100)
    snap = board.snapshot()
    assert snap["small"] == PoolHealth(2, 7, 0.95, 6)
    assert snap["large"].ready_workers == 0
    now[0] += 61  # beats are stale, ttft samples aged out
    snap = board.snapshot()
    assert snap["small"].ready_workers == 0 and snap["small"].ttft_p95_s is None


# -- validation -----------------------------------------------------------------------------------


def _error(**changes) -> RuleSetError:
    with pytest.raises(RuleSetError) as exc:
        ruleset(**changes)
    return exc.value


def test_unknown_pool_names_the_field() -> None:
    err = _error(rules=[{"rule_id": "a", "pools": {"nope": 1}}])
    assert err.field == "rules[0].pools.nope" and "unknown pool" in err.message


@pytest.mark.parametrize("weight", [0, -1])
def test_non_positive_weight_names_the_field(weight: float) -> None:
    err = _error(rules=[{"rule_id": "a", "pools": {"small": 1}}, {"rule_id": "b", "pools": {"large": weight}}])
    assert err.field == "rules[1].pools.large" and "> 0" in err.message


def test_empty_pools_and_duplicate_ids() -> None:
    assert _error(rules=[{"rule_id": "a", "pools": {}}]).field == "rules[0].pools"
    err = _error(rules=[{"rule_id": "a", "pools": {"small": 1}}, {"rule_id": "a", "pools": {"large": 1}}])
    assert err.field == "rules[1].rule_id" and "duplicate" in err.message


def test_other_validation_errors_name_their_fields() -> None:
    catch_all = {"rule_id": "z", "pools": {"small": 1}}
    assert (
        _error(rules=[{"rule_id": "a", "match": {"intent": "poetry"}, "pools": {"small": 1}}, catch_all]).field
        == "rules[0].match.intent"
    )
    assert (
        _error(rules=[{"rule_id": "a", "match": {"model": "gpt-9"}, "pools": {"small": 1}}, catch_all]).field
        == "rules[0].match.model"
    )
    err = _error(rules=[{"rule_id": "a", "escalate_to": "huge", "pools": {"small": 1}}])
    assert err.field == "rules[0].escalate_to"
    assert (
        _error(
            rules=[
                {"rule_id": "a", "match": {"min_prompt_tokens": 9, "max_prompt_tokens": 3}, "pools": {"small": 1}},
                catch_all,
            ]
        ).field
        == "rules[0].match.min_prompt_tokens"
    )
    assert _error(pools={}).field == "pools"
    assert _error(rules=[]).field == "rules"
    # A rule set that would leave some `auto` request without a rule is refused up front.
    err = _error(
        rules=[{"rule_id": "a", "match": {"model": "auto", "intent": "code"}, "pools": {"small": 1}}], models=["auto"]
    )
    assert err.field == "rules" and "catch-all" in err.message


def test_type_errors_name_the_field_and_unknown_fields_are_refused() -> None:
    with pytest.raises(RuleSetError) as exc:
        decode(b'{"pools": {"small": {}}, "rules": [{"rule_id": "a", "pools": {"small": "heavy"}}]}')
    assert exc.value.field.startswith("rules[0].pools")
    with pytest.raises(RuleSetError) as exc:
        decode(b'{"pools": {"small": {"gpu": "h100"}}, "rules": []}')
    assert "gpu" in str(exc.value)
    with pytest.raises(RuleSetError) as exc:
        decode(b"not json")
    assert exc.value.field == "$"


def test_round_trip_and_defaults() -> None:
    rs = ruleset()
    assert decode(encode(rs)) == rs
    assert rs.models == ["fast", "balanced", "quality", "auto"]
    assert rs.hosted_pools == ["api"]
    assert all_healthy(rs).keys() == rs.pools.keys()
    assert PoolSpec(cost_in_per_1m=1.0, cost_out_per_1m=2.0).cost(1_000_000, 500_000) == 2.0
    assert validate(msgspec.structs.replace(rs, version=3)).version == 3
