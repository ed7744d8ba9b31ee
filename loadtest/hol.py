"""Benchmark: head-of-line blocking. Interactive chats alone vs under a flood of long batch
generations, with Laneway's lanes vs a FIFO configuration, in ONE run on one `laneway up`.

    python -m loadtest.hol [--duration 30] [--warmup 8] [--max-seqs 32] [--flood-prompt-bytes 6144]
                           [--batch-prefill-share 0.1] [--sim-speed 1.0] [--json out.json]

Phases, each after the previous one has drained:
  alone        chats only (Poisson, short replies)
  flood-alone  the batch flood only, on the UNCAPPED engine: class `batch` with no slot share and
               no prefill cap, so it may take every slot and every step: the engine's capacity
  lanes        flood in class `batch` (its slot share and prefill cap) + chats in `interactive`
  fifo         flood + chats both in ONE class from one tenant: the lanes reduce to arrival order
Chats sent inside a phase's window are followed until their first token (the flood keeps
running meanwhile), so TTFTs are never censored. Every prompt is distinct (a tag at its start),
so the engine's prefix cache never serves it: each prompt is prefilled in full. Figures:
interactive TTFT p95 flooded ÷ unloaded (target ≤ 1.25× with lanes), how much worse FIFO is,
and batch throughput with lanes ÷ the uncapped engine's (target ≥ 90%). Engine: SIMULATION
(llama-8b-h100, scheduled as vLLM V1: `workers/engines/sim/scheduler.py`).
"""

from __future__ import annotations

import argparse
import tempfile
from collections import Counter
from pathlib import Path

import msgspec

from core.policy.classes import DEFAULT_CLASSES, ClassPolicy
from loadtest.benchcli import add_fleet_flags, add_output_flags, add_shedding_flag, main, run_and_report, shedding
from loadtest.fleet import Fleet
from loadtest.phases import Phase, run_phase
from loadtest.scenarios import Flow, PoolSpec, TenantSpec
from loadtest.stats import ms, summary
from loadtest.traffic import HttpTarget, Recorder

TENANT = "acme"


def batch_policy(slot_share: float | None, prefill_share: float | None) -> ClassPolicy:
    """The batch class as configured for the lanes phase: the default, with any overrides."""
    policy = next(c for c in DEFAULT_CLASSES if c.name == "batch")
    if slot_share is not None:
        policy = msgspec.structs.replace(policy, max_slot_share=slot_share)
    if prefill_share is not None:
        policy = msgspec.structs.replace(policy, max_prefill_share=prefill_share)
    return policy


def uncapped(policy: ClassPolicy) -> ClassPolicy:
    return msgspec.structs.replace(policy, max_slot_share=1.0, max_prefill_share=1.0)


def flows(args: argparse.Namespace, chats: bool, flood: bool, lanes: bool) -> list[Flow]:
    out = []
    if chats:
        out.append(
            Flow(
                "chat",
                TENANT,
                "interactive" if lanes else args.fifo_class,
                rate=args.chat_rate,
                prompt_tokens=args.chat_prompt,
                max_tokens=args.chat_tokens,
                distinct=True,
            )
        )
    if flood:
        out.append(
            Flow(
                "flood",
                TENANT,
                "batch" if lanes else args.fifo_class,
                users=args.flood_users,
                prompt_tokens=args.flood_prompt_bytes // 4,
                max_tokens=args.flood_tokens,
                max_tokens_spread=0.5,
                ramp_s=1.0,
                distinct=True,
            )
        )
    return out


def chats_started(rec: Recorder) -> bool:
    return all(
        r.ttft is not None or r.error is not None or r.status not in (0, 200) for r in rec.results if r.flow == "chat"
    )


