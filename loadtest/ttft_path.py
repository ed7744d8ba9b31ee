"""Where a request's first token waited, from Laneway's own usage records (`LW_USAGE`) joined to
the client's results by request id (x-request-id):

  queue   in the broker's lanes: from the broker taking the request to its dispatch (`queued_s`)
  engine  on the worker: from the dispatch's arrival to the first token (`ttft_s`): the step in
          flight, the engine's own queue, the prefill's steps
  hops    the rest of the client's TTFT: the bridge, the request log's PubAck, the broker's intake,
          the dispatch and the frames back, each a trip through NATS

So a benchmark can say whether a slow first token waited in Laneway or in the engine's steps."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from datetime import datetime

from core.usage_log import read_usage
from loadtest.fleet import Fleet
from loadtest.http_client import Result
from loadtest.stats import summary
from schemas.subjects import Subjects
from schemas.usage import Usage

PARTS = ("queue", "engine", "hops")


async def usage_of(fleet: Fleet, tenant: str, since: datetime, ids: set[str], timeout_s: float = 15.0) -> dict:
    """`tenant`'s usage records since `since`, by request id, once each of `ids` has one (a
    request ends before its record is written) or after `timeout_s`."""
    assert fleet.up is not None  # inside `async with fleet`
    nc = await fleet.up.connect_nats("ops")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    try:
        while True:
            records = {u.request_id: u async for u in read_usage(nc.jetstream(), Subjects(), tenant, since)}
            if ids <= records.keys() or loop.time() >= deadline:
                return records
            await asyncio.sleep(0.5)
    finally:
        await nc.close()


def ttft_path(results: Iterable[Result], usage: dict[str, Usage]) -> dict[str, dict[str, float]]:
    """Each part's summary (seconds) over the results that had a first token and a record. A
    request refused and sent again is left out: its TTFT counts from its first try, its record
    from its last."""
    parts: dict[str, list[float]] = {part: [] for part in PARTS}
    for r in results:
        u = usage.get(r.request_id)
        if r.ttft is None or r.retries or u is None or u.ttft_s is None:
            continue
        parts["queue"].append(u.queued_s)
        parts["engine"].append(u.ttft_s)
        parts["hops"].append(r.ttft - u.queued_s - u.ttft_s)
    return {part: summary(values) for part, values in parts.items()}
