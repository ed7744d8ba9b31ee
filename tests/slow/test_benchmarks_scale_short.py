"""Short runs of the benchmarks of affinity and scale: behaviour only, never speed, as
test_loadtest_short.py says. A module of their own so that the suite's workers share the short
runs (pytest-xdist hands out a module at a time: tests/conftest.py)."""

from __future__ import annotations

import math

import pytest

from loadtest import affinity, scale
from tests.slow.bench_args import SHED_NOTHING, bench_args

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


async def test_affinity_short():
    """Two workers, a few sessions: every turn metered with the worker that served it, and with
    affinity on, a conversation's next turn is served where its history was."""
    args = bench_args(
        affinity,
        "--workers",
        "2",
        "--sessions",
        "3",
        "--duration",
        "12",
        "--warmup",
        "0",
        "--turns",
        "4",
        "--think",
        "0.3",
        SHED_NOTHING,
        "--quiet",
    )
    doc = await affinity.run_benchmark(args)
    runs = doc["runs"]
    assert set(runs) == {"one", "on", "off"}
    for r in runs.values():
        assert r["turns"] > 0 and r["errors"] == 0
        assert r["metered"] == r["turns"]  # every turn's usage record was read back
        assert 0 < r["hit_rate"] < 1 and r["cached_tokens"] > 0
        assert sum(r["per_worker"].values()) == r["metered"] and len(r["per_worker"]) <= r["workers"]
    assert runs["one"]["stayed"] == 1.0
    assert runs["on"]["stayed"] >= 0.75, runs["on"]
    assert set(doc["figures"]) >= {"on_ttft_p95_ratio", "on_hit_points_below_one", "on_imbalance"}
    assert "Affinity on, 2 workers vs 1" in affinity.render(doc)


async def test_scale_short():
    args = bench_args(
        scale, "--clients", "200", "--workers", "2", "--ramp", "2", "--hold", "3", "--stream-rate", "4", "--quiet"
    )
    doc = await scale.run_benchmark(args)
    f = doc["figures"]
    assert f["error_count"] == 0, f["errors"]
    assert f["streams_with_tokens"] == 200
    assert f["open_streams_bridge"] == 200
    assert f["frame_lag_s"]["n"] > 0 and math.isfinite(f["frame_lag_s"]["p99"])
    assert set(f["rss_per_stream_bytes"]) == {"nats-server", "bridge", "broker", "worker"}
    assert f["rss_during"]["bridge"] > 0
    assert f["client_procs"] == 2 and f["client_cpu_cores"] >= 0  # the generator's processes, apart
    assert "memory per open stream" in scale.render(doc)


async def test_scale_find_max_short():
    """Steps up until one misses (a loaded CI machine may miss the lag target at any step): the
    most held is the step before the first miss, and the miss says why."""
    args = bench_args(
        scale,
        "--find-max",
        "--steps",
        "40,80",
        "--workers",
        "1",
        "--ramp",
        "1",
        "--hold",
        "2",
        "--stream-rate",
        "4",
        "--client-procs",
        "1",
        "--quiet",
    )
    doc = await scale.run_benchmark(args)
    steps = doc["figures"]["steps"]
    ran = sorted(steps)
    assert ran == [40, 80][: len(ran)] and len(doc["runs"]) == len(ran)
    missed = [n for n in ran if steps[n]["missed"]]
    assert missed in ([], [ran[-1]])  # it stops at the first miss
    assert doc["figures"]["max_held"] == max((n for n in ran if n not in missed), default=0)
    assert "Most streams held" in scale.render(doc)
