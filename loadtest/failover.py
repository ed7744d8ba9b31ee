"""Benchmark: a worker SIGKILLed mid-stream, as its clients see it. ONE run on one `laneway up`
with `--workers` simulated workers (2: the worst case, one survivor takes every moved stream; the
killed one is started beside `up`, so nothing restarts it):

    python -m loadtest.failover [--workers 2] [--streams 100] [--stream-rate 30] [--kill-after 5] [--json out.json]

`--streams` clients each stream one chat (`--prompt-bytes` ~1.5K tokens in, `--max-tokens` out,
the reference documents' shape) at `--stream-rate` tokens/s. Once every stream has tokens on the
wire for `--kill-after` seconds, the worker started beside `up` is SIGKILLed. Then:

  stall         per stream that went on elsewhere (its usage record counts `continued_tokens`):
                the last token before the kill → the next one after, p50/p99 (target p99 ≤ 2 s)
  survivors     the streams of the worker that lived: their inter-token gap p50 before the kill
                and after it (the continued streams' prefill shares its steps: the cost to them)
  throughput    all streams' tokens/s in the `--window` seconds before the kill and after the
                stalls ended
  answers       streams that completed, and that failed (a continuation promises none)

Engine: SIMULATION (llama-8b-h100 step times, vLLM V1 scheduling; a floor on the step sets the
stream rate). The kill is found by the worker's NATS connection closing (broker/worker_probes.py).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import os
import signal
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import aiohttp

from core.usage_log import read_usage
from loadtest.benchcli import add_output_flags, main, run_and_report
from loadtest.fleet import Fleet
from loadtest.http_client import Result, stream_chat
from loadtest.scenarios import PoolSpec, TenantSpec
from loadtest.stats import summary
from schemas.subjects import Subjects
from workers.engines.sim.roofline import PROFILES

TENANT = "acme"
TARGET_P99_S = 2.0


def body(i: int, args: argparse.Namespace) -> dict:
    words = " ".join(f"w{i}x{j}" for j in range(args.prompt_bytes // 8))
    return {
        "model": "laneway-sim",
        "stream": True,
        "max_tokens": args.max_tokens,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": f"stream {i}: {words}"}],
    }


def arrivals(r: Result, start: float) -> list[float]:
    """When each content chunk reached the client (perf_counter)."""
    if r.ttft is None:
        return []
    first = start + r.ttft
    return [first, *(first + t for t in itertools.accumulate(r.gaps))]


def stall(times: list[float], kill: float) -> float | None:
    """The wait that spans the kill: last chunk before it → first after; None if none spans it.
    The longest gap ending after the kill: on a busy client the chunks already on their way when
    the worker died are read (and timed) after the kill, and the stall is the gap after them."""
    return max((b - a for a, b in itertools.pairwise(times) if b >= kill), default=None)


def rate(streams: list[list[float]], lo: float, hi: float) -> float:
    return sum(1 for times in streams for t in times if lo <= t < hi) / (hi - lo) if hi > lo else 0.0


def gaps_p50(streams: list[list[float]], lo: float, hi: float) -> float:
    return summary([b - a for times in streams for a, b in itertools.pairwise(times) if lo <= a and b < hi])["p50"]


async def run_benchmark(args: argparse.Namespace) -> dict:
    pool = PoolSpec(workers=args.workers, max_seqs=args.max_seqs, min_step_s=round(1.0 / args.stream_rate, 6))
    with tempfile.TemporaryDirectory(prefix="laneway-failover-") as tmp:
        async with Fleet(Path(tmp) / "lw", [TenantSpec(TENANT)], [pool], up_flags=["--pii", "off"]) as fleet:
            since = datetime.now(UTC)
            results = [Result() for _ in range(args.streams)]
            starts = [0.0] * args.streams
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

                async def one(i: int) -> None:
                    starts[i] = time.perf_counter()
                    await stream_chat(
                        http, fleet.url, fleet.keys[TENANT], body(i, args), result=results[i], since=starts[i]
                    )

                tasks = [asyncio.create_task(one(i)) for i in range(args.streams)]
                deadline = time.monotonic() + 120
                while not all(r.ttft is not None or r.error for r in results) and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                await asyncio.sleep(args.kill_after)
                victim = fleet.extra[0].pid
                kill = time.perf_counter()
                os.kill(victim, signal.SIGKILL)
                await asyncio.gather(*tasks)
            assert fleet.up is not None
            nc = await fleet.up.connect_nats("ops")
            try:
                usage = {u.request_id: u async for u in read_usage(nc.jetstream(), Subjects(), TENANT, since)}
            finally:
                await nc.close()
    times = [arrivals(r, s) for r, s in zip(results, starts, strict=True)]
    moved = [i for i, r in enumerate(results) if (u := usage.get(r.request_id)) is not None and u.continued_tokens]
    stayed = [i for i in range(args.streams) if i not in set(moved)]
    stalls = [s for i in moved if (s := stall(times[i], kill)) is not None]
    # What the survivor must prefill again before the moved streams' next tokens: their prompts
    # and what they had streamed, at the profile's prefill rate (its roofline's compute bound).
    again = sum(
        usage[results[i].request_id].prompt_tokens + usage[results[i].request_id].continued_tokens for i in moved
    )
    resumed = max((kill + s for s in stalls), default=kill)
    w = args.window
    figures = {
        "streams": args.streams,
        "completed": sum(1 for r in results if r.ok and r.finish_reason),
        "failed": {r.error: sum(1 for x in results if x.error == r.error) for r in results if r.error},
        "moved": len(moved),
        "stall_s": summary(stalls),
        # The first moved stream's: finding the loss, handing its requests back, one prefill step.
        "first_stall_s": min(stalls, default=math.nan),
        "reprefill_tokens": again,
        # Shared by the survivors when the continuations spread over them evenly.
        "reprefill_floor_s": again * PROFILES[pool.profile].prefill_s_per_token / (args.workers - 1),
        "survivors_gap_p50_s": {
            "before": gaps_p50([times[i] for i in stayed], kill - w, kill),
            "after": gaps_p50([times[i] for i in stayed], resumed, resumed + w),
        },
        "tokens_per_s": {"before": rate(times, kill - w, kill), "after": rate(times, resumed, resumed + w)},
    }
    doc = {
        "kind": "benchmark",
        "benchmark": "failover",
        "description": "A worker SIGKILLed mid-stream: the stall its clients saw, and the cost to the survivor",
        "engine": fleet.describe(),
        "config": {k: v for k, v in vars(args).items() if k != "json"},
        "figures": figures,
    }
    doc["headline"] = render(doc).splitlines()
    return doc


def render(doc: dict) -> str:
    f, c = doc["figures"], doc["config"]
    s, g, t = f["stall_s"], f["survivors_gap_p50_s"], f["tokens_per_s"]
    met = s["n"] > 0 and s["p99"] <= TARGET_P99_S and not f["failed"]
    return "\n".join(
        [
            f"Failover: {c['workers']} sim workers (SIMULATION), {f['streams']} streams × ~{c['prompt_bytes'] // 4} in / "
            f"{c['max_tokens']} out at {c['stream_rate']:g} tok/s, one worker SIGKILLed {c['kill_after']:g} s in",
            f"  answers     {f['completed']}/{f['streams']} completed, failed {f['failed'] or 0}; "
            f"{f['moved']} went on on the {'other worker' if c['workers'] == 2 else 'others'}",
            f"  stall       p50 {s['p50']:.2f} s, p99 {s['p99']:.2f} s over {s['n']} streams, the first "
            f"{f['first_stall_s']:.2f} s "
            f"(target p99 ≤ {TARGET_P99_S:g} s: {'MET' if met else 'MISSED'}); of it, the survivors' prefill of "
            f"{f['reprefill_tokens']:,} tokens again takes {f['reprefill_floor_s']:.2f} s at the roofline",
            f"  survivors   gap p50 {g['before'] * 1000:.1f} ms before → {g['after'] * 1000:.1f} ms after",
            f"  throughput  {t['before']:,.0f} → {t['after']:,.0f} chunks/s ({c['window']:g} s windows; "
            f"after: once every stall ended)",
        ]
    )


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2, help="the pool's workers, the one killed among them")
    parser.add_argument("--stream-rate", type=float, default=30.0, help="tokens/s per stream (sets the step)")
    parser.add_argument("--prompt-bytes", type=int, default=6000, help="~1.5K tokens")
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument("--max-seqs", type=int, default=256, help="each worker's slots")
    parser.add_argument("--kill-after", type=float, default=5.0, help="seconds of streaming before the kill")
    parser.add_argument("--window", type=float, default=3.0, help="seconds of each throughput window")
    add_output_flags(parser)


def run(args: argparse.Namespace) -> int:
    if args.workers < 2:
        raise SystemExit("--workers: 2 at least (one is killed, the others go on)")
    return run_and_report(args, run_benchmark, render)


if __name__ == "__main__":
    main(__doc__, configure, run)
