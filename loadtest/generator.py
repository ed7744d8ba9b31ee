"""`laneway loadtest`: run a named scenario against Laneway and write the figures as JSON.

    python -m loadtest.generator --scenario batch-flood --scale 0.05 --duration 60 --json out.json
    python -m loadtest.generator --scenario cost-stack-120qps --scale 0.02 --target nats
    python -m loadtest.generator --scenario b2b-100k-dau --url http://host:8080 --api-key customer00=sk-...
    python -m loadtest.generator --list

By default it starts the system itself (`laneway up` with the scenario's tenants and models plus
extra simulated workers, all separate processes) and stops it after. With `--url` (HTTP) or
`--nats-url` (NATS) it drives an existing deployment instead. The scenarios are in
`loadtest/scenarios.py`; `--scale` multiplies rates, users and workers.
The engine is a SIMULATION (modelled GPU step times): every figure is labelled so.

Per class, tenant and flow: TTFT, inter-token latency and end-to-end p50/p95/p99, throughput,
errors by type and SLO attainment (TTFT p95 < 800 ms; p95 < 1 s). `--report FILE.html` also
renders the plots (needs matplotlib).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import resource
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from loadtest import scenarios
from loadtest.fleet import Fleet
from loadtest.progress import Progress
from loadtest.results import run_document, to_json
from loadtest.scenarios import Scenario
from loadtest.stats import ms as _ms
from loadtest.traffic import HttpTarget, NatsTarget, Recorder, run_flows, sampler


def raise_fd_limit(wanted: int) -> int:
    """Raise the soft open-files limit towards `wanted` (children inherit it); the new limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return target
    return soft


def _max_concurrency(s: Scenario) -> int:
    closed = sum(f.users for f in s.flows if not f.open_loop)
    return closed + sum(math.ceil(f.rate * 30) for f in s.flows if f.open_loop)


async def drive(
    s: Scenario,
    target,
    *,
    label: str,
    open_streams=None,
    drain_s: float = 10.0,
    seed: int = 1,
    show_progress: bool = True,
    sample_s: float = 0.5,
) -> dict:
    """Run the scenario's flows against a ready target; one run document."""
    rec = Recorder()
    progress = Progress(rec, s.duration_s, label) if show_progress else None
    sampling = asyncio.create_task(sampler(rec, sample_s, open_streams, progress))
    t0 = time.time()
    try:
        await run_flows(target, rec, s.flows, s.duration_s, seed=seed, drain_s=drain_s)
    finally:
        t1 = time.time()
        sampling.cancel()
        await asyncio.gather(sampling, return_exceptions=True)
        if progress:
            progress.close()
    return run_document(
        label,
        rec.results,
        rec.samples,
        (t0, min(t1, t0 + s.duration_s)),
        slo_ttft_s=s.slo_ttft_s,
        slo_latency_s=s.slo_latency_s,
    )


def _header(s: Scenario, target: str, engine: dict | str) -> dict:
    return {
        "kind": "loadtest",
        "scenario": s.name,
        "description": s.description,
        "source": s.source,
        "scale": s.scale,
        "duration_s": s.duration_s,
        "target": target,
        "engine": engine,
        "slo": {"ttft_s": s.slo_ttft_s, "latency_s": s.slo_latency_s},
        "flows": [asdict(f) for f in s.flows],
        "created_at": time.time(),
    }


async def run_scenario(
    s: Scenario,
    *,
    target: str = "http",
    url: str | None = None,
    keys: dict[str, str] | None = None,
    nats_url: str | None = None,
    data_dir: Path | None = None,
    drain_s: float = 10.0,
    seed: int = 1,
    show_progress: bool = True,
) -> dict:
    raise_fd_limit(2 * _max_concurrency(s) + 1024)
    if url or nats_url:  # an existing deployment
        if target == "nats":
            if not nats_url:
                raise ValueError("--target nats needs --nats-url")
            t: NatsTarget | HttpTarget = NatsTarget(nats_url)
        elif url:
            t = HttpTarget(url, keys or {})
        else:
            raise ValueError("--target http needs --url")
        async with t:
            run = await drive(s, t, label=s.name, drain_s=drain_s, seed=seed, show_progress=show_progress)
        return {**_header(s, target, "external deployment"), "runs": [run]}
    with tempfile.TemporaryDirectory(prefix="laneway-loadtest-") as tmp:
        async with Fleet(data_dir or Path(tmp) / "lw", s.tenants, s.pools) as fleet:
            assert fleet.up is not None
            t = (
                NatsTarget(fleet.nats_url, credentials=fleet.up.credentials("svc-bridge"))
                if target == "nats"
                else HttpTarget(fleet.url, fleet.keys)
            )
            async with t:
                cpu0 = fleet.cpu()
                run = await drive(
                    s,
                    t,
                    label=s.name,
                    open_streams=fleet.open_streams,
                    drain_s=drain_s,
                    seed=seed,
                    show_progress=show_progress,
                )
                run["laneway_cpu_s"] = fleet.cpu() - cpu0
            return {**_header(s, target, fleet.describe()), "runs": [run]}


