"""Benchmark: scale. N concurrent streaming clients through ONE bridge and ONE broker, with
simulated workers sized to hold them all at once, each stream at `--stream-rate` tokens/s (the
design's streams run at ~30).

    python -m loadtest.scale [--clients 5000] [--stream-rate 30] [--client-procs 2] [--hold 30] [--json out.json]
    python -m loadtest.scale --find-max [--steps 500,1000,1500,2000,3000,5000,7500,10000]
    python -m loadtest.scale --clients 3000      # past capacity: 503s before acceptance, none failed after

Every client opens one long streaming chat (spread over `--ramp` seconds) and keeps it open;
once all N streams are producing tokens, a `--hold`-second window measures:
- errors by type (target 0), over the whole run;
- token delivery lag: the bridge's `laneway_frame_lag_seconds` (worker publish → bridge
  receipt) over the window, p50/p99 (target p99 ≤ 100 ms), and the client-observed inter-token
  gaps against the engine's modelled step time (gap p99 − step = what delivery adds at worst);
- memory per open stream: RSS of nats-server, bridge, broker and workers before the clients vs
  during the window, divided by the open streams;
- CPU: Laneway's processes and the load generator's, apart.
Workers get ceil(N / workers) slots each and a sim speed that makes one decode step last
1 / `--stream-rate` seconds, so N streams cost N × rate tokens/s of CPU. The clients run in
`--client-procs` processes of their own (`loadtest/swarm.py`), each one aiohttp session.
`--find-max` runs one fleet per step and stops at the first step that misses: the most streams
held with 0 errors, every stream producing tokens and lag p99 ≤ 100 ms, and why the next failed.
Errors are split into refusals before acceptance (429/503: the clean overload path, which the
closed-loop clients retry after 0.5–1.5 s) and failures of streams already accepted.
Engine: SIMULATION (llama-8b-h100 step-time model, slowed down).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import tempfile
import time
from pathlib import Path

from bridge.config import BridgeConfig
from core.promtext import bucket_delta, fraction_at_most, histogram_quantile
from loadtest.benchcli import add_output_flags, main, run_and_report
from loadtest.fleet import ROLES, Fleet, rss_bytes
from loadtest.generator import raise_fd_limit
from loadtest.phases import settle
from loadtest.progress import Progress
from loadtest.results import error_kind, run_document, token_times
from loadtest.scenarios import Flow, PoolSpec, TenantSpec
from loadtest.stats import ms, summary
from loadtest.swarm import Swarm
from loadtest.traffic import sampler
from workers.engines.sim.roofline import PROFILES, step_seconds

LAG = "laneway_frame_lag_seconds"
SIM_MODEL_LEN = 8192  # the sim worker's max_model_len (prompt + output)
LAG_P99_TARGET_S = 0.1


def sizing(args: argparse.Namespace, clients: int) -> tuple[PoolSpec, int, float]:
    """(pool, max_tokens, modelled step seconds)."""
    per_worker = math.ceil(clients / args.workers)
    p = PROFILES[args.profile]
    step = 1.0 / args.stream_rate
    # Streams must outlive the run: while the ramp fills the workers a step is shorter than at
    # full occupancy, so allow 4× the tokens a full-occupancy step would produce, up to what the
    # sim takes (prompt + max_tokens ≤ its max_model_len: minutes at 30 tok/s, longer than a run).
    max_tokens = min(
        math.ceil(4 * args.stream_rate * (args.ramp + args.settle_timeout + args.hold + 15)),
        SIM_MODEL_LEN - args.prompt - 1,
    )
    # Every stream decoding at its longest context: no step outlasts `step`, and the floor holds it there.
    step_at_speed_1 = step_seconds(p, per_worker * (args.prompt + max_tokens), per_worker)
    speed = step_at_speed_1 / step
    slots = per_worker + 8
    # The step never shorter than at full occupancy: streams the bridge admits run at the rate
    # modelled (not faster for being fewer), so the offered load is N × rate however many run.
    pool = PoolSpec(
        profile=args.profile,
        workers=args.workers,
        speed=round(speed, 6),
        max_seqs=slots,
        kv_tokens=int(slots * (args.prompt + max_tokens) * 1.2),
        min_step_s=round(step, 6),
    )
    return pool, max_tokens, step


def _rss(pids: list[int]) -> int:
    return sum(rss_bytes(pid) for pid in pids)


async def _wait_all_streaming(swarm: Swarm, n: int, timeout: float) -> float:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline and swarm.tally.streaming < n:
        await asyncio.sleep(0.2)
    return time.time()


async def measure(args: argparse.Namespace, clients: int) -> dict:
    """One fleet, `clients` streams: the figures and the run document."""
    raise_fd_limit(2 * clients + 2048)
    pool, max_tokens, step = sizing(args, clients)
    n_tenants = max(1, math.ceil(clients / 400))  # interactive: ≤ 512 waiting per tenant
    tenants = [TenantSpec(f"t{i:02d}") for i in range(n_tenants)]
    per = [clients // n_tenants + (1 if i < clients % n_tenants else 0) for i in range(n_tenants)]
    flows = [
        Flow(
            "stream", t.name, "interactive", users=u, prompt_tokens=args.prompt, max_tokens=max_tokens, ramp_s=args.ramp
        )
        for t, u in zip(tenants, per, strict=True)
    ]
    with tempfile.TemporaryDirectory(prefix="laneway-scale-") as tmp:
        bridge_flags = ["--max-streams", str(args.max_streams), "--max-delivery-lag", str(args.max_delivery_lag)]
        async with Fleet(args.data_dir or Path(tmp) / "lw", tenants, [pool], up_flags=bridge_flags) as fleet:
            await asyncio.sleep(2.0)
            rss_before = fleet.rss_by_role()
            async with Swarm(
                fleet.url, fleet.keys, flows, procs=args.client_procs, workdir=Path(tmp), seed=args.seed
            ) as swarm:
                client_before = _rss(swarm.pids())
                progress = Progress(swarm.tally, args.ramp + args.hold, f"scale {clients}") if not args.quiet else None
                sampling = asyncio.create_task(sampler(swarm.tally, 1.0, fleet.open_streams, progress))
                t_start = time.time()
                t_all = await _wait_all_streaming(swarm, clients, args.ramp + args.settle_timeout)
                ramp_s = t_all - t_start
                lag0 = (await fleet.scrape()).buckets(LAG)
                cpu0, client_cpu0 = fleet.cpu(), swarm.cpu()
                await asyncio.sleep(args.hold / 2)
                rss_during = fleet.rss_by_role()
                client_during = _rss(swarm.pids())
                open_mid = await fleet.open_streams()
                limit_mid = await fleet.gauge("laneway_stream_limit")
                inflight_mid = swarm.tally.in_flight()
                await asyncio.sleep(args.hold / 2)
                t_end = time.time()
                lag1 = (await fleet.scrape()).buckets(LAG)
                cpu, client_cpu = fleet.cpu() - cpu0, swarm.cpu() - client_cpu0
                results = await swarm.stop()
                sampling.cancel()
                await asyncio.gather(sampling, return_exceptions=True)
                if progress:
                    progress.close()
            await settle(fleet)
            engine = fleet.describe()
    window = (t_all, t_end)
    span = window[1] - window[0]
    lag = bucket_delta(lag1, lag0)
    gaps = []
    tokens = 0
    for r in results:
        times = token_times(r)
        for a, b in itertools.pairwise(times):
            if window[0] <= b < window[1]:
                gaps.append(b - a)
        tokens += sum(1 for t in times if window[0] <= t < window[1])
    errors: dict[str, int] = {}
    refused = 0  # answered 429/503 before the stream was accepted: the clean overload path
    for r in results:
        if (kind := error_kind(r)) is not None:
            errors[kind] = errors.get(kind, 0) + 1
            refused += r.status in (429, 503)
    gap = summary(gaps)
    per_role = {role: (rss_during[role] - rss_before[role]) / max(open_mid, 1) for role in ROLES}
    figures = {
        "clients": clients,
        "streams_started": len(results),
        "streams_with_tokens": sum(1 for r in results if r.ttft is not None),
        "open_streams_bridge": open_mid,
        "stream_limit_bridge": limit_mid,
        "in_flight_client": inflight_mid,
        "ramp_s": ramp_s,
        "errors": errors,
        "error_count": sum(errors.values()),
        "refused_before_acceptance": refused,
        "failed_after_acceptance": sum(errors.values()) - refused,
        "frame_lag_s": {
            "n": lag[-1][1] if lag else 0,
            "p50": histogram_quantile(lag, 0.5),
            "p99": histogram_quantile(lag, 0.99),
            "share_le_100ms": fraction_at_most(lag, 0.1),
        },
        "gap_s": gap,
        "modelled_step_s": step,
        "gap_p99_minus_step_s": gap["p99"] - step,
        "tokens_per_s": tokens / span,
        "laneway_cpu_cores": cpu / span,
        "client_procs": args.client_procs,
        "client_cpu_cores": client_cpu / span,
        "rss_before": rss_before,
        "rss_during": rss_during,
        "rss_per_stream_bytes": per_role,
        "rss_per_stream_total_bytes": sum(per_role.values()),
        "client_rss_per_stream_bytes": (client_during - client_before) / max(inflight_mid, 1),
    }
    figures["missed"] = missed(figures)
    return {
        "clients": clients,
        "engine": engine,
        "figures": figures,
        "run": run_document(f"scale-{clients}", results, swarm.tally.samples, window),
    }


def missed(f: dict) -> list[str]:
    """Why a run does not count as held: empty when it does."""
    why = []
    if f["error_count"]:
        why.append(f"{f['error_count']} errors ({_errors(f)})")
    if f["streams_with_tokens"] < f["clients"]:
        why.append(f"only {f['streams_with_tokens']}/{f['clients']} streams produced tokens")
    p99 = f["frame_lag_s"]["p99"]
    if not p99 <= LAG_P99_TARGET_S:  # NaN (no frames) misses too
        why.append(f"lag p99 {ms(p99)} > {ms(LAG_P99_TARGET_S)}")
    return why


async def run_benchmark(args: argparse.Namespace) -> dict:
    config = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "json"}
    steps = args.steps if args.find_max else [args.clients]
    runs = []
    for clients in steps:
        runs.append(await measure(args, clients))
        if args.find_max and runs[-1]["figures"]["missed"]:
            break
    held = [r["clients"] for r in runs if not r["figures"]["missed"]]
    doc = {
        "kind": "benchmark",
        "benchmark": "scale",
        "description": f"concurrent streaming clients at {args.stream_rate:g} tok/s through one bridge + broker",
        "engine": runs[0]["engine"],
        "config": config,
        "figures": runs[-1]["figures"]
        if not args.find_max
        else {"max_held": max(held, default=0), "steps": {r["clients"]: r["figures"] for r in runs}},
        "runs": [r["run"] for r in runs],
    }
    doc["headline"] = render(doc).splitlines()
    return doc


def _errors(f: dict) -> str:
    return ", ".join(f"{k}: {v}" for k, v in f["errors"].items()) or "none"


def render_one(f: dict, c: dict) -> list[str]:
    lag = f["frame_lag_s"]
    kib = {role: v / 1024 for role, v in f["rss_per_stream_bytes"].items()}
    return [
        f"Scale: {f['clients']} streaming clients at {c['stream_rate']:g} tok/s, {c['workers']} sim workers "
        f"(SIMULATION, {c['profile']} slowed to a {f['modelled_step_s'] * 1000:.0f} ms step), one bridge + "
        f"broker; {c['hold']:.0f} s window after all streams started",
        f"  streams producing tokens: {f['streams_with_tokens']}/{f['clients']} (all started after "
        f"{f['ramp_s']:.1f} s); bridge open streams mid-window: {f['open_streams_bridge']:.0f}, "
        f"its measured limit {f.get('stream_limit_bridge', float('nan')):.0f}",
        f"  failed after acceptance: {f['failed_after_acceptance']} (target 0): "
        f"{'MET' if f['failed_after_acceptance'] == 0 else 'MISSED'}; refused before acceptance: "
        f"{f['refused_before_acceptance']} (429/503 with Retry-After, honoured by their clients); "
        f"errors by kind: {_errors(f)}",
        f"  token delivery lag (worker publish → bridge, {lag['n']:.0f} frames): p50 {ms(lag['p50'])}, "
        f"p99 {ms(lag['p99'])}, {lag['share_le_100ms'] * 100:.2f}% ≤ 100 ms (target p99 ≤ 100 ms): "
        f"{'MET' if lag['p99'] <= LAG_P99_TARGET_S else 'MISSED'}",
        f"  client inter-token gap: p50 {ms(f['gap_s']['p50'])}, p99 {ms(f['gap_s']['p99'])} vs modelled "
        f"step {ms(f['modelled_step_s'])} → delivery adds ≤ {ms(f['gap_p99_minus_step_s'])} at p99",
        f"  throughput {f['tokens_per_s']:,.0f} tok/s; CPU: Laneway {f['laneway_cpu_cores']:.2f} cores, "
        f"load generator {f['client_cpu_cores']:.2f} cores in {f['client_procs']} processes",
        "  memory per open stream: "
        + ", ".join(f"{role} {v:.1f} KiB" for role, v in kib.items())
        + f"; total {f['rss_per_stream_total_bytes'] / 1024:.1f} KiB (load generator "
        f"{f['client_rss_per_stream_bytes'] / 1024:.1f} KiB)",
    ]


def render(doc: dict) -> str:
    f, c = doc["figures"], doc["config"]
    if not c["find_max"]:
        return "\n".join(render_one(f, c))
    lines = []
    for clients, step in f["steps"].items():
        lines += render_one(step, c)
        lines.append(
            f"  → {clients} streams: " + ("held" if not step["missed"] else "MISSED: " + "; ".join(step["missed"]))
        )
    failed = [(n, s) for n, s in f["steps"].items() if s["missed"]]
    verdict = f"Most streams held at {c['stream_rate']:g} tok/s (0 errors, lag p99 ≤ 100 ms): {f['max_held']}"
    if failed:
        n, s = failed[0]
        verdict += f"; first miss at {n}: " + "; ".join(s["missed"])
    else:
        verdict += f" (every step held; the largest step tried was {max(f['steps'])})"
    return "\n".join([*lines, verdict])


def _steps(text: str) -> list[int]:
    steps = sorted({int(s) for s in text.split(",") if s.strip()})
    if not steps or steps[0] < 1:
        raise argparse.ArgumentTypeError("--steps wants positive stream counts, e.g. 500,1000,2000")
    return steps


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--clients", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--stream-rate", type=float, default=30.0, help="tokens/s per stream (sets the step)")
    parser.add_argument(
        "--client-procs", type=int, default=2, help="load generator processes, each driving its share of the streams"
    )
    parser.add_argument(
        "--find-max",
        action="store_true",
        help="step the stream count up (--steps) until a step misses; report the most held",
    )
    parser.add_argument("--steps", type=_steps, default=[500, 1000, 1500, 2000, 3000, 5000, 7500, 10000])
    parser.add_argument("--profile", default="llama-8b-h100", choices=sorted(PROFILES))
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--ramp", type=float, default=20.0, help="seconds over which clients connect")
    parser.add_argument(
        "--settle-timeout",
        type=float,
        default=60.0,
        help="after the ramp, wait this long at most for every stream's first token",
    )
    parser.add_argument("--hold", type=float, default=30.0, help="the measurement window, seconds")
    parser.add_argument(
        "--max-streams",
        type=int,
        default=BridgeConfig.max_streams,
        help="the bridge's cap on open streams (past it: 503 before storing); 0: none",
    )
    parser.add_argument(
        "--max-delivery-lag",
        type=float,
        default=BridgeConfig.max_delivery_lag_s,
        help="the bridge takes no new stream while its frames run this late (s); 0: off",
    )
    parser.add_argument("--data-dir", type=Path, help="keep the fleet's store and logs here (one step)")
    add_output_flags(parser)


def run(args: argparse.Namespace) -> int:
    return run_and_report(args, run_benchmark, render)


if __name__ == "__main__":
    main(__doc__, configure, run)
