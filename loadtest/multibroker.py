"""Benchmark: several brokers on one system (issue 14). `laneway up --brokers N --pii off` with one
worker, for each N (default 1, 2, 3) in ONE run: interactive chat TTFT p95 alone and under a
batch flood, errors, both against N = 1, and each broker's CPU per request.

    python -m loadtest.multibroker [--brokers 1 2 3] [--duration 20] [--warmup 5] [--json out.json]

Per N, a fresh `laneway up`, then two phases, each after the previous one has drained:
  alone   chats only: 2/s (Poisson), 2 KB prompts (512 tokens), 32 tokens out, class interactive
  flood   the same chats under a batch flood: 300 streams × ~400 tokens (closed loop, 512 B
          prompts), class batch
The traffic, its flags and the per-phase figures are the head-of-line benchmark's
(loadtest/hol.py); only the defaults differ (and --fifo-class is unused: every phase has lanes). Chats sent inside a phase's window are followed to
their first token. Broker CPU is utime + stime from /proc of each broker process over the whole
phase, ÷ the requests sent in it. Targets: TTFT p95 within 1.1× of 1 broker's, 0 errors; CPU
per request per broker about 1/N of 1 broker's where the design partitions the work.
Engine: SIMULATION (the worker's --sim-profile).
"""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path

import aiohttp

from loadtest import hol
from loadtest.benchcli import main, run_and_report, shedding
from loadtest.fleet import Fleet
from loadtest.phases import run_phase
from loadtest.processes import parents, tree_cpu_seconds
from loadtest.scenarios import PoolSpec, TenantSpec
from loadtest.stats import ms
from loadtest.traffic import HttpTarget

TARGET_RATIO = 1.1
PHASES = (("alone", False), ("flood", True))  # (label, with the flood)


def broker_cpu(pids: list[int]) -> dict[int, float]:
    """Each broker's CPU seconds, its PII pool's included."""
    parent_of = parents()
    return {pid: tree_cpu_seconds([pid], parent_of) for pid in pids}


async def _one_system(args: argparse.Namespace, brokers: int, seed: int) -> dict:
    """Both phases on a fresh `laneway up --brokers N`: figures per phase, and the phase documents."""
    pool = PoolSpec(profile=args.profile, speed=args.sim_speed, max_seqs=args.max_seqs)
    out: dict = {"phases": {}, "runs": []}
    with tempfile.TemporaryDirectory(prefix=f"laneway-brokers{brokers}-") as tmp:
        async with Fleet(
            Path(tmp) / "lw",
            [TenantSpec(hol.TENANT)],
            [pool],
            up_flags=["--brokers", str(brokers), "--pii", "off", "--metrics", *shedding(args)],
        ) as fleet:
            assert fleet.up is not None
            if args.batch_slot_share is not None or args.batch_prefill_share is not None:
                await fleet.set_class(hol.batch_policy(args.batch_slot_share, args.batch_prefill_share))
            async with HttpTarget(fleet.url, fleet.keys) as target:
                for i, (label, flood) in enumerate(PHASES):
                    pids = fleet.up.role_pids("broker")
                    before = broker_cpu(pids)
                    phase = await run_phase(
                        fleet,
                        target,
                        f"{brokers}-{label}",
                        hol.flows(args, True, flood, True),
                        args.duration,
                        args.warmup,
                        drain_s=120.0,
                        drained=hol.chats_started,
                        seed=seed + i,
                        show_progress=not args.quiet,
                    )
                    # A broker restarted meanwhile is not counted: its CPU restarted from 0.
                    alive = set(fleet.up.role_pids("broker"))
                    sent = len(phase.rec.results)
                    after = broker_cpu(pids)
                    cpu_ms = [
                        (after[pid] - before[pid]) * 1000 / sent if sent else math.nan for pid in pids if pid in alive
                    ]
                    async with aiohttp.ClientSession() as http:
                        schedulers = set(await fleet.up.schedulers(http))
                    out["phases"][label] = {
                        **hol.phase_figures(phase),
                        "requests": sent,
                        "broker_cpu_ms_per_request": cpu_ms,
                        "scheduler": [pid in schedulers for pid in pids if pid in alive],
                        "brokers_restarted": len(set(pids) - alive),
                    }
                    out["runs"].append(phase.doc)
            out["engine"] = fleet.describe()
    return out


