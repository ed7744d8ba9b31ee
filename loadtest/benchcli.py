"""The shared command line of every benchmark: common flags, then run, print, optionally save the JSON."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from core import heap
from loadtest.results import to_json


def run_and_report(
    args: argparse.Namespace,
    benchmark: Callable[[argparse.Namespace], Coroutine[Any, Any, dict]],
    render: Callable[[dict], str],
) -> int:
    heap.settle()  # the load generator's own collection pauses would read as Laneway's latency
    doc = asyncio.run(benchmark(args))
    print(render(doc))
    if args.json:
        args.json.write_text(to_json(doc))
    return 0


def main(
    description: str | None,
    configure: Callable[[argparse.ArgumentParser], None],
    run: Callable[[argparse.Namespace], int],
) -> None:
    """`python -m loadtest.<benchmark>`: the same flags as `laneway` would give it."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    configure(parser)
    sys.exit(run(parser.parse_args()))


def add_fleet_flags(parser: argparse.ArgumentParser, *, duration: float, warmup: float, max_seqs: int) -> None:
    """The simulated fleet and phase timing every phase-based benchmark takes."""
    from workers.engines.sim.roofline import PROFILES

    parser.add_argument("--duration", type=float, default=duration, help="seconds per phase")
    parser.add_argument("--warmup", type=float, default=warmup, help="seconds before measuring, per phase")
    parser.add_argument("--profile", default="llama-8b-h100", choices=sorted(PROFILES))
    parser.add_argument("--max-seqs", type=int, default=max_seqs, help="the worker's slots (--sim-max-seqs)")
    parser.add_argument("--sim-speed", type=float, default=1.0)


# `laneway up`'s bridge without its load shedding: no measured stream limit, no refusal while
# delivery runs late. Both follow how fast this machine delivers frames now, not what a
# benchmark compares (lanes, fair shares, brokers, affinity).
NO_SHEDDING = ["--initial-stream-limit", "0", "--max-delivery-lag", "0"]


def add_shedding_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-shedding",
        action="store_true",
        help="the bridge takes every stream however late it delivers (no measured stream limit, no "
        "delivery-lag refusal): a loaded machine's late frames then refuse no request. Off: as deployed",
    )


def shedding(args: argparse.Namespace) -> list[str]:
    """The `laneway up` flags `--no-shedding` asks for (none without it)."""
    return NO_SHEDDING if args.no_shedding else []


def add_output_flags(parser: argparse.ArgumentParser) -> None:
    """--seed, --quiet (no progress bar) and --json (also write the figures there)."""
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--json", type=Path)
