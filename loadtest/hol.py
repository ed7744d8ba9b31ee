"""Benchmark: head-of-line blocking. Interactive chats alone vs under a flood of long batch
generations, with Laneway's lanes vs a FIFO configuration, in ONE run on one `laneway up`.

    python -m loadtest.hol [--duration 30] [--warmup 8] [--max-seqs 32] [--sim-speed 1.0] [--json out.json]

Phases, each after the previous one has drained:
  alone        chats only (Poisson, short replies)
  flood-alone  the batch flood only (closed loop, long generations): the worker's batch capacity
  lanes        flood in class `batch` + chats in class `interactive`
  fifo         flood + chats both in ONE class from one tenant: the lanes reduce to arrival order
Chats sent inside a phase's window are followed until their first token (the flood keeps
running meanwhile), so TTFTs are never censored. Figures: interactive TTFT p95 flooded ÷
unloaded (target ≤ 1.25× with lanes), how much worse FIFO is, and batch throughput with lanes
÷ capacity (target ≥ 90%: the scheduler is work-conserving). Capacity is measured (flood alone,
same worker) and also modelled from the sim profile. Engine: SIMULATION (llama-8b-h100).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import msgspec

from broker.classes import DEFAULT_CLASSES, ClassPolicy
from loadtest.benchcli import add_fleet_flags, add_output_flags, main, run_and_report
from loadtest.fleet import Fleet
from loadtest.phases import run_phase
from loadtest.scenarios import Flow, PoolSpec, TenantSpec
from loadtest.stats import ms, summary
from loadtest.traffic import HttpTarget, Recorder
from workers.sim import PROFILES

TENANT = "acme"


def modelled_capacity(profile: str, slots: int, speed: float) -> float:
    """Tokens/s of `slots` sequences decoding back to back (prefill ignored): the sim's model."""
    p = PROFILES[profile]
    return slots * speed / (p.decode_base_s + slots * p.decode_s_per_seq)


def batch_policy(share: float | None) -> ClassPolicy:
    policy = next(c for c in DEFAULT_CLASSES if c.name == "batch")
    return policy if share is None else msgspec.structs.replace(policy, max_slot_share=share)


def _flows(args: argparse.Namespace, chats: bool, flood: bool, lanes: bool) -> list[Flow]:
    out = []
    if chats:
        out.append(Flow("chat", TENANT, "interactive" if lanes else args.fifo_class, rate=args.chat_rate,
                        prompt_tokens=args.chat_prompt, max_tokens=args.chat_tokens))
    if flood:
        out.append(Flow("flood", TENANT, "batch" if lanes else args.fifo_class, users=args.flood_users,
                        prompt_tokens=args.flood_prompt, max_tokens=args.flood_tokens,
                        max_tokens_spread=0.5, ramp_s=1.0))
    return out


def _chats_started(rec: Recorder) -> bool:
    return all(r.ttft is not None or r.error is not None or r.status not in (0, 200)
               for r in rec.results if r.flow == "chat")


async def run_benchmark(args: argparse.Namespace) -> dict:
    pool = PoolSpec(profile=args.profile, speed=args.sim_speed, max_seqs=args.max_seqs)
    plan = [("alone", True, False, True), ("flood-alone", False, True, True),
            ("lanes", True, True, True), ("fifo", True, True, False)]
    phases = {}
    with tempfile.TemporaryDirectory(prefix="laneway-hol-") as tmp:
        async with Fleet(Path(tmp) / "lw", [TenantSpec(TENANT)], [pool]) as fleet:
            if args.batch_slot_share is not None:
                await fleet.set_class(batch_policy(args.batch_slot_share))
            async with HttpTarget(fleet.url, fleet.keys) as target:
                for i, (label, chats, flood, lanes) in enumerate(plan):
                    phases[label] = await run_phase(
                        fleet, target, label, _flows(args, chats, flood, lanes), args.duration, args.warmup,
                        drain_s=120.0, drained=_chats_started, seed=args.seed + i,
                        show_progress=not args.quiet)
    batch_cap = batch_policy(args.batch_slot_share).slot_cap(args.max_seqs)
    figures: dict = {"phases": {}}
    for label, phase in phases.items():
        chats = [r for r in phase.rec.results if r.flow == "chat" and r.started_at >= phase.window[0]]
        flood = phase.doc["by_flow"].get("flood")
        figures["phases"][label] = {
            "chat_ttft_s": summary([r.ttft for r in chats if r.ttft is not None]),
            "chat_itl_p50_s": summary([g for r in chats for g in r.gaps])["p50"],   # the engine step
            "chat_errors": sum(1 for r in chats if r.error is not None),
            "flood_tokens_per_s": flood["tokens_per_s"] if flood else 0.0,
            "flood_errors": flood["failed"] if flood else 0,
        }
    f = figures["phases"]
    p95 = {k: f[k]["chat_ttft_s"]["p95"] for k in ("alone", "lanes", "fifo")}
    capacity = f["flood-alone"]["flood_tokens_per_s"]
    figures.update({
        "lanes_ttft_p95_ratio": p95["lanes"] / p95["alone"],
        "fifo_ttft_p95_ratio": p95["fifo"] / p95["alone"],
        "fifo_vs_lanes": p95["fifo"] / p95["lanes"],
        "step_inflation": f["lanes"]["chat_itl_p50_s"] / f["alone"]["chat_itl_p50_s"],
        "batch_capacity_tokens_per_s": capacity,
        "batch_capacity_modelled_tokens_per_s": modelled_capacity(args.profile, batch_cap, args.sim_speed),
        "lanes_batch_share_of_capacity": f["lanes"]["flood_tokens_per_s"] / capacity if capacity else float("nan"),
        "fifo_batch_share_of_capacity": f["fifo"]["flood_tokens_per_s"] / capacity if capacity else float("nan"),
    })
    figures["lanes_batch_share_of_modelled"] = (f["lanes"]["flood_tokens_per_s"]
                                                / figures["batch_capacity_modelled_tokens_per_s"])
    doc = {"kind": "benchmark", "benchmark": "hol",
           "description": "Head-of-line blocking: interactive chats alone vs under a batch flood, "
                          "lanes vs FIFO (one class)",
           "engine": {**fleet.describe(), "batch_slot_cap": batch_cap},
           "config": {k: v for k, v in vars(args).items() if k != "json"},
           "figures": figures, "runs": [p.doc for p in phases.values()]}
    doc["headline"] = render(doc).splitlines()
    return doc


