"""A short run of `python -m loadtest.vllm_serve_bench`: vLLM's own benchmark client against the
bridge on the scaled cost-stack fleet. BEHAVIOUR only: every request succeeds, the routing rule
reaches both self-hosted pools, and the report carries each metric at each percentile; never
their values."""

from __future__ import annotations

import argparse
import json

import pytest

from loadtest import vllm_serve_bench
from loadtest.results import to_json
from tests.slow.conftest import vllm_model_dir

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


async def test_vllm_serve_bench_short():
    tokenizer = vllm_model_dir()  # the random dataset needs SmolLM2's tokenizer (skips without vllm)
    parser = argparse.ArgumentParser()
    vllm_serve_bench.configure(parser)
    args = parser.parse_args(["--scale", "0.05", "--duration", "4", "--tokenizer", str(tokenizer)])
    doc = json.loads(to_json(await vllm_serve_bench.run_benchmark(args)))
    prompts = round(doc["plan"]["rate"] * 4)
    result = doc["result"]
    assert result["failed"] == 0, doc["errors"]
    assert result["completed"] == prompts
    for metric in vllm_serve_bench.METRICS:
        for q in vllm_serve_bench.PERCENTILES:
            assert f"p{q}_{metric}_ms" in result
    assert result["request_goodput"] is not None
    assert doc["plan"]["scale"] == 0.05
    assert [p["scaled_replicas"] for p in doc["plan"]["pools"]] == [1, 1]
    routed_pools = {key.split("/")[0] for key in doc["routed"]}
    assert {"small", "large"} <= routed_pools
    assert sum(doc["routed"].values()) == prompts + 1  # + the probe that shows the rules applied
    assert "SCALE FACTOR 0.05" in vllm_serve_bench.render(doc)