async def run_benchmark(args: argparse.Namespace) -> dict:
    pool = PoolSpec(
        profile=args.profile,
        speed=args.sim_speed,
        max_seqs=args.max_seqs,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
    )
    batch = batch_policy(args.batch_slot_share, args.batch_prefill_share)
    # (label, chats, flood, lanes, the batch class during the phase)
    plan = [
        ("alone", True, False, True, batch),
        ("flood-alone", False, True, True, uncapped(batch)),
        ("lanes", True, True, True, batch),
        ("fifo", True, True, False, batch),
    ]
    phases = {}
    with tempfile.TemporaryDirectory(prefix="laneway-hol-") as tmp:
        up_flags = ["--pii", args.pii, *shedding(args)]
        async with Fleet(Path(tmp) / "lw", [TenantSpec(TENANT)], [pool], up_flags=up_flags) as fleet:
            async with HttpTarget(fleet.url, fleet.keys) as target:
                for i, (label, chats, flood, lanes, policy) in enumerate(plan):
                    await fleet.set_class(policy)
                    phases[label] = await run_phase(
                        fleet,
                        target,
                        label,
                        flows(args, chats, flood, lanes),
                        args.duration,
                        args.warmup,
                        drain_s=120.0,
                        drained=chats_started,
                        seed=args.seed + i,
                        show_progress=not args.quiet,
                    )
    batch_cap = batch.slot_cap(args.max_seqs)
    figures: dict = {"phases": {label: phase_figures(phase) for label, phase in phases.items()}}
    f = figures["phases"]
    p95 = {k: f[k]["chat_ttft_s"]["p95"] for k in ("alone", "lanes", "fifo")}
    capacity = f["flood-alone"]["flood_tokens_per_s"]
    figures.update(
        {
            "lanes_ttft_p95_ratio": p95["lanes"] / p95["alone"],
            # p95 of ~50 chats moves with one slow request on a busy host: p50 shows the trend too
            "lanes_ttft_p50_ratio": f["lanes"]["chat_ttft_s"]["p50"] / f["alone"]["chat_ttft_s"]["p50"],
            "fifo_ttft_p95_ratio": p95["fifo"] / p95["alone"],
            "fifo_vs_lanes": p95["fifo"] / p95["lanes"],
            "step_inflation": f["lanes"]["chat_itl_p50_s"] / f["alone"]["chat_itl_p50_s"],
            "batch_capacity_tokens_per_s": capacity,  # the uncapped engine, flood alone
            "lanes_batch_share_of_capacity": f["lanes"]["flood_tokens_per_s"] / capacity if capacity else float("nan"),
            "fifo_batch_share_of_capacity": f["fifo"]["flood_tokens_per_s"] / capacity if capacity else float("nan"),
        }
    )
    doc = {
        "kind": "benchmark",
        "benchmark": "hol",
        "description": "Head-of-line blocking: interactive chats alone vs under a batch flood, "
        "lanes vs FIFO (one class); batch throughput vs the uncapped engine",
        "engine": {**fleet.describe(), "batch_slot_cap": batch_cap, "batch_prefill_share": batch.max_prefill_share},
        "config": {k: v for k, v in vars(args).items() if k != "json"},
        "figures": figures,
        "runs": [p.doc for p in phases.values()],
    }
    doc["headline"] = render(doc).splitlines()
    return doc


def phase_figures(phase: Phase) -> dict:
    """The chats sent inside the phase's window (every one followed to its first token) and the flood."""
    chats = [r for r in phase.rec.results if r.flow == "chat" and r.started_at >= phase.window[0]]
    flood = phase.doc["by_flow"].get("flood")
    return {
        "chat_ttft_s": summary([r.ttft for r in chats if r.ttft is not None]),
        "chat_itl_p50_s": summary([g for r in chats for g in r.gaps])["p50"],  # the engine step
        "chat_errors": sum(1 for r in chats if r.error is not None),
        "chat_error_codes": dict(Counter(r.error for r in chats if r.error is not None)),  # which, when any
        "flood_tokens_per_s": flood["tokens_per_s"] if flood else 0.0,
        "flood_errors": flood["failed"] if flood else 0,
    }