# -- printing -------------------------------------------------------------------------------
def ms(seconds: float | None) -> str:
    return _ms(float("nan") if seconds is None else seconds)  # JSON writes no-sample NaN as null


def _row(name: str, g: dict) -> str:
    t, i, e = g["ttft_s"], g["itl_s"], g["e2e_s"]
    errs = ",".join(f"{k}:{v}" for k, v in g["errors"].items()) or "-"
    slo = g["slo"]
    return (
        f"  {name:<16} {g['requests']:>6} {g['failed']:>5} | {ms(t['p50']):>10} {ms(t['p95']):>10} "
        f"{ms(t['p99']):>10} | {ms(i['p50']):>9} {ms(i['p95']):>9} {ms(i['p99']):>9} | "
        f"{ms(e['p95']):>11} | {g['tokens_per_s']:>8,.0f} | "
        f"{_pct(slo['ttft_800ms']['attainment'])} {_pct(slo['latency_1s']['attainment'])} | {errs}"
    )


def _pct(value: float | None) -> str:
    return "    —" if value is None or value != value else f"{value * 100:5.1f}%"


def render(doc: dict) -> str:
    lines = [
        f"Scenario {doc['scenario']} (scale {doc['scale']}, {doc['duration_s']:.0f} s, "
        f"target {doc['target']}; engine: SIMULATION)",
        f"  {doc['description']}",
    ]
    head = (
        f"  {'group':<16} {'reqs':>6} {'err':>5} | {'TTFT p50':>10} {'p95':>10} {'p99':>10} | "
        f"{'ITL p50':>9} {'p95':>9} {'p99':>9} | {'e2e p95':>11} | {'tok/s':>8} | "
        f"{'<800ms':>6} {'<1s':>6} | errors"
    )
    for run in doc["runs"]:
        for title, key in (("class", "by_class"), ("tenant", "by_tenant"), ("flow", "by_flow")):
            groups = run[key]
            if key == "by_tenant" and len(groups) > 8:
                continue  # many tenants: the class and flow tables say it
            lines += [f" by {title}:", head] + [_row(n, g) for n, g in groups.items()]
        lines.append(_row("ALL", run["overall"]))
        o = run["overall"]["slo"]
        lines.append(
            f"  SLO: TTFT p95 < 800 ms {'MET' if o['ttft_800ms']['met'] else 'MISSED'} "
            f"(p95 {ms(o['ttft_800ms']['p95_s'])}); p95 < 1 s "
            f"{'MET' if o['latency_1s']['met'] else 'MISSED'}"
        )
    return "\n".join(lines)


# -- CLI ------------------------------------------------------------------------------------
def _keys(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        tenant, _, key = pair.partition("=")
        if not key:
            raise argparse.ArgumentTypeError(f"--api-key wants TENANT=KEY, got {pair!r}")
        out[tenant] = key
    return out


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", choices=sorted(scenarios.SCENARIOS), help="named scenario")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply rates, users and workers")
    parser.add_argument("--duration", type=float, default=None, help="seconds of load (default: the scenario's)")
    parser.add_argument("--drain", type=float, default=10.0, help="seconds to let requests in flight finish")
    parser.add_argument("--target", choices=("http", "nats"), default="http")
    parser.add_argument("--url", help="drive an existing bridge instead of starting one")
    parser.add_argument(
        "--api-key",
        action="append",
        default=[],
        metavar="TENANT=KEY",
        help="with --url: the key of each tenant the scenario names",
    )
    parser.add_argument("--nats-url", help="with --target nats: drive an existing deployment")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--report", type=Path, help="also render an HTML report (needs matplotlib)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    if args.list or not args.scenario:
        for s in scenarios.SCENARIOS.values():
            print(f"{s.name:<22} {s.description}\n{'':<22} ({s.source})")
        return 0 if args.list else 2
    s = scenarios.get(args.scenario).scaled(args.scale).with_duration(args.duration)
    doc = asyncio.run(
        run_scenario(
            s,
            target=args.target,
            url=args.url,
            keys=_keys(args.api_key),
            nats_url=args.nats_url,
            drain_s=args.drain,
            seed=args.seed,
            show_progress=not args.quiet,
        )
    )
    print(render(doc))
    if args.json:
        args.json.write_text(to_json(doc))
        print(f"results: {args.json}")
    if args.report:
        from loadtest import report

        report.write(doc, args.report)
        print(f"report: {args.report}")
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    configure(p)
    sys.exit(run(p.parse_args()))
