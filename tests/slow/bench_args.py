"""What the short benchmark runs share: a benchmark's own command line, and the flag that turns
the bridge's load shedding off."""

from __future__ import annotations

import argparse

# Behaviour, not speed: on a loaded machine frames reach the bridge late, its measured stream
# limit falls to its floor and it refuses new streams (`overloaded:measured_streams`,
# `overloaded:delivery_lag`), which the short benchmark runs would count as errors (issue 38).
# They turn that shedding off; scale's runs measure it, and keep it.
SHED_NOTHING = "--no-shedding"


def bench_args(module, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    module.configure(parser)
    return parser.parse_args(list(argv))
