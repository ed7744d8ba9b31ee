"""Benchmark: a large batch beside interactive chat, in ONE run on one `laneway up`.

    python -m loadtest.batch [--lines 10000] [--batch-prompt-tokens 1500] [--batch-tokens 400]
                             [--duration 60] [--chat-rate 2] [--no-kill] [--json out.json]

Phases:
  alone   chats only (Poisson, the reference shape's 1.5K-token prompts): the baseline
  batch   the same chats while a batch of --lines lines (1.5K in / 400 out each, in the `batch`
          class, through the Batch API) runs; mid-batch a worker is SIGKILLed and, later, the
          broker (`up` restarts each); the phase's chats are measured, then the batch is followed
          to its end
Figures: chat TTFT p95 (and p50) beside the batch ÷ alone (target ≤ 1.1×), the batch's lines
answered / lost / failed (none lost: every custom_id exactly once in the output file), its
duration and output tokens/s. Engine: SIMULATION (llama-8b-h100 scheduled as vLLM V1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import tempfile
import time
from pathlib import Path

import openai

from loadtest.benchcli import add_fleet_flags, add_output_flags, main, run_and_report
from loadtest.fleet import Fleet, _role
from loadtest.hol import batch_policy
from loadtest.phases import run_phase
from loadtest.scenarios import Flow, PoolSpec, TenantSpec
from loadtest.stats import ms, summary
from loadtest.traffic import HttpTarget

TENANT = "acme"


def batch_file(args: argparse.Namespace) -> bytes:
    """Distinct prompts (a tag first: no prefix-cache hit) of ~`batch_prompt_tokens` (4 B a token)."""
    filler = ("Summarize this support ticket and propose the next action. " * 200)[: args.batch_prompt_tokens * 4]
    return "".join(
        json.dumps(
            {
                "custom_id": f"line-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": "laneway-sim",
                    "max_tokens": args.batch_tokens,
                    "messages": [{"role": "user", "content": f"[{i}] {filler}"}],
                },
            }
        )
        + "\n"
        for i in range(args.lines)
    ).encode()


async def kill(fleet: Fleet, role: str) -> None:
    pid = next(p for p in fleet.pids() if _role(p) == role)
    os.kill(pid, signal.SIGKILL)


async def follow(
    c: openai.AsyncOpenAI,
    fleet: Fleet,
    batch_id: str,
    total: int,
    kills: asyncio.Event | None,
    events: list[str],
    quiet: bool,
) -> openai.types.Batch:
    """Until the batch ends. Once `kills` is set (the chats are measured by then: a kill must not
    be what their figures show), a worker is killed, and the broker when 10% more lines are done."""
    plan = ["worker", "broker"] if kills is not None else []
    next_at = 0
    while True:
        try:
            batch = await c.batches.retrieve(batch_id)
        except (openai.APIConnectionError, openai.InternalServerError):
            await asyncio.sleep(1)
            continue
        counts = batch.request_counts
        done = (counts.completed + counts.failed) if counts else 0
        if plan and kills is not None and kills.is_set() and done >= next_at and batch.status == "in_progress":
            role = plan.pop(0)
            await kill(fleet, role)
            events.append(f"{role} SIGKILLed at {done}/{total} lines")
            next_at = done + total // 10
        if not quiet:
            print(f"\r  batch {batch.status}: {done}/{total}", end="", flush=True)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            if not quiet:
                print()
            return batch
        await asyncio.sleep(1)


def chat_flow(args: argparse.Namespace) -> list[Flow]:
    return [
        Flow(
            "chat",
            TENANT,
            "interactive",
            rate=args.chat_rate,
            prompt_tokens=args.chat_prompt,
            max_tokens=args.chat_tokens,
            distinct=True,
        )
    ]


async def run_benchmark(args: argparse.Namespace) -> dict:
    pool = PoolSpec(
        profile=args.profile,
        speed=args.sim_speed,
        max_seqs=args.max_seqs,
        workers=args.workers,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
    )
    policy = batch_policy(args.batch_slot_share, args.batch_prefill_share)
    events: list[str] = []
    with tempfile.TemporaryDirectory(prefix="laneway-batch-") as tmp:
        async with Fleet(
            Path(tmp) / "lw",
            [TenantSpec(TENANT)],
            [pool],
            up_flags=["--pii", args.pii, "--batch-concurrency", str(args.batch_concurrency)],
        ) as fleet:
            c = openai.AsyncOpenAI(base_url=f"{fleet.url}/v1", api_key=fleet.keys[TENANT], max_retries=5, timeout=600)
            await fleet.set_class(policy)
            async with HttpTarget(fleet.url, fleet.keys) as target:
                alone = await run_phase(
                    fleet,
                    target,
                    "alone",
                    chat_flow(args),
                    args.duration,
                    args.warmup,
                    seed=args.seed,
                    show_progress=not args.quiet,
                )
                file = await c.files.create(file=("batch.jsonl", batch_file(args)), purpose="batch")
                started = time.monotonic()
                batch = await c.batches.create(
                    input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
                )
                kills = None if args.no_kill else asyncio.Event()
                following = asyncio.create_task(follow(c, fleet, batch.id, args.lines, kills, events, True))
                beside = await run_phase(
                    fleet,
                    target,
                    "batch",
                    chat_flow(args),
                    args.duration,
                    args.warmup,
                    seed=args.seed + 1,
                    show_progress=not args.quiet,
                    settle_after=False,
                )
                if kills is not None:
                    kills.set()
                done = await following
                took = time.monotonic() - started
                output = (await c.files.content(done.output_file_id)).content if done.output_file_id else b""
    ids = [json.loads(line)["custom_id"] for line in output.splitlines()]
    tokens = done.usage.output_tokens if done.usage else 0
    ttft = {
        label: summary(
            [r.ttft for r in p.rec.results if r.flow == "chat" and r.ttft is not None and r.started_at >= p.window[0]]
        )
        for label, p in (("alone", alone), ("batch", beside))
    }
    figures = {
        "chat_ttft_s": ttft,
        "chat_errors": {
            label: sum(1 for r in p.rec.results if r.flow == "chat" and r.error is not None)
            for label, p in (("alone", alone), ("batch", beside))
        },
        "ttft_p95_ratio": ttft["batch"]["p95"] / ttft["alone"]["p95"],
        "ttft_p50_ratio": ttft["batch"]["p50"] / ttft["alone"]["p50"],
        "batch_status": done.status,
        "lines": args.lines,
        "answered": len(ids),
        "unique": len(set(ids)),
        "lost": args.lines - len(set(ids)),
        "failed": done.request_counts.failed if done.request_counts else None,
        "batch_s": took,
        "batch_output_tokens_per_s": tokens / took if took else 0.0,
        "events": events,
    }
    doc = {
        "kind": "benchmark",
        "benchmark": "batch",
        "description": "Interactive chat alone vs beside a large batch (Batch API), a worker and the broker "
        "killed mid-batch",
        "engine": {
            **fleet.describe(),
            "batch_slot_cap": policy.slot_cap(args.max_seqs),
            "batch_prefill_share": policy.max_prefill_share,
        },
        "config": {k: v for k, v in vars(args).items() if k != "json"},
        "figures": figures,
        "runs": [alone.doc, beside.doc],
    }
    doc["headline"] = render(doc).splitlines()
    return doc


def render(doc: dict) -> str:
    f, c = doc["figures"], doc["config"]
    a, b = f["chat_ttft_s"]["alone"], f["chat_ttft_s"]["batch"]
    ratio = f["ttft_p95_ratio"]
    return "\n".join(
        [
            f"Batch beside chat: sim/{c['profile']} (SIMULATION), {c['workers']} workers × {c['max_seqs']} slots (batch may hold "
            f"{doc['engine']['batch_slot_cap']}, prefill share {doc['engine']['batch_prefill_share']:g}), speed {c['sim_speed']}, "
            f"chats {c['chat_rate']}/s × {c['chat_prompt']} in / {c['chat_tokens']} out, batch {c['lines']:,} lines × "
            f"{c['batch_prompt_tokens']} in / {c['batch_tokens']} out, PII {c['pii']}",
            f"  chat alone : n={a['n']:>4} TTFT p50 {ms(a['p50'])} p95 {ms(a['p95'])} p99 {ms(a['p99'])}, "
            f"errors {f['chat_errors']['alone']}",
            f"  with batch : n={b['n']:>4} TTFT p50 {ms(b['p50'])} p95 {ms(b['p95'])} p99 {ms(b['p99'])}, "
            f"errors {f['chat_errors']['batch']}",
            f"Chat TTFT p95 beside the batch: {ratio:.2f}× alone (target ≤ 1.1×): {'MET' if ratio <= 1.1 else 'MISSED'}; "
            f"p50 {f['ttft_p50_ratio']:.2f}×",
            f"Batch: {f['batch_status']}, {f['unique']:,}/{f['lines']:,} lines answered once each ({f['answered']:,} "
            f"output lines), {f['lost']} lost, {f['failed']} failed, {f['batch_s']:.0f} s, "
            f"{f['batch_output_tokens_per_s']:,.0f} output tok/s; {'; '.join(f['events']) or 'no kills'}",
        ]
    )


def configure(parser: argparse.ArgumentParser) -> None:
    add_fleet_flags(parser, duration=60.0, warmup=10.0, max_seqs=64)
    parser.add_argument("--lines", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=4, help="simulated workers in the pool")
    parser.add_argument("--batch-prompt-tokens", type=int, default=1500)
    parser.add_argument("--batch-tokens", type=int, default=400)
    parser.add_argument("--batch-concurrency", type=int, default=64, help="the bridge's lines in flight")
    parser.add_argument("--chat-rate", type=float, default=2.0, help="chats per second (Poisson)")
    parser.add_argument("--chat-prompt", type=int, default=1500)
    parser.add_argument("--chat-tokens", type=int, default=400)
    parser.add_argument("--long-prefill-token-threshold", type=int, default=128)
    parser.add_argument(
        "--batch-slot-share", type=float, default=None, help="the batch class's max_slot_share (default: the class's)"
    )
    parser.add_argument(
        "--batch-prefill-share",
        type=float,
        default=None,
        help="the batch class's max_prefill_share (default: the class's)",
    )
    parser.add_argument("--pii", choices=("off", "auto", "regex", "ner"), default="auto")
    parser.add_argument("--no-kill", action="store_true", help="no worker or broker killed mid-batch")
    add_output_flags(parser)


def run(args: argparse.Namespace) -> int:
    return run_and_report(args, run_benchmark, render)


if __name__ == "__main__":
    main(__doc__, configure, run)
