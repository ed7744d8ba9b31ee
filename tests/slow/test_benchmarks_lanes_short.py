"""Short runs of the benchmarks of lanes, fair shares and brokers: behaviour only, never speed, as
test_loadtest_short.py says. A module of their own so that the suite's workers share the short
runs (pytest-xdist hands out a module at a time: tests/conftest.py)."""

from __future__ import annotations

import math

import pytest

from loadtest import fairness, hol, multibroker, noisy
from tests.slow.bench_args import SHED_NOTHING, bench_args

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


async def test_hol_short():
    args = bench_args(
        hol,
        "--duration",
        "4",
        "--warmup",
        "1",
        "--max-seqs",
        "16",
        "--flood-users",
        "20",
        "--flood-tokens",
        "256",
        "--chat-rate",
        "3",
        "--pii",
        "off",
        SHED_NOTHING,
        "--quiet",
    )
    doc = await hol.run_benchmark(args)
    f = doc["figures"]
    assert set(f["phases"]) == {"alone", "flood-alone", "lanes", "fifo"}
    for label in ("alone", "lanes", "fifo"):
        assert f["phases"][label]["chat_ttft_s"]["n"] > 0
        assert f["phases"][label]["chat_errors"] == 0, (label, f["phases"][label])
    assert f["phases"]["flood-alone"]["flood_tokens_per_s"] > 0
    for key in ("lanes_ttft_p95_ratio", "fifo_ttft_p95_ratio", "lanes_batch_share_of_capacity"):
        assert math.isfinite(f[key]) and f[key] > 0
    assert len(doc["runs"]) == 4
    assert "Batch throughput with lanes" in hol.render(doc)


async def test_fairness_short():
    args = bench_args(fairness, "--duration", "5", "--warmup", "1", "--max-seqs", "8", SHED_NOTHING, "--quiet")
    doc = await fairness.run_benchmark(args)
    for label in ("equal", "weighted"):
        f = doc["figures"][label]
        assert f["errors"] == 0
        assert f["tokens"]["heavy"] > 0 and f["tokens"]["light"] > 0
        assert abs(sum(f["share"].values()) - 1.0) < 1e-9
        assert 0 <= f["both_backlogged"] <= 1
    assert doc["figures"]["weighted"]["weights"]["light"] == 3.0
    assert "served share" in fairness.render(doc)


async def test_multibroker_short():
    args = bench_args(
        multibroker,
        "--brokers",
        "1",
        "2",
        "--duration",
        "4",
        "--warmup",
        "1",
        "--max-seqs",
        "16",
        "--flood-users",
        "20",
        "--flood-tokens",
        "64",
        "--chat-rate",
        "3",
        SHED_NOTHING,
        "--quiet",
    )
    doc = await multibroker.run_benchmark(args)
    f = doc["figures"]
    assert set(f) == {"1", "2"} and len(doc["runs"]) == 4
    for n, row in f.items():
        for label in ("alone", "flood"):
            phase = row[label]
            assert phase["errors"] == 0 and phase["chat_ttft_s"]["n"] > 0
            assert math.isfinite(phase["ratio_to_first"]) and phase["ratio_to_first"] > 0
            # One CPU figure per broker process; a short run's may read 0 where clocks tick coarsely.
            assert len(phase["broker_cpu_ms_per_request"]) == len(phase["scheduler"]) == int(n)
            assert all(c >= 0 for c in phase["broker_cpu_ms_per_request"])
        assert row["flood"]["flood_tokens_per_s"] > 0
    assert f["1"]["alone"]["ratio_to_first"] == 1.0
    assert "2 brokers: TTFT p95 within" in multibroker.render(doc)


async def test_noisy_short():
    """The noise comes from processes of its own (a swarm child's flood, a junk publisher): its
    results and counts come back beside the chats'."""
    args = bench_args(
        noisy,
        "--cases",
        "same-flood,junk",
        "--duration",
        "4",
        "--warmup",
        "1",
        "--max-seqs",
        "16",
        "--flood-users",
        "20",
        "--flood-tokens",
        "64",
        "--chat-rate",
        "3",
        "--quiet",
    )
    doc = await noisy.run_benchmark(args)
    f = doc["figures"]["cases"]
    assert set(f) == {"alone", "same-flood", "junk"}
    for case, p in f.items():
        assert p["chat_ttft_s"]["n"] > 0 and p["chat_errors"] == 0, (case, p)
    assert f["same-flood"]["noise_tokens_per_s"] > 0  # the child's results came back
    assert f["junk"]["sent"] > 0 and f["junk"]["permission_errors"] > 0  # the server refused its classes
    for case in ("same-flood", "junk"):
        assert math.isfinite(f[case]["ttft_p95_ratio"]) and isinstance(f[case]["met"], bool)
    for case, p in f.items():  # the chats' usage records came back: their first tokens split
        path = p["ttft_path"]
        assert path["engine"]["n"] > 0 and path["queue"]["p50"] >= 0 and path["engine"]["p50"] > 0, (case, path)
    assert "junk messages sent" in noisy.render(doc)
