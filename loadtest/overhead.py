"""Benchmark: Laneway's own overhead. The sim engine (zero GPU time) driven directly vs through
bridge + broker + worker (`laneway up`, separate processes, real nats-server), in ONE run.

    python -m loadtest.overhead [--concurrency 1 32 256] [--requests 200] [--json out.json]
                                [--shape plain|tools|json_schema]

Added TTFT = TTFT through Laneway − TTFT of the engine alone, per percentile. CPU per request
sums user+system time of every Laneway process (nats-server included) over the run; the worker's
share includes the simulated engine's own Python work, so the CPU the engine alone spends per
request (measured in the direct phase) is printed too, and Laneway's CPU net of it. The engine
is a SIMULATION with no GPU time, so every other figure here is Laneway's cost, not a model's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import msgspec

from loadtest.http_client import stream_chat
from loadtest.processes import LanewayUp
from loadtest.stats import ms, summary
from schemas.openai import ChatBody
from workers.engine import EngineRequest
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.roofline import PROFILES

KEY = "sk-bench-overhead"
PROMPT = ("Summarise the following support conversation for the account team. " * 90)[:6144]

# What a customer-service agent sends besides plain chat: a tool call, or a JSON answer.
_ORDER = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}, "include_items": {"type": "boolean"}},
    "required": ["order_id"],
}
SHAPES: dict[str, dict] = {
    "plain": {},
    "tools": {
        "tools": [{"type": "function", "function": {"name": "lookup_order", "parameters": _ORDER}}],
        "tool_choice": "required",
    },
    "json_schema": {
        "response_format": {"type": "json_schema", "json_schema": {"name": "order", "schema": _ORDER, "strict": True}}
    },
}


def _body(shape: str, max_tokens: int) -> dict:
    return {
        "model": "laneway-sim",
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": PROMPT}],
        **SHAPES[shape],
    }


async def _bounded(concurrency: int, total: int, one) -> list:
    results = []
    queue = iter(range(total))

    async def lane():
        for i in queue:
            results.append(await one(i))

    await asyncio.gather(*(lane() for _ in range(concurrency)))
    return results


async def direct(concurrency: int, total: int, max_tokens: int, shape: str) -> tuple[list[float], float]:
    """TTFTs of the engine driven in-process, and the CPU seconds it took."""
    engine = SimEngine(PROFILES["zero"])
    await engine.start()
    body = msgspec.convert(_body(shape, max_tokens), ChatBody)

    async def one(i: int) -> float:
        request = EngineRequest(f"d{i}", body)
        start = time.perf_counter()
        ttft = None
        async for out in engine.generate(request):
            if ttft is None and (out.text or out.tool_calls):
                ttft = time.perf_counter() - start
        assert ttft is not None, f"d{i}: the engine answered with no text"
        return ttft

    cpu0 = time.process_time()
    try:
        return await _bounded(concurrency, total, one), time.process_time() - cpu0
    finally:
        await engine.cleanup()


async def through(
    up: LanewayUp, concurrency: int, total: int, max_tokens: int, shape: str
) -> tuple[list, float, float, dict[str, float]]:
    body = {**_body(shape, max_tokens), "stream": True, "stream_options": {"include_usage": True}}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        await _bounded(min(concurrency, 8), 16, lambda i: stream_chat(session, up.url, KEY, body))  # warm
        cpu0, roles0, t0 = up.cpu(), up.cpu_by_role(), time.perf_counter()
        results = await _bounded(concurrency, total, lambda i: stream_chat(session, up.url, KEY, body))
        elapsed, cpu = time.perf_counter() - t0, up.cpu() - cpu0
        roles = {role: seconds - roles0[role] for role, seconds in up.cpu_by_role().items()}
    return results, cpu, elapsed, roles


async def run_benchmark(levels: list[int], requests: int, max_tokens: int, shape: str = "plain") -> dict:
    report: dict = {
        "engine": "sim/zero (SIMULATION: no GPU time)",
        "prompt_bytes": len(PROMPT),
        "max_tokens": max_tokens,
        "shape": shape,
        "levels": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        async with LanewayUp(Path(tmp) / "lw", KEY, ["--sim-profile", "zero"]) as up:
            for c in levels:
                n = max(requests, 2 * c)
                ttfts, engine_cpu = await direct(c, n, max_tokens, shape)
                base = summary(ttfts)
                results, cpu, elapsed, roles = await through(up, c, n, max_tokens, shape)
                ok = [r for r in results if r.ok]
                lw = summary([r.ttft for r in ok if r.ttft is not None])
                report["levels"].append(
                    {
                        "concurrency": c,
                        "requests": n,
                        "errors": len(results) - len(ok),
                        "direct_ttft": base,
                        "laneway_ttft": lw,
                        "added_ttft_p50": lw["p50"] - base["p50"],
                        "added_ttft_p99": lw["p99"] - base["p99"],
                        "cpu_ms_per_request": 1000 * cpu / n,
                        "engine_cpu_ms_per_request": 1000 * engine_cpu / n,
                        "net_cpu_ms_per_request": 1000 * (cpu - engine_cpu) / n,
                        "requests_per_s": n / elapsed,
                        "cpu_ms_per_request_by_role": {role: 1000 * seconds / n for role, seconds in roles.items()},
                        "tokens_per_s": sum(r.tokens for r in ok) / elapsed,
                    }
                )
    return report


def render(report: dict) -> str:
    lines = [
        f"Overhead: {report['engine']}, {report['prompt_bytes']} B prompt, "
        f"{report['max_tokens']} tokens out at most, {report.get('shape', 'plain')} requests",
        f"{'c':>4} {'n':>5} {'err':>4} | {'direct p50':>11} {'direct p99':>11} | "
        f"{'laneway p50':>12} {'laneway p99':>12} | {'added p50':>10} {'added p99':>10} | "
        f"{'CPU/req':>9} {'engine':>9} {'net':>9} {'req/s':>7} {'tok/s':>8}",
    ]
    for lv in report["levels"]:
        d, lw = lv["direct_ttft"], lv["laneway_ttft"]
        lines.append(
            f"{lv['concurrency']:>4} {lv['requests']:>5} {lv['errors']:>4} | {ms(d['p50']):>11} "
            f"{ms(d['p99']):>11} | {ms(lw['p50']):>12} {ms(lw['p99']):>12} | "
            f"{ms(lv['added_ttft_p50']):>10} {ms(lv['added_ttft_p99']):>10} | "
            f"{lv['cpu_ms_per_request']:>6.2f} ms {lv['engine_cpu_ms_per_request']:>6.2f} ms "
            f"{lv['net_cpu_ms_per_request']:>6.2f} ms {lv['requests_per_s']:>7.1f} {lv['tokens_per_s']:>8.0f}"
        )
    for lv in report["levels"]:
        lines.append(
            f"c={lv['concurrency']} CPU/req by process: "
            + ", ".join(f"{role} {ms_:.2f} ms" for role, ms_ in lv["cpu_ms_per_request_by_role"].items())
        )
    lines.append(
        "CPU/req: every Laneway process, nats-server included; engine: the sim engine alone "
        "(direct phase); net: CPU/req − engine."
    )
    lines.append("Targets: added TTFT p50 ≤ 3 ms at c=1, p99 ≤ 25 ms at c=32; CPU per request ≤ 2 ms.")
    return "\n".join(lines)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32, 256])
    parser.add_argument("--requests", type=int, default=200, help="per level (at least 2×c)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        default="plain",
        help="plain chat, a required tool call, or a json_schema answer",
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")


def run(args: argparse.Namespace) -> int:
    report = asyncio.run(run_benchmark(args.concurrency, args.requests, args.max_tokens, args.shape))
    print(render(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    configure(p)
    sys.exit(run(p.parse_args()))
