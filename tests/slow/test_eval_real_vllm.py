"""The eval gate on the real small vLLM model: the golden set runs through `laneway up --engine
vllm` (SmolLM2-135M) and through a simulated pool; a rules change that moves the traffic from
the real model to the simulated one loses quality and is refused (exit 3), unless forced."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import aiohttp
import pytest
import pytest_asyncio

from core.models import put_models
from core.policy.tenants import hash_key
from core.routing.eval_gate import load_results
from core.settings import LogicalModel
from laneway import ops_eval
from laneway.cli import build_parser
from loadtest.processes import LanewayUp
from schemas.subjects import Subjects
from tests.slow.conftest import vllm_model_dir
from tests.wait import eventually

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(1500)]

KEY = "sk-eval"
MODELS = ["auto", "fast", "balanced", "quality"]


def rules(pool: str, reason: str) -> dict:
    return {
        "pools": {"vllm": {"cost_out_per_1m": 0.2}, "sim": {"cost_out_per_1m": 0.01}},
        "rules": [{"rule_id": "all", "pools": {pool: 1}}],
        "models": MODELS,
        "reason": reason,
    }


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def up(tmp_path_factory):
    model = vllm_model_dir()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    root = tmp_path_factory.mktemp("eval")
    settings = root / "settings.toml"
    settings.write_text(f'[tenants.eval]\napi_key_sha256 = ["{hash_key(KEY)}"]\n\n[models.smollm2]\npool = "vllm"\n')
    extra = [
        "--settings",
        str(settings),
        "--engine",
        "vllm",
        "--model",
        str(model),
        "--pool",
        "vllm",
        "--kv-cache-bytes",
        "256MiB",
        "--max-model-len",
        "2048",
        "--max-num-seqs",
        "16",
        "--pii",
        "off",
    ]
    async with LanewayUp(root / "lw", KEY, extra) as running:
        sim = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "laneway.cli",
            "worker",
            "--nats-url",
            running.nats_url,
            "--pool",
            "sim",
            "--engine",
            "sim",
            "--sim-profile",
            "zero",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            env=running.nats_env("svc-worker"),
        )
        # The simulated pool joins live: its model is added to the routing bucket once it runs.
        nc = await running.connect_nats("ops")
        await put_models(
            nc.jetstream(),
            Subjects("lw"),
            {"smollm2": LogicalModel(pool="vllm"), "laneway-sim": LogicalModel(pool="sim")},
        )
        await nc.close()
        async with aiohttp.ClientSession() as http:

            async def sim_ready() -> bool:
                async with http.get(f"{running.url}/readyz") as resp:
                    return resp.status == 200 and bool((await resp.json())["pools"].get("sim"))

            assert await eventually(sim_ready, timeout=60, interval=0.5), "the sim pool never joined"
        yield running, root
        sim.terminate()
        await sim.wait()


async def test_gate_refuses_moving_traffic_off_the_real_model(up, capsys):
    running, root = up
    good, bad = root / "good.json", root / "bad.json"
    good.write_text(json.dumps(rules("vllm", "baseline")))
    bad.write_text(json.dumps(rules("sim", "cheaper")))
    scores = root / "scores.json"
    ops_user, ops_password = running.credentials("ops")
    argv = [
        "eval",
        "--nats-url",
        running.nats_url,
        "--nats-user",
        ops_user,
        "--nats-password",
        ops_password,
        "--rules",
        str(bad),
        "--baseline",
        str(good),
        "--base-url",
        running.url,
        "--api-key",
        KEY,
        "--pool-model",
        "vllm=smollm2",
        "--pool-model",
        "sim=laneway-sim",
        "--save-scores",
        str(scores),
    ]
    code = await ops_eval.run(build_parser().parse_args(argv))
    printed = capsys.readouterr().out
    print(printed)
    assert code == 3, printed  # blocked: quality fell more than 1 point
    real = load_results(scores)["vllm"]
    assert any(r.score > 0 for r in real.values()), "the real model should answer some golden prompts"
    forced = await ops_eval.run(
        build_parser().parse_args([*argv[:-2], "--scores", str(scores), "--force-reason", "cost experiment"])
    )
    assert forced == 0
