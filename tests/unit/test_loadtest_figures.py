"""The load generator's arithmetic, without any server: percentiles from Prometheus buckets,
token arrival times, windows, SLO attainment, scenario scaling and the settings it writes."""

from __future__ import annotations

import math
import tomllib

from core.policy.tenants import hash_key
from core.promtext import bucket_delta, fraction_at_most, histogram_quantile, parse
from loadtest import scenarios
from loadtest.fleet import api_key, settings_toml
from loadtest.http_client import Result
from loadtest.results import group_stats, to_json, token_times, tokens_in


def test_histogram_quantile_interpolates_inside_the_bucket():
    buckets = [(0.01, 50.0), (0.1, 90.0), (1.0, 100.0), (math.inf, 100.0)]
    assert histogram_quantile(buckets, 0.5) == 0.01
    assert math.isclose(histogram_quantile(buckets, 0.7), 0.01 + 0.09 * 0.5)
    assert math.isclose(histogram_quantile(buckets, 0.99), 0.1 + 0.9 * 0.9)
    assert fraction_at_most(buckets, 0.1) == 0.9
    assert math.isnan(histogram_quantile([], 0.5))


def test_bucket_delta_and_parse():
    text = (
        '# TYPE lag histogram\nlag_bucket{le="0.1"} 3\nlag_bucket{le="+Inf"} 4\nlag_count 4\nlag_sum 1\n'
        "# TYPE laneway_open_streams gauge\nlaneway_open_streams 7\n"
    )
    scrape = parse(text)
    assert scrape.value("laneway_open_streams") == 7
    assert bucket_delta(scrape.buckets("lag"), [(0.1, 1.0), (math.inf, 1.0)]) == [(0.1, 2.0), (math.inf, 3.0)]


def test_token_times_and_window():
    r = Result(ttft=0.5, gaps=[0.1, 0.1], tokens=3, started_at=100.0, status=200)
    assert [round(t, 3) for t in token_times(r)] == [100.5, 100.6, 100.7]
    assert tokens_in([r], 100.55, 101.0) == 2
    assert token_times(Result(started_at=1.0)) == []


def test_group_stats_counts_errors_as_slo_misses_and_excludes_warmup():
    ok = [Result(ttft=0.1 * i, e2e=1.0, tokens=1, started_at=10.0, status=200) for i in range(1, 10)]
    warm = Result(ttft=50.0, e2e=51.0, tokens=1, started_at=1.0, status=200)
    failed = Result(error="queue_full", status=429, started_at=11.0)
    cut = Result(started_at=12.0, cut=True)
    g = group_stats([*ok, warm, failed, cut], (5.0, 20.0))
    assert g["requests"] == 11 and g["failed"] == 1 and g["errors"] == {"queue_full": 1}
    assert g["cut_waiting"] == 1 and g["ttft_s"]["n"] == 9
    assert g["slo"]["ttft_800ms"]["attainment"] == 7 / 10  # 0.1..0.7 s of 9, plus 1 failure
    assert g["slo"]["ttft_800ms"]["met"] is False
    assert "NaN" not in to_json({"x": group_stats([], (0.0, 1.0))})


def test_scenarios_scale_down_and_keep_shapes():
    s = scenarios.get("cost-stack-120qps")
    assert math.isclose(sum(f.rate for f in s.flows), 120.0)
    small = s.scaled(0.05)
    assert math.isclose(sum(f.rate for f in small.flows), 6.0)
    assert all(f.prompt_tokens == 1500 and f.max_tokens == 400 for f in small.flows)
    assert all(p.workers >= 1 for p in small.pools)
    b2b = scenarios.get("b2b-100k-dau")
    assert sum(f.users for f in b2b.flows) == 5000 and all(f.think_s > 0 for f in b2b.flows)
    assert set(scenarios.SCENARIOS) == {"b2b-100k-dau", "cost-stack-120qps", "batch-flood", "two-tenant-fairness"}


def test_settings_toml_loads_with_hashed_keys_and_weights():
    s = scenarios.get("cost-stack-120qps")
    doc = tomllib.loads(settings_toml(s.tenants, s.pools))
    assert doc["tenants"]["acme"]["api_key_sha256"] == [hash_key(api_key("acme"))]
    assert doc["tenants"]["acme"]["weight"] == 1.0
    assert doc["models"] == {"laneway-70b": {"pool": "large"}, "laneway-8b": {"pool": "small"}}
