"""The shared command-line tail of every benchmark: run, print, optionally save the JSON."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from laneway import heap
from loadtest.results import to_json


def run_and_report(args: argparse.Namespace,
                   benchmark: Callable[[argparse.Namespace], Coroutine[Any, Any, dict]],
                   render: Callable[[dict], str]) -> int:
    heap.settle()   # the load generator's own collection pauses would read as Laneway's latency
    doc = asyncio.run(benchmark(args))
    print(render(doc))
    if args.json:
        args.json.write_text(to_json(doc))
    return 0


def main(description: str | None, configure: Callable[[argparse.ArgumentParser], None],
         run: Callable[[argparse.Namespace], int]) -> None:
    """`python -m loadtest.<benchmark>`: the same flags as `laneway` would give it."""
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    configure(parser)
    sys.exit(run(parser.parse_args()))
