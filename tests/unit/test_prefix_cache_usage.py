"""Prefix-cache hits as real tokens: the wire keeps older records readable, the sim reports its
hits per tenant scope (cache salt), the price book prices them, and the edge renders them."""

from __future__ import annotations

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from bridge.render.chat import usage_of
from broker.metrics import UsageMetrics
from core.metering import BadPrice, Meter, PoolPrice, PriceBook, parse_price_book
from schemas import codec
from schemas.frames import Finished, TokenFrame, TokenUsage
from schemas.openai import ChatBody
from tests.records import usage_record
from workers.engine import EngineRequest
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.roofline import PROFILES
from workers.engines.sim.scheduler import BLOCK

LONG = "You are a support agent for a parcel company; answer in two sentences. " * 60  # ~1,000 tokens


# -- the wire: append-only ----------------------------------------------------------------------
class _OldTokenUsage(msgspec.Struct, array_like=True):
    prompt_tokens: int
    completion_tokens: int


class _OldFinished(msgspec.Struct, tag=1, array_like=True):
    request_id: str
    attempt: int
    seq: int
    finish_reason: str
    usage: _OldTokenUsage


class _OldFrame(msgspec.Struct, array_like=True):
    source: str
    entries: list[_OldFinished]


def test_a_frame_from_an_older_worker_decodes_with_no_hits() -> None:
    old = msgspec.msgpack.encode(_OldFrame("w1", [_OldFinished("r1", 1, 0, "stop", _OldTokenUsage(1500, 40))]))
    (finished,) = codec.decode_frame(old).entries
    assert isinstance(finished, Finished) and finished.usage == TokenUsage(1500, 40, 0)
    new = codec.encode(TokenFrame("w1", [Finished("r1", 1, 0, "stop", TokenUsage(1500, 40, 1024))]))
    assert codec.decode_frame(new).entries[0].usage.cached_tokens == 1024


def test_an_older_usage_record_decodes_with_no_hits() -> None:
    record = usage_record("r1", klass="chat", pool="p", prompt_tokens=1500, completion_tokens=40, total_s=1.0)
    old = msgspec.msgpack.decode(codec.encode(record))
    assert "cached_tokens" not in old and "prefix_saved_usd" not in old  # omitted at their defaults
    decoded = codec.decode_usage(msgspec.msgpack.encode(old))
    assert (decoded.cached_tokens, decoded.prefix_saved_usd) == (0, 0.0)
    hit = msgspec.structs.replace(record, cached_tokens=1024, prefix_saved_usd=0.5)
    assert codec.decode_usage(codec.encode(hit)).cached_tokens == 1024


# -- pricing ------------------------------------------------------------------------------------
def test_cached_prompt_tokens_are_charged_the_cached_input_price() -> None:
    book = parse_price_book(
        {"pools": {"hosted": {"usd_per_1m_prompt": 2.0, "usd_per_1m_cached_prompt": 0.5, "usd_per_1m_completion": 8.0}}}
    )
    meter = Meter(book)
    # 1M prompt tokens of which 600K were cache hits, 100K completion tokens.
    assert meter.cost("hosted", 1_000_000, 100_000, cached_tokens=600_000) == pytest.approx(0.8 + 0.3 + 0.8)
    assert meter.prefix_saved("hosted", 600_000) == pytest.approx(0.6 * 1.5)
    assert meter.cost("hosted", 1_000_000, 0, cached_tokens=2_000_000) == pytest.approx(0.5)  # capped
    assert meter.cost("hosted", 1_000_000, 0) == pytest.approx(2.0)


def test_without_a_cached_price_hits_cost_the_prompt_price() -> None:
    meter = Meter(PriceBook({"p": PoolPrice(usd_per_1m_prompt=1.0, usd_per_1m_completion=2.0)}))
    assert meter.cost("p", 1_000_000, 0, cached_tokens=900_000) == pytest.approx(1.0)
    assert meter.prefix_saved("p", 900_000) == 0.0
    assert meter.prefix_saved("unpriced", 900_000) == 0.0


