"""One benchmark phase against a running fleet: flows for a while, measured after a warm-up,
then cut and settled so the next phase starts from an idle system."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from loadtest.fleet import Fleet
from loadtest.progress import Progress
from loadtest.results import run_document
from loadtest.scenarios import Flow
from loadtest.swarm import Joined, Swarm
from loadtest.traffic import Recorder, Target, run_flows, sampler


@dataclass
class Phase:
    doc: dict  # the run document (report input)
    rec: Recorder
    window: tuple[float, float]


async def settle(fleet: Fleet, timeout_s: float = 60.0) -> None:
    """Until the bridge has no open stream (cut requests' cancels have landed)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if await fleet.open_streams() == 0:
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.5)  # aborts reach the engines; pulls refresh


async def run_phase(
    fleet: Fleet,
    target: Target,
    label: str,
    flows: list[Flow],
    duration_s: float,
    warmup_s: float,
    *,
    drain_s: float = 0.0,
    drained: Callable[[Recorder], bool] | None = None,
    seed: int = 1,
    show_progress: bool = True,
    sample_s: float = 0.5,
    settle_after: bool = True,
    apart: Sequence[Flow] = (),
) -> Phase:
    """`flows` run in this process for `duration_s` (then drain until `drained`); `apart` run
    in a load-generator process of their own (`loadtest.swarm`) from the start until then, cut
    there. Noise goes apart when what is measured is the other flows' clock: a few thousand
    clients in one event loop with the measured ones would delay the measured ones' reads."""
    rec = Recorder()
    async with contextlib.AsyncExitStack() as stack:
        swarm = None
        if apart:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="laneway-apart-")))
            swarm = await stack.enter_async_context(
                Swarm(fleet.url, fleet.keys, list(apart), procs=1, workdir=workdir, seed=seed + 1)
            )
            await swarm.started()
        counted: Recorder | Joined = Joined(rec, swarm.tally) if swarm else rec
        progress = Progress(counted, duration_s, label) if show_progress else None
        sampling = asyncio.create_task(sampler(counted, sample_s, fleet.open_streams, progress))
        t0 = time.time()
        try:
            await run_flows(
                target,
                rec,
                flows,
                duration_s,
                seed=seed,
                drain_s=drain_s,
                drained=(lambda: drained(rec)) if drained else None,
            )
            if swarm:
                rec.results += await swarm.stop()
        finally:
            sampling.cancel()
            await asyncio.gather(sampling, return_exceptions=True)
            if progress:
                progress.close()
    window = (t0 + warmup_s, t0 + duration_s)
    if settle_after:  # False: streams stay open on purpose (a batch runs on)
        await settle(fleet)
    return Phase(run_document(label, rec.results, counted.samples, window), rec, window)