async def run_benchmark(args: argparse.Namespace) -> dict:
    systems = {}
    for n in args.brokers:
        systems[n] = await _one_system(args, n, args.seed + 10 * n)
    base = systems[args.brokers[0]]["phases"]
    figures: dict = {}
    for n, system in systems.items():
        row: dict = {}
        for label, p in system["phases"].items():
            p95 = p["chat_ttft_s"]["p95"]
            row[label] = {
                **p,
                "chat_ttft_p95_s": p95,
                "ratio_to_first": p95 / base[label]["chat_ttft_s"]["p95"],
                "errors": p["chat_errors"] + p["flood_errors"],
            }
        row["met"] = all(
            r["ratio_to_first"] <= TARGET_RATIO and r["errors"] == 0 for r in (row[label] for label, _ in PHASES)
        )
        figures[str(n)] = row
    doc = {
        "kind": "benchmark",
        "benchmark": "multibroker",
        "description": "1..N brokers on one system: chat TTFT p95 alone and under a batch flood, "
        "errors, broker CPU per request",
        "engine": systems[args.brokers[0]]["engine"],
        "config": {k: v for k, v in vars(args).items() if k != "json"},
        "figures": figures,
        "runs": [run for s in systems.values() for run in s["runs"]],
    }
    doc["headline"] = render(doc).splitlines()
    return doc


def _cpu(phase: dict) -> str:
    """Each broker's CPU ms per request, the scheduler's marked `*` (a broker without the gauge
    schedules for itself: none is marked)."""
    return (
        " / ".join(
            f"{c:.2f}{'*' if s else ''}"
            for c, s in zip(phase["broker_cpu_ms_per_request"], phase["scheduler"], strict=True)
        )
        + f" (sum {sum(phase['broker_cpu_ms_per_request']):.2f})"
    )


def render(doc: dict) -> str:
    c, f = doc["config"], doc["figures"]
    first = c["brokers"][0]
    lines = [
        f"Several brokers: sim/{c['profile']} (SIMULATION), 1 worker ({c['max_seqs'] or 'the profile’s'} "
        f"slots), --pii off; chats {c['chat_rate']}/s × {c['chat_prompt']} in / {c['chat_tokens']} out "
        f"tokens, flood {c['flood_users']} streams × {c['flood_prompt_bytes']:,} B in / ~{c['flood_tokens']} out "
        f"tokens; {c['duration']:.0f} s "
        f"phases ({c['warmup']:.0f} s warm-up)",
        f"  {'brokers':>7} | {'chat TTFT p95 alone':>19} {f'÷ {first}':>6} | {'under the flood':>15} "
        f"{f'÷ {first}':>6} | {'errors':>6} | broker CPU ms/request, alone; under the flood",
    ]
    for n, row in f.items():
        alone, flood = row["alone"], row["flood"]
        lines.append(
            f"  {n:>7} | {ms(alone['chat_ttft_p95_s']):>19} {alone['ratio_to_first']:>5.2f}× | "
            f"{ms(flood['chat_ttft_p95_s']):>15} {flood['ratio_to_first']:>5.2f}× | "
            f"{alone['errors'] + flood['errors']:>6} | {_cpu(alone)}; {_cpu(flood)}"
        )
    for n, row in f.items():
        if n != str(first):
            lines.append(
                f"{n} brokers: TTFT p95 within {TARGET_RATIO}× of {first} broker(s) and 0 errors: "
                f"{'MET' if row['met'] else 'MISSED'}"
            )
    if any(any(row[label]["scheduler"]) for row in f.values() for label, _ in PHASES):
        lines.append("  (* the broker holding the scheduler lease at the phase's end)")
    return "\n".join(lines)


def configure(parser: argparse.ArgumentParser) -> None:
    hol.configure(parser)
    parser.add_argument(
        "--brokers",
        type=int,
        nargs="+",
        default=[1, 2, 3],
        help="broker counts, each its own system; ratios are to the first",
    )
    # Issue 14's measurement: 2 KB chat prompts; the flood's prompts as hol's were then (128 tokens).
    parser.set_defaults(
        duration=20.0,
        warmup=5.0,
        max_seqs=None,
        chat_prompt=512,
        flood_users=300,
        flood_tokens=400,
        flood_prompt_bytes=512,
    )


def run(args: argparse.Namespace) -> int:
    return run_and_report(args, run_benchmark, render)


if __name__ == "__main__":
    main(__doc__, configure, run)