def test_from_gpu_hours_a_hit_costs_no_prefill() -> None:
    meter = Meter(
        parse_price_book(
            {"pools": {"gpu": {"gpu_usd_per_hour": 3.6, "prompt_tokens_per_s": 1000, "completion_tokens_per_s": 100}}}
        )
    )
    assert meter.cost("gpu", 1000, 0) == pytest.approx(0.001)
    assert meter.cost("gpu", 1000, 0, cached_tokens=750) == pytest.approx(0.00025)
    assert meter.prefix_saved("gpu", 750) == pytest.approx(0.00075)


@pytest.mark.parametrize(
    "pool",
    [
        {"usd_per_1m_prompt": 1.0, "usd_per_1m_completion": 2.0, "usd_per_1m_cached_prompt": 1.5},
        {"gpu_usd_per_hour": 2.0, "tokens_per_s": 1000, "usd_per_1m_cached_prompt": 0.1},
        {"usd_per_1m_prompt": 1.0, "usd_per_1m_completion": 2.0, "usd_per_1m_cached_prompt": -1},
    ],
)
def test_bad_cached_prices_name_the_field(pool) -> None:
    with pytest.raises(BadPrice) as err:
        parse_price_book({"pools": {"a": pool}})
    assert err.value.param == "pools.a.usd_per_1m_cached_prompt"


# -- the sim reports its hits, per cache salt -----------------------------------------------------
async def _cached(engine: SimEngine, rid: str, salt: str) -> tuple[int, int]:
    body = msgspec.convert({"model": "sim", "messages": [{"role": "user", "content": LONG}], "max_tokens": 2}, ChatBody)
    outs = [o async for o in engine.generate(EngineRequest(rid, body, cache_salt=salt, tenant=salt))]
    return outs[-1].prompt_tokens, outs[-1].cached_tokens


async def test_the_sim_reports_prefix_hits_within_a_salt_only() -> None:
    engine = SimEngine(PROFILES["zero"])
    await engine.start()
    try:
        prompt, first = await _cached(engine, "r1", "acme")
        assert prompt >= 20 * BLOCK and first == 0
        _, again = await _cached(engine, "r2", "acme")
        assert again == (prompt - 1) // BLOCK * BLOCK  # every full block but the last token's
        _, other = await _cached(engine, "r3", "globex")  # the same prompt, another tenant scope
        assert other == 0
    finally:
        await engine.cleanup()


# -- the edge renders them --------------------------------------------------------------------------
def test_chat_usage_carries_prompt_tokens_details() -> None:
    usage = msgspec.to_builtins(usage_of(Finished("r", 1, 0, "stop", TokenUsage(1500, 40, 1024))))
    assert usage == {
        "prompt_tokens": 1500,
        "completion_tokens": 40,
        "total_tokens": 1540,
        "prompt_tokens_details": {"cached_tokens": 1024},
    }


# -- metrics: the board's hit rate and money saved --------------------------------------------------
def test_usage_metrics_count_hits_and_savings_apart_from_tokens() -> None:
    registry = CollectorRegistry()
    metrics = UsageMetrics(registry, tenants=["acme"], models=["chat"])
    base = usage_record(klass="chat", model="chat", pool="p", prompt_tokens=1000, completion_tokens=10, total_s=1.0)
    metrics.observe(msgspec.structs.replace(base, cached_tokens=768, prefix_saved_usd=0.25))
    metrics.observe(base)
    get, labels = registry.get_sample_value, {"tenant": "acme", "model": "chat"}
    assert get("laneway_usage_tokens_total", {**labels, "kind": "prompt"}) == 2000  # hits stay within
    assert get("laneway_usage_cached_prompt_tokens_total", labels) == 768
    assert get("laneway_usage_prefix_saved_usd_total", labels) == pytest.approx(0.25)