def render(doc: dict) -> str:
    f, c = doc["figures"], doc["config"]
    lines = [f"Head-of-line blocking: sim/{c['profile']} (SIMULATION), {c['max_seqs']} slots "
             f"(batch may hold {doc['engine']['batch_slot_cap']}), speed {c['sim_speed']}, "
             f"chats {c['chat_rate']}/s × {c['chat_prompt']} in / {c['chat_tokens']} out tokens, flood {c['flood_users']} users × "
             f"~{c['flood_tokens']} tokens, {c['duration']:.0f} s phases ({c['warmup']:.0f} s warm-up)",
             f"  {'phase':<12} {'chats':>5} {'err':>4} | {'TTFT p50':>10} {'p95':>10} {'p99':>10} | "
             f"{'step':>8} | {'batch tok/s':>11} {'err':>4}"]
    for label, p in f["phases"].items():
        t = p["chat_ttft_s"]
        lines.append(f"  {label:<12} {t['n']:>5} {p['chat_errors']:>4} | {ms(t['p50']):>10} {ms(t['p95']):>10} "
                     f"{ms(t['p99']):>10} {ms(p['chat_itl_p50_s']):>8} | {p['flood_tokens_per_s']:>11,.0f} "
                     f"{p['flood_errors']:>4}")
    ratio = f["lanes_ttft_p95_ratio"]
    share = f["lanes_batch_share_of_capacity"]
    lines += [
        f"Interactive TTFT p95 under the flood, lanes: {ratio:.2f}× unloaded (target ≤ 1.25×): "
        f"{'MET' if ratio <= 1.25 else 'MISSED'} (the engine step itself, chat ITL p50, is "
        f"{f['step_inflation']:.2f}× longer under the flood: batch size, not scheduling)",
        f"FIFO (one class): {f['fifo_ttft_p95_ratio']:.1f}× unloaded, {f['fifo_vs_lanes']:.1f}× worse than lanes",
        f"Batch throughput with lanes: {share * 100:.1f}% of capacity "
        f"({f['batch_capacity_tokens_per_s']:,.0f} tok/s measured with the flood alone; target ≥ 90%): "
        f"{'MET' if share >= 0.9 else 'MISSED'}; "
        f"{f['lanes_batch_share_of_modelled'] * 100:.1f}% of the modelled "
        f"{f['batch_capacity_modelled_tokens_per_s']:,.0f} tok/s",
    ]
    return "\n".join(lines)


def configure(parser: argparse.ArgumentParser) -> None:
    add_fleet_flags(parser, duration=30.0, warmup=8.0, max_seqs=32)
    parser.add_argument("--chat-rate", type=float, default=2.0, help="chats per second (Poisson)")
    parser.add_argument("--chat-prompt", type=int, default=200)
    parser.add_argument("--chat-tokens", type=int, default=32)
    parser.add_argument("--flood-users", type=int, default=40, help="concurrent batch submitters")
    parser.add_argument("--flood-prompt", type=int, default=128)
    parser.add_argument("--flood-tokens", type=int, default=1024, help="mean max_tokens (±50%%)")
    parser.add_argument("--batch-slot-share", type=float, default=None,
                        help="set the batch class's max_slot_share live first (default: leave it)")
    parser.add_argument("--fifo-class", default="interactive",
                        help="the one class of the FIFO configuration (interactive: no slot cap)")
    add_output_flags(parser)


def run(args: argparse.Namespace) -> int:
    return run_and_report(args, run_benchmark, render)


if __name__ == "__main__":
    main(__doc__, configure, run)
