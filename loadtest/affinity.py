"""Benchmark: KV-aware dispatch (issue 22). Multi-turn sessions on 1 worker at load L against
N workers at N·L, with the scheduler's prefix affinity on and off, in ONE run.

    python -m loadtest.affinity [--workers 4] [--sessions 20] [--duration 60] [--warmup 10]
                                [--profile llama-8b-h100] [--adapters 8 --max-loras 2] [--json out.json]

Runs, each on a fresh `laneway up` (--pii off by default: the same for all three, and the PII
stage's CPU on a 2-core machine would be the figure instead of the dispatch):
  one   1 worker, L sessions
  on    N workers, N·L sessions, prefix affinity on (the default)
  off   N workers, N·L sessions, `--no-prefix-affinity`: a pull takes the most urgent request
Sessions (loadtest/sessions.py): a 1,500-token system prompt shared by the tenant's sessions,
120-token turns, 80-token answers, 4 s think time, 12 turns a conversation. Turns sent inside
the measured window count. From the usage records (`LW_USAGE`): the prefix hit rate (cached ÷
prompt tokens, as each engine reported it) and each worker's share of the turns.
With --adapters K, session n talks to logical model `support-{n % K}`, each a LoRA adapter on the
pool; a worker holds --max-loras of them and a load adds --lora-load-s to its step (the sim's
model of vLLM loading an adapter inside the step that needs it).
Targets (affinity on vs one worker): chat TTFT p50 and p95 within 1.15×, hit rate within 10
points, every worker within ±20% of the mean share. The off run shows what affinity saves.
Engine: SIMULATION (vLLM V1's scheduler and prefix cache, `workers/engines/sim/scheduler.py`).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import aiohttp

from loadtest.benchcli import add_fleet_flags, add_output_flags, add_shedding_flag, main, run_and_report, shedding
from loadtest.fleet import Fleet
from loadtest.phases import settle
from loadtest.scenarios import PoolSpec, TenantSpec
from loadtest.sessions import SessionShape, Turn, run_sessions
from loadtest.stats import ms, summary
from loadtest.ttft_path import usage_of

TENANT = "acme"
MODEL = "laneway-sim"
TTFT_RATIO, HIT_POINTS, BALANCE = 1.15, 10.0, 0.20


async def run_one(args: argparse.Namespace, label: str, workers: int, affinity: bool, tmp: Path) -> dict:
    adapters = tuple(f"support-{i}" for i in range(args.adapters))
    pool = PoolSpec(
        model=MODEL,
        profile=args.profile,
        workers=workers,
        speed=args.sim_speed,
        max_seqs=args.max_seqs,
        adapters=adapters,
        max_loras=args.max_loras,
        lora_load_s=args.lora_load_s,
    )
    flags = ["--pii", args.pii, *shedding(args)] + ([] if affinity else ["--no-prefix-affinity"])
    shape = SessionShape(args.system_tokens, args.turn_tokens, args.answer_tokens, args.turns, args.think)
    turns: list[Turn] = []
    async with Fleet(tmp / label, [TenantSpec(TENANT)], [pool], up_flags=flags) as fleet:
        since = datetime.now(UTC)
        t0 = time.time()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:
            await run_sessions(
                http,
                fleet.url,
                fleet.keys[TENANT],
                adapters or (MODEL,),
                TENANT,
                shape,
                args.sessions * workers,
                t0 + args.duration,
                args.seed,
                turns,
            )
        await settle(fleet)
        usage = await usage_of(fleet, TENANT, since, set())  # one read, after the streams ended
    window = [t for t in turns if t0 + args.warmup <= t.result.started_at < t0 + args.duration]
    return figures(label, workers, affinity, turns, window, usage)


def figures(label: str, workers: int, affinity: bool, turns: list[Turn], window: list[Turn], usage: dict) -> dict:
    records = [usage[t.result.request_id] for t in window if t.result.request_id in usage]
    # A later turn "stayed" when the worker that served the turn before it served it too.
    served = {
        (t.session, t.conversation, t.turn): usage[t.result.request_id].worker_id
        for t in turns
        if t.result.request_id in usage
    }
    later = [
        (t, served.get((t.session, t.conversation, t.turn - 1)) == served.get((t.session, t.conversation, t.turn)))
        for t in window
        if t.turn > 1 and (t.session, t.conversation, t.turn) in served
    ]
    prompt = sum(u.prompt_tokens for u in records)
    cached = sum(u.cached_tokens for u in records)
    share = Counter(u.worker_id for u in records)
    mean = len(records) / workers if records else 0.0
    return {
        "label": label,
        "workers": workers,
        "affinity": affinity,
        "turns": len(window),
        "errors": sum(1 for t in window if not t.result.ok),
        "ttft_s": summary([t.result.ttft for t in window if t.result.ttft is not None]),
        "stayed": sum(stay for _, stay in later) / len(later) if later else 0.0,
        "stayed_ttft_s": summary([t.result.ttft for t, stay in later if stay and t.result.ttft is not None]),
        "moved_ttft_s": summary([t.result.ttft for t, stay in later if not stay and t.result.ttft is not None]),
        "metered": len(records),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "hit_rate": cached / prompt if prompt else 0.0,
        "per_worker": dict(sorted(share.items())),
        # every worker counts, one that served nothing too (its share is -100%)
        "imbalance": max(abs(share.get(w, 0) / mean - 1) for w in share)
        if mean and len(share) == workers
        else (1.0 if workers > 1 else 0.0),
    }


async def run_benchmark(args: argparse.Namespace) -> dict:
    plan = [("one", 1, True), ("on", args.workers, True), ("off", args.workers, False)]
    runs = {}
    with tempfile.TemporaryDirectory(prefix="laneway-affinity-") as tmp:
        for label, workers, affinity in plan:
            if not args.quiet:
                print(
                    f"run {label}: {workers} worker(s), {args.sessions * workers} sessions, "
                    f"affinity {'on' if affinity else 'off'}",
                    flush=True,
                )
            runs[label] = await run_one(args, label, workers, affinity, Path(tmp))
    one, on, off = runs["one"], runs["on"], runs["off"]
    verdict = {
        "on_ttft_p50_ratio": on["ttft_s"]["p50"] / one["ttft_s"]["p50"],
        "on_ttft_p95_ratio": on["ttft_s"]["p95"] / one["ttft_s"]["p95"],
        "off_ttft_p50_ratio": off["ttft_s"]["p50"] / one["ttft_s"]["p50"],
        "off_ttft_p95_ratio": off["ttft_s"]["p95"] / one["ttft_s"]["p95"],
        "on_hit_points_below_one": (one["hit_rate"] - on["hit_rate"]) * 100,
        "off_hit_points_below_one": (one["hit_rate"] - off["hit_rate"]) * 100,
        "on_imbalance": on["imbalance"],
        "prefill_tokens_saved_vs_off": on["cached_tokens"] - off["cached_tokens"],
    }
    doc = {
        "kind": "benchmark",
        "benchmark": "affinity",
        "description": "KV-aware dispatch: multi-turn sessions, 1 worker at L vs N workers at N·L, "
        "prefix affinity on and off",
        "engine": "sim (SIMULATION: vLLM V1 scheduling and prefix cache, modelled step times)",
        "config": {k: v for k, v in vars(args).items() if k != "json"},
        "runs": runs,
        "figures": verdict,
    }
    doc["headline"] = render(doc).splitlines()
    return doc


def render(doc: dict) -> str:
    c, f, runs = doc["config"], doc["figures"], doc["runs"]
    lines = [
        f"Prefix affinity: sim/{c['profile']} (SIMULATION), sessions of {c['turns']} turns: "
        f"{c['system_tokens']}-token shared system prompt, {c['turn_tokens']}-token turns, "
        f"{c['answer_tokens']}-token answers, {c['think']:g} s think; {c['sessions']} sessions a worker; "
        f"{c['duration']:.0f} s runs ({c['warmup']:.0f} s warm-up); PII stage {c['pii']}"
        + (
            f"; sessions over {c['adapters']} LoRA adapters (a worker holds {c['max_loras']}, a load adds "
            f"{c['lora_load_s']:g} s to its step)"
            if c.get("adapters")
            else ""
        ),
        f"  {'run':<5} {'workers':>7} {'turns':>6} {'err':>4} | {'TTFT p50':>10} {'p95':>10} {'p99':>10} | "
        f"{'hit rate':>8} {'stayed':>6} | {'worker shares (turns)'}",
    ]
    for label, r in runs.items():
        t = r["ttft_s"]
        shares = " ".join(str(n) for n in r["per_worker"].values())
        lines.append(
            f"  {label:<5} {r['workers']:>7} {r['turns']:>6} {r['errors']:>4} | {ms(t['p50']):>10} "
            f"{ms(t['p95']):>10} {ms(t['p99']):>10} | {r['hit_rate'] * 100:>7.1f}% {r['stayed'] * 100:>5.0f}% | {shares} "
            f"(±{r['imbalance'] * 100:.0f}%)"
        )

    def met(ok: bool) -> str:
        return "MET" if ok else "MISSED"

    lines += [
        f"Affinity on, {runs['on']['workers']} workers vs 1: TTFT p50 {f['on_ttft_p50_ratio']:.2f}×, "
        f"p95 {f['on_ttft_p95_ratio']:.2f}× (target ≤ {TTFT_RATIO}×): "
        f"{met(max(f['on_ttft_p50_ratio'], f['on_ttft_p95_ratio']) <= TTFT_RATIO)}; hit rate "
        f"{f['on_hit_points_below_one']:+.1f} points below (target ≤ {HIT_POINTS:g}): "
        f"{met(f['on_hit_points_below_one'] <= HIT_POINTS)}; worker shares within ±"
        f"{f['on_imbalance'] * 100:.0f}% (target ±{BALANCE * 100:.0f}%): {met(f['on_imbalance'] <= BALANCE)}",
        f"Affinity off: TTFT p50 {f['off_ttft_p50_ratio']:.2f}×, p95 {f['off_ttft_p95_ratio']:.2f}× of 1 worker's; "
        f"hit rate {f['off_hit_points_below_one']:+.1f} points below; affinity saved "
        f"{f['prefill_tokens_saved_vs_off']:,} prompt tokens of prefill in the window",
    ]
    if c.get("adapters"):
        on, off = runs["on"]["ttft_s"], runs["off"]["ttft_s"]
        lines.append(
            f"With {c['adapters']} adapters (one worker holds {c['max_loras']}, so the 1-worker run reloads "
            f"them: not a baseline here): affinity off ÷ on, TTFT p50 {off['p50'] / on['p50']:.1f}×, "
            f"p95 {off['p95'] / on['p95']:.1f}×; turns served {runs['on']['turns']} on, "
            f"{runs['off']['turns']} off"
        )
    return "\n".join(lines)


def configure(parser: argparse.ArgumentParser) -> None:
    add_fleet_flags(parser, duration=60.0, warmup=10.0, max_seqs=0)
    add_shedding_flag(parser)
    parser.add_argument("--workers", type=int, default=4, help="workers of the scaled-out runs (N)")
    parser.add_argument("--sessions", type=int, default=20, help="concurrent sessions per worker (L)")
    parser.add_argument("--system-tokens", type=int, default=1500)
    parser.add_argument("--turn-tokens", type=int, default=120)
    parser.add_argument("--answer-tokens", type=int, default=80)
    parser.add_argument("--turns", type=int, default=12, help="turns per conversation")
    parser.add_argument("--think", type=float, default=4.0, help="mean seconds between turns")
    parser.add_argument(
        "--adapters",
        type=int,
        default=0,
        help="sessions spread over this many logical models, each a LoRA adapter on the pool",
    )
    parser.add_argument("--max-loras", type=int, default=2, help="adapters a worker holds loaded (with --adapters)")
    parser.add_argument(
        "--lora-load-s",
        type=float,
        default=0.2,
        help="seconds loading an adapter adds to the engine step that needs it (with --adapters)",
    )
    parser.add_argument("--pii", choices=("off", "auto", "regex", "ner"), default="off")
    add_output_flags(parser)


def run(args: argparse.Namespace) -> int:
    return run_and_report(args, run_benchmark, render)


if __name__ == "__main__":
    main(__doc__, configure, run)
