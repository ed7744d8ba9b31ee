"""Cost computation from per-token and GPU-hour prices; bounded usage metric labels."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from broker.metrics import UsageMetrics
from core.metering import BadPrice, Meter, PoolPrice, PriceBook, parse_price_book, rates
from schemas.usage import Usage
from tests.records import usage_record


def test_per_token_prices() -> None:
    meter = Meter(PriceBook({"hosted": PoolPrice(usd_per_1m_prompt=0.15, usd_per_1m_completion=0.60)}))
    # 1.5K in / 400 out: the reference design's average request
    assert meter.cost("hosted", 1500, 400) == pytest.approx(1500 * 0.15e-6 + 400 * 0.60e-6)
    assert meter.priced("hosted") and not meter.priced("nowhere")
    assert meter.cost("nowhere", 1500, 400) == 0.0


def test_gpu_hour_prices() -> None:
    # An H100 at $2.50/h that prefills 20,000 tok/s and decodes 2,500 tok/s at planned load.
    price = PoolPrice(gpu_usd_per_hour=2.5, prompt_tokens_per_s=20_000, completion_tokens_per_s=2_500)
    r = rates("gpu", price)
    assert r.prompt == pytest.approx(2.5 / 3600 / 20_000)
    assert r.completion == pytest.approx(2.5 / 3600 / 2_500)
    # Idle paid hours are part of the cost: at 50% utilization each token costs twice as much.
    half = rates("gpu", PoolPrice(gpu_usd_per_hour=2.5, tokens_per_s=2_500, utilization=0.5))
    assert half.prompt == half.completion == pytest.approx(2 * 2.5 / 3600 / 2_500)


def test_cached_responses_cost_a_fraction() -> None:
    book = PriceBook({"p": PoolPrice(usd_per_1m_prompt=1.0, usd_per_1m_completion=2.0)}, cached_fraction=0.1)
    meter = Meter(book)
    assert meter.cost("p", 1_000_000, 0, cached=True) == pytest.approx(0.1)
    assert Meter(PriceBook(book.pools)).cost("p", 1_000_000, 0, cached=True) == 0.0


def test_a_class_pays_its_share_of_the_price() -> None:
    """The batch price: `class_fraction` {"batch": 0.5} halves what a batch line costs, prefix hits
    and their savings included; other classes pay the full price; the book refuses a share > 1."""
    book = parse_price_book(
        {
            "pools": {"p": {"usd_per_1m_prompt": 2, "usd_per_1m_completion": 8, "usd_per_1m_cached_prompt": 1}},
            "class_fraction": {"batch": 0.5},
        }
    )
    meter = Meter(book)
    assert meter.cost("p", 1_000_000, 1_000_000, klass="interactive") == pytest.approx(10.0)
    assert meter.cost("p", 1_000_000, 1_000_000, klass="batch") == pytest.approx(5.0)
    assert meter.cost("p", 1_000_000, 0, cached_tokens=1_000_000, klass="batch") == pytest.approx(0.5)
    assert meter.prefix_saved("p", 1_000_000, "batch") == pytest.approx(0.5)
    with pytest.raises(BadPrice):
        parse_price_book({"class_fraction": {"batch": 1.5}})


def test_price_book_from_toml_table() -> None:
    book = parse_price_book(
        {
            "pools": {
                "sim": {"gpu_usd_per_hour": 4.0, "tokens_per_s": 1000},
                "hosted": {"usd_per_1m_prompt": 3, "usd_per_1m_completion": 15},
            }
        }
    )
    assert Meter(book).cost("hosted", 1_000_000, 1_000_000) == pytest.approx(18.0)
    assert Meter(book).cost("sim", 0, 3600) == pytest.approx(4.0 * 3600 / 3600 / 1000)


@pytest.mark.parametrize(
    "raw, param",
    [
        ({"pools": {"a": {"usd_per_1m_prompt": 1.0}}}, "pools.a.usd_per_1m_completion"),
        ({"pools": {"a": {"gpu_usd_per_hour": 2.0}}}, "pools.a.prompt_tokens_per_s"),
        (
            {"pools": {"a": {"gpu_usd_per_hour": 2.0, "usd_per_1m_prompt": 1, "usd_per_1m_completion": 1}}},
            "pools.a.gpu_usd_per_hour",
        ),
        ({"pools": {"a": {}}}, "pools.a"),
        ({"pools": {"a": {"usd_per_1m_prompt": -1, "usd_per_1m_completion": 1}}}, "pools.a.usd_per_1m_prompt"),
        ({"pools": {"a": {"gpu_usd_per_hour": 2, "tokens_per_s": 0}}}, "pools.a.tokens_per_s"),
        ({"pools": {"a": {"gpu_usd_per_hour": 2, "tokens_per_s": 9, "utilization": 1.5}}}, "pools.a.utilization"),
    ],
)
def test_bad_prices_name_the_field(raw, param) -> None:
    with pytest.raises(BadPrice) as err:
        parse_price_book(raw)
    assert err.value.param == param


def test_unknown_price_field_is_refused() -> None:
    with pytest.raises(BadPrice, match="usd_per_1k_prompt"):
        parse_price_book(b'{"pools": {"a": {"usd_per_1k_prompt": 1}}}')


def _usage(tenant: str, model: str, cached: bool = False) -> Usage:
    return usage_record(
        tenant=tenant,
        model=model,
        served_model="m@1",
        prompt_tokens=100,
        completion_tokens=20,
        ttft_s=0.01,
        total_s=0.1,
        finished_at=0.0,
        cached=cached,
        cost_usd=0.5,
    )


def test_usage_metrics_labels_stay_bounded() -> None:
    registry = CollectorRegistry()
    metrics = UsageMetrics(registry, tenants=["acme"], models=["chat"])
    metrics.observe(_usage("acme", "chat"))
    metrics.observe(_usage("acme", "chat", cached=True))
    for i in range(50):  # unknown tenants/models never mint new series
        metrics.observe(_usage(f"t{i}", f"m{i}"))
    get = registry.get_sample_value
    assert get("laneway_usage_tokens_total", {"tenant": "acme", "model": "chat", "kind": "prompt"}) == 200
    assert get("laneway_usage_cost_usd_total", {"tenant": "acme", "model": "chat"}) == pytest.approx(1.0)
    assert get("laneway_usage_requests_total", {"tenant": "acme", "model": "chat", "cached": "true"}) == 1
    assert get("laneway_usage_requests_total", {"tenant": "other", "model": "other", "cached": "false"}) == 50
    tenants = {s.labels["tenant"] for m in registry.collect() for s in m.samples if "tenant" in s.labels}
    assert tenants == {"acme", "other"}