def render(doc: dict) -> str:
    f, c, e = doc["figures"], doc["config"], doc["engine"]
    lines = [
        f"Head-of-line blocking: sim/{c['profile']} (SIMULATION, vLLM V1 scheduling), {c['max_seqs']} slots "
        f"(batch may hold {e['batch_slot_cap']}, prefill share {e['batch_prefill_share']:g} of a step), "
        f"prefill chunks ≤ {c['long_prefill_token_threshold'] or 'any'} tokens, speed {c['sim_speed']}, "
        f"chats {c['chat_rate']}/s × {c['chat_prompt']} in / {c['chat_tokens']} out tokens, "
        f"flood {c['flood_users']} users × {c['flood_prompt_bytes']:,} B prompts / ~{c['flood_tokens']} "
        f"out tokens, {c['duration']:.0f} s phases ({c['warmup']:.0f} s warm-up), PII stage {c.get('pii', 'auto')}",
        f"  {'phase':<12} {'chats':>5} {'err':>4} | {'TTFT p50':>10} {'p95':>10} {'p99':>10} | "
        f"{'step':>8} | {'batch tok/s':>11} {'err':>4}",
    ]
    for label, p in f["phases"].items():
        t = p["chat_ttft_s"]
        lines.append(
            f"  {label:<12} {t['n']:>5} {p['chat_errors']:>4} | {ms(t['p50']):>10} {ms(t['p95']):>10} "
            f"{ms(t['p99']):>10} {ms(p['chat_itl_p50_s']):>8} | {p['flood_tokens_per_s']:>11,.0f} "
            f"{p['flood_errors']:>4}"
        )
    ratio = f["lanes_ttft_p95_ratio"]
    share = f["lanes_batch_share_of_capacity"]
    lines += [
        f"Interactive TTFT p95 under the flood, lanes: {ratio:.2f}× unloaded (target ≤ 1.25×): "
        f"{'MET' if ratio <= 1.25 else 'MISSED'}; p50 {f['lanes_ttft_p50_ratio']:.2f}× "
        f"(the engine step, chat ITL p50, is {f['step_inflation']:.2f}× longer under the flood)",
        f"FIFO (one class): {f['fifo_ttft_p95_ratio']:.1f}× unloaded, {f['fifo_vs_lanes']:.1f}× worse than lanes",
        f"Batch throughput with lanes: {share * 100:.1f}% of the uncapped engine's "
        f"{f['batch_capacity_tokens_per_s']:,.0f} tok/s (flood alone, no slot share, no prefill cap; "
        f"target ≥ 90%): {'MET' if share >= 0.9 else 'MISSED'}",
    ]
    return "\n".join(lines)


def configure(parser: argparse.ArgumentParser) -> None:
    add_fleet_flags(parser, duration=30.0, warmup=8.0, max_seqs=32)
    parser.add_argument("--chat-rate", type=float, default=2.0, help="chats per second (Poisson)")
    parser.add_argument("--chat-prompt", type=int, default=200)
    parser.add_argument("--chat-tokens", type=int, default=32)
    parser.add_argument("--flood-users", type=int, default=40, help="concurrent batch submitters")
    parser.add_argument("--flood-prompt-bytes", type=int, default=6144, help="each batch prompt's size (~4 B a token)")
    parser.add_argument("--flood-tokens", type=int, default=400, help="mean max_tokens (±50%%)")
    parser.add_argument(
        "--batch-slot-share",
        type=float,
        default=None,
        help="the batch class's max_slot_share in the lanes phases (default: the class's)",
    )
    parser.add_argument(
        "--batch-prefill-share",
        type=float,
        default=None,
        help="the batch class's max_prefill_share in the lanes phases (default: the class's)",
    )
    # vLLM's default (0) lets one prompt take a whole step: no admission can then keep a chat's
    # first step short. 128 spreads each long prompt over steps, as a mixed-class pool should.
    parser.add_argument(
        "--long-prefill-token-threshold",
        type=int,
        default=128,
        help="the engine's per-request prefill chunk per step (vLLM's; 0: none, vLLM's default)",
    )
    parser.add_argument(
        "--pii",
        choices=("off", "auto", "regex", "ner"),
        default="auto",
        help="the broker's PII stage, as `laneway up` runs it (auto: Presidio, NER if its "
        "model is installed): every prompt, the flood's too, is scanned before it queues",
    )
    add_shedding_flag(parser)
    parser.add_argument(
        "--fifo-class", default="interactive", help="the one class of the FIFO configuration (interactive: no slot cap)"
    )
    add_output_flags(parser)


def run(args: argparse.Namespace) -> int:
    return run_and_report(args, run_benchmark, render)


if __name__ == "__main__":
    main(__doc__, configure, run)
