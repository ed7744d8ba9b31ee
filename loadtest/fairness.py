"""Benchmark: tenant fairness. Two tenants in one class offer load 10:1 (closed loop, no think
time: both stay backlogged); served token shares with equal weights (target 50% ± 5%), then
with weights 3:1 (target 75% ± 5%), in ONE run on one `laneway up`. The weights are changed
live, as an operator would (the tenants' documents in the `lw_tenants` KV bucket).

    python -m loadtest.fairness [--duration 25] [--warmup 5] [--max-seqs 16] [--light-users 32] [--brokers 1]
                                [--json out.json]

By default the 3 goes to the LIGHT tenant (the one offering 1/10 of the load), so the weighted
phase shows weights beating offered load. Shares count tokens that arrived inside the window,
and the window is checked to be one where both tenants were backlogged: the share of samples in
which each had requests still waiting for their first token. Engine: SIMULATION.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from loadtest.benchcli import add_fleet_flags, add_output_flags, add_shedding_flag, main, run_and_report, shedding
from loadtest.fleet import Fleet
from loadtest.phases import Phase, run_phase
from loadtest.results import tokens_in
from loadtest.scenarios import Flow, PoolSpec, TenantSpec

HEAVY, LIGHT = "heavy", "light"
TOLERANCE = 0.05


def shares(phase: Phase) -> dict:
    t0, t1 = phase.window
    served = {t: tokens_in([r for r in phase.rec.results if r.tenant == t], t0, t1) for t in (HEAVY, LIGHT)}
    total = sum(served.values())
    samples = [s for s in phase.rec.samples if t0 <= s.t <= t1]
    both = sum(1 for s in samples if s.waiting.get(HEAVY, 0) > 0 and s.waiting.get(LIGHT, 0) > 0)
    return {
        "tokens": served,
        "share": {t: (n / total if total else float("nan")) for t, n in served.items()},
        "tokens_per_s": total / (t1 - t0),
        "both_backlogged": both / len(samples) if samples else float("nan"),
        "errors": phase.doc["overall"]["failed"],
    }


async def run_benchmark(args: argparse.Namespace) -> dict:
    if args.light_users is None:
        args.light_users = 2 * args.max_seqs
    pool = PoolSpec(profile=args.profile, speed=args.sim_speed, max_seqs=args.max_seqs)
    tenants = [TenantSpec(HEAVY, default_class=args.klass), TenantSpec(LIGHT, default_class=args.klass)]
    flows = [
        Flow(
            HEAVY,
            HEAVY,
            args.klass,
            users=args.light_users * args.load_ratio,
            prompt_tokens=args.prompt,
            max_tokens=args.tokens,
        ),
        Flow(LIGHT, LIGHT, args.klass, users=args.light_users, prompt_tokens=args.prompt, max_tokens=args.tokens),
    ]
    weighted = {HEAVY: 1.0, LIGHT: 1.0, args.weighted: float(args.weight)}
    plan = [("equal", {HEAVY: 1.0, LIGHT: 1.0}, 0.5), ("weighted", weighted, args.weight / (args.weight + 1))]
    figures: dict = {}
    runs = []
    with tempfile.TemporaryDirectory(prefix="laneway-fair-") as tmp:
        async with Fleet(
            Path(tmp) / "lw", tenants, [pool], up_flags=["--brokers", str(args.brokers), *shedding(args)]
        ) as fleet:
            from loadtest.traffic import HttpTarget

            async with HttpTarget(fleet.url, fleet.keys) as target:
                for i, (label, weights, expected) in enumerate(plan):
                    await fleet.set_weights(weights)
                    phase = await run_phase(
                        fleet,
                        target,
                        label,
                        flows,
                        args.duration,
                        args.warmup,
                        seed=args.seed + i,
                        show_progress=not args.quiet,
                    )
                    fig = shares(phase)
                    watched = args.weighted if label == "weighted" else LIGHT
                    fig.update(
                        {
                            "weights": weights,
                            "watched": watched,
                            "expected": expected,
                            "met": abs(fig["share"][watched] - expected) <= TOLERANCE,
                        }
                    )
                    figures[label] = fig
                    runs.append(phase.doc)
            engine = fleet.describe()
    doc = {
        "kind": "benchmark",
        "benchmark": "fairness",
        "description": f"Two tenants in class {args.klass}, offered load {args.load_ratio}:1, both backlogged",
        "engine": engine,
        "config": {k: v for k, v in vars(args).items() if k != "json"},
        "figures": figures,
        "runs": runs,
    }
    doc["headline"] = render(doc).splitlines()
    return doc


def render(doc: dict) -> str:
    c = doc["config"]
    lines = [
        f"Fairness: sim/{c['profile']} (SIMULATION), {c['max_seqs']} slots, {c['brokers']} broker(s), "
        f"class {c['klass']}, "
        f"{HEAVY} {c['light_users'] * c['load_ratio']} users vs {LIGHT} {c['light_users']} users "
        f"(offered {c['load_ratio']}:1), {c['tokens']} tokens each, {c['duration']:.0f} s phases "
        f"({c['warmup']:.0f} s warm-up)"
    ]
    for label, f in doc["figures"].items():
        w = f["weights"]
        lines.append(
            f"  {label:<9} weights {HEAVY}:{LIGHT} = {w[HEAVY]:g}:{w[LIGHT]:g} → served share of "
            f"{f['watched']}: {f['share'][f['watched']] * 100:.1f}% (target {f['expected'] * 100:.0f}% ± 5%): "
            f"{'MET' if f['met'] else 'MISSED'}; tokens {f['tokens'][HEAVY]:,} vs {f['tokens'][LIGHT]:,}, "
            f"{f['tokens_per_s']:,.0f} tok/s, both backlogged {f['both_backlogged'] * 100:.0f}% of the "
            f"window, errors {f['errors']}"
        )
    return "\n".join(lines)


def configure(parser: argparse.ArgumentParser) -> None:
    add_fleet_flags(parser, duration=25.0, warmup=5.0, max_seqs=16)
    add_shedding_flag(parser)
    parser.add_argument("--klass", default="interactive", help="the one class both tenants use")
    parser.add_argument(
        "--light-users",
        type=int,
        default=None,
        help="the light tenant's concurrent users (default 2 × slots: it must stay "
        "backlogged at the broker even when it is owed 75%% of the slots)",
    )
    parser.add_argument("--load-ratio", type=int, default=10, help="heavy users per light user")
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--weight", type=float, default=3.0)
    parser.add_argument(
        "--weighted", choices=(HEAVY, LIGHT), default=LIGHT, help="which tenant gets --weight in the second phase"
    )
    parser.add_argument("--brokers", type=int, default=1, help="`laneway up --brokers N`")
    add_output_flags(parser)


def run(args: argparse.Namespace) -> int:
    return run_and_report(args, run_benchmark, render)


if __name__ == "__main__":
    main(__doc__, configure, run)
