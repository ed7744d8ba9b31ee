"""Benchmark: scale. N concurrent streaming clients (default 5,000) through ONE bridge and ONE
broker, with simulated workers sized to hold them all at once.

    python -m loadtest.scale [--clients 5000] [--workers 4] [--stream-rate 1.0] [--hold 30] [--json out.json]

Every client opens one long streaming chat (spread over `--ramp` seconds) and keeps it open;
once all N streams are producing tokens, a `--hold`-second window measures:
- errors by type (target 0), over the whole run;
- token delivery lag: the bridge's `laneway_frame_lag_seconds` (worker publish → bridge
  receipt) over the window, p50/p99 (target p99 ≤ 100 ms), and the client-observed inter-token
  gaps against the engine's modelled step time (gap p99 − step = what delivery adds at worst);
- memory per open stream: RSS of nats-server, bridge, broker and workers before the clients vs
  during the window, divided by the open streams.
Workers get ceil(N / workers) slots each and a sim speed that makes one decode step last
1 / `--stream-rate` seconds, so N streams cost N × rate tokens/s of CPU (2 cores hold a few
thousand tokens/s end to end). The client side is one aiohttp session (no connection limit).
Engine: SIMULATION (llama-8b-h100 step-time model, slowed down).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import tempfile
import time
from pathlib import Path

from loadtest.benchcli import add_output_flags, main, run_and_report
from loadtest.fleet import ROLES, Fleet, rss_bytes
from loadtest.generator import raise_fd_limit
from loadtest.phases import settle
from loadtest.progress import Progress
from loadtest.promtext import bucket_delta, fraction_at_most, histogram_quantile
from loadtest.results import error_kind, run_document, token_times
from loadtest.scenarios import Flow, PoolSpec, TenantSpec
from loadtest.stats import ms, summary
from loadtest.traffic import HttpTarget, Recorder, run_flows, sampler
from workers.sim import PROFILES

LAG = "laneway_frame_lag_seconds"


def sizing(args: argparse.Namespace) -> tuple[PoolSpec, int, float]:
    """(pool, max_tokens, modelled step seconds)."""
    per_worker = math.ceil(args.clients / args.workers)
    p = PROFILES[args.profile]
    step_at_speed_1 = p.decode_base_s + per_worker * p.decode_s_per_seq
    step = 1.0 / args.stream_rate
    speed = step_at_speed_1 / step
    # Streams must outlive the run: while the ramp fills the workers a step is shorter than at
    # full occupancy, so allow 4× the tokens a full-occupancy step would produce.
    max_tokens = math.ceil(4 * args.stream_rate * (args.ramp + args.settle_timeout + args.hold + 15))
    slots = per_worker + 8
    pool = PoolSpec(profile=args.profile, workers=args.workers, speed=round(speed, 6), max_seqs=slots,
                    kv_tokens=int(slots * (args.prompt + max_tokens) * 1.2))
    return pool, max_tokens, step


async def _wait_all_streaming(rec: Recorder, n: int, timeout: float) -> float:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if sum(1 for r in rec.results if r.ttft is not None) >= n:
            break
        await asyncio.sleep(0.2)
    return time.time()


async def run_benchmark(args: argparse.Namespace) -> dict:
    raise_fd_limit(2 * args.clients + 2048)
    pool, max_tokens, step = sizing(args)
    n_tenants = max(1, math.ceil(args.clients / 400))   # interactive: ≤ 512 waiting per tenant
    tenants = [TenantSpec(f"t{i:02d}") for i in range(n_tenants)]
    per = [args.clients // n_tenants + (1 if i < args.clients % n_tenants else 0) for i in range(n_tenants)]
    flows = [Flow("stream", t.name, "interactive", users=u, prompt_tokens=args.prompt, max_tokens=max_tokens,
                  ramp_s=args.ramp) for t, u in zip(tenants, per)]
    with tempfile.TemporaryDirectory(prefix="laneway-scale-") as tmp:
        async with Fleet(Path(tmp) / "lw", tenants, [pool]) as fleet:
            await asyncio.sleep(2.0)
            rss_before = fleet.rss_by_role()
            client_before = rss_bytes(os.getpid())
            rec = Recorder()
            progress = Progress(rec, args.ramp + args.hold, "scale") if not args.quiet else None
            async with HttpTarget(fleet.url, fleet.keys) as target:
                sampling = asyncio.create_task(sampler(rec, 1.0, fleet.open_streams, progress))
                load = asyncio.create_task(run_flows(target, rec, flows, 86400.0, seed=args.seed))
                t_start = time.time()
                t_all = await _wait_all_streaming(rec, args.clients, args.ramp + args.settle_timeout)
                ramp_s = t_all - t_start
                lag0 = (await fleet.scrape()).buckets(LAG)
                cpu0 = fleet.cpu()
                await asyncio.sleep(args.hold / 2)
                rss_during = fleet.rss_by_role()
                client_during = rss_bytes(os.getpid())
                open_mid = await fleet.open_streams()
                inflight_mid = len(rec.active)
                await asyncio.sleep(args.hold / 2)
                t_end = time.time()
                lag1 = (await fleet.scrape()).buckets(LAG)
                cpu = fleet.cpu() - cpu0
                load.cancel()
                await asyncio.gather(load, return_exceptions=True)
                sampling.cancel()
                await asyncio.gather(sampling, return_exceptions=True)
                if progress:
                    progress.close()
            await settle(fleet)
            engine = fleet.describe()
    window = (t_all, t_end)
    lag = bucket_delta(lag1, lag0)
    gaps = []
    tokens = 0
    for r in rec.results:
        times = token_times(r)
        for a, b in zip(times, times[1:]):
            if window[0] <= b < window[1]:
                gaps.append(b - a)
        tokens += sum(1 for t in times if window[0] <= t < window[1])
    errors: dict[str, int] = {}
    for r in rec.results:
        if (kind := error_kind(r)) is not None:
            errors[kind] = errors.get(kind, 0) + 1
    streaming = sum(1 for r in rec.results if r.ttft is not None)
    gap = summary(gaps)
    per_role = {role: (rss_during[role] - rss_before[role]) / max(open_mid, 1) for role in ROLES}
    figures = {
        "clients": args.clients, "streams_started": len(rec.results), "streams_with_tokens": streaming,
        "open_streams_bridge": open_mid, "in_flight_client": inflight_mid, "ramp_s": ramp_s,
        "errors": errors, "error_count": sum(errors.values()),
        "frame_lag_s": {"n": lag[-1][1] if lag else 0, "p50": histogram_quantile(lag, 0.5),
                        "p99": histogram_quantile(lag, 0.99), "share_le_100ms": fraction_at_most(lag, 0.1)},
        "gap_s": gap, "modelled_step_s": step, "gap_p99_minus_step_s": gap["p99"] - step,
        "tokens_per_s": tokens / (window[1] - window[0]),
        "laneway_cpu_cores": cpu / (window[1] - window[0]),
        "rss_before": rss_before, "rss_during": rss_during,
        "rss_per_stream_bytes": per_role,
        "rss_per_stream_total_bytes": sum(per_role.values()),
        "client_rss_per_stream_bytes": (client_during - client_before) / max(inflight_mid, 1),
    }
    run = run_document("scale", rec.results, rec.samples, window)
    doc = {"kind": "benchmark", "benchmark": "scale",
           "description": f"{args.clients} concurrent streaming clients through one bridge + broker",
           "engine": engine, "config": {k: v for k, v in vars(args).items() if k != "json"},
           "figures": figures, "runs": [run]}
    doc["headline"] = render(doc).splitlines()
    return doc


def render(doc: dict) -> str:
    f, c = doc["figures"], doc["config"]
    lag = f["frame_lag_s"]
    kib = {role: v / 1024 for role, v in f["rss_per_stream_bytes"].items()}
    errors = ", ".join(f"{k}: {v}" for k, v in f["errors"].items()) or "none"
    return "\n".join([
        f"Scale: {c['clients']} streaming clients, {c['workers']} sim workers (SIMULATION, "
        f"{c['profile']} slowed to a {f['modelled_step_s'] * 1000:.0f} ms step), one bridge + broker; "
        f"{c['hold']:.0f} s window after all streams started",
        f"  streams producing tokens: {f['streams_with_tokens']}/{c['clients']} (all started after "
        f"{f['ramp_s']:.1f} s); bridge open streams mid-window: {f['open_streams_bridge']:.0f}",
        f"  errors: {f['error_count']} ({errors}) (target 0): {'MET' if f['error_count'] == 0 else 'MISSED'}",
        f"  token delivery lag (worker publish → bridge, {lag['n']:.0f} frames): p50 {ms(lag['p50'])}, "
        f"p99 {ms(lag['p99'])}, {lag['share_le_100ms'] * 100:.2f}% ≤ 100 ms (target p99 ≤ 100 ms): "
        f"{'MET' if lag['p99'] <= 0.1 else 'MISSED'}",
        f"  client inter-token gap: p50 {ms(f['gap_s']['p50'])}, p99 {ms(f['gap_s']['p99'])} vs modelled "
        f"step {ms(f['modelled_step_s'])} → delivery adds ≤ {ms(f['gap_p99_minus_step_s'])} at p99",
        f"  throughput {f['tokens_per_s']:,.0f} tok/s; Laneway CPU {f['laneway_cpu_cores']:.2f} cores",
        "  memory per open stream: " + ", ".join(f"{role} {v:.1f} KiB" for role, v in kib.items())
        + f"; total {f['rss_per_stream_total_bytes'] / 1024:.1f} KiB (load generator "
          f"{f['client_rss_per_stream_bytes'] / 1024:.1f} KiB)",
    ])


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--clients", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--stream-rate", type=float, default=1.0, help="tokens/s per stream (sets the step)")
    parser.add_argument("--profile", default="llama-8b-h100", choices=sorted(PROFILES))
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--ramp", type=float, default=20.0, help="seconds over which clients connect")
    parser.add_argument("--settle-timeout", type=float, default=60.0,
                        help="after the ramp, wait this long at most for every stream's first token")
    parser.add_argument("--hold", type=float, default=30.0, help="the measurement window, seconds")
    add_output_flags(parser)


def run(args: argparse.Namespace) -> int:
    return run_and_report(args, run_benchmark, render)


if __name__ == "__main__":
    main(__doc__, configure, run)
