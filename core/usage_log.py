"""Reading the metered usage log (`LW_USAGE`): one tenant's `Usage` records over a time range.

Reads with an ordered, ephemeral consumer filtered to `lw.usage.<tenant>`, starting at the stream
time `since` less a minute of clock-skew slack (a record's `finished_at` is the worker's clock,
its stream time the server's), stopping once nothing is pending. Used by `laneway usage` and by
the benchmarks that need to know which worker served what.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import datetime, timedelta

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy

from schemas import codec
from schemas.subjects import Subjects, check_token
from schemas.usage import Superseded, Usage

log = logging.getLogger("laneway.usage")
SKEW = timedelta(seconds=60)


async def read_usage(
    js: JetStreamContext,
    s: Subjects,
    tenant: str,
    since: datetime,
    until: datetime | None = None,
    idle_timeout: float = 5.0,
) -> AsyncIterator[Usage]:
    """Every `Usage` of `tenant` that finished in [since, until), in stream order, up to the
    tenant's last record when the read began (a snapshot: later records are not waited for):
    every generation, a batch line's runs that were superseded too (`billed` leaves them out)."""
    async for record in read_records(js, s, tenant, since, until, idle_timeout):
        if isinstance(record, Usage):
            yield record


def billed(records: list[Usage | Superseded]) -> list[Usage]:
    """The usage to bill: each batch line once, as its output line names it (`Superseded`), and
    each request message once: a record that `takes_over` (a continuation, or an end that counted
    what lost workers streamed) voids the records of the message's earlier deliveries, written by
    a worker judged lost that had not read its fence yet (broker/running.py)."""
    superseded = {(r.batch_id, r.line): r for r in records if isinstance(r, Superseded)}
    taken: dict[tuple[str, str, int], int] = {}
    for u in records:
        if isinstance(u, Usage) and u.takes_over and u.message:
            key = (u.tenant, u.request_id, u.message)
            taken[key] = max(taken.get(key, 0), u.attempt)
    return [
        u
        for u in records
        if isinstance(u, Usage)
        and not _voided(u, superseded)
        and u.attempt >= taken.get((u.tenant, u.request_id, u.message), 0)
    ]


def _voided(u: Usage, superseded: dict[tuple[str, int], Superseded]) -> bool:
    batch_id, _, rest = u.request_id.partition("-")
    line = rest.partition("-")[0]
    found = superseded.get((batch_id, int(line))) if line.isdigit() else None
    return found is not None and found.voids(u)


async def read_records(
    js: JetStreamContext,
    s: Subjects,
    tenant: str,
    since: datetime,
    until: datetime | None = None,
    idle_timeout: float = 5.0,
) -> AsyncIterator[Usage | Superseded]:
    """`read_usage`'s records and, wherever they fall in the read, the batch lines superseded."""
    check_token("tenant", tenant)
    lo, hi = since.timestamp(), until.timestamp() if until else float("inf")
    subject = s.usage(tenant)
    try:
        last = await js.get_last_msg(s.usage_stream, subject)
    except nats.js.errors.NotFoundError:
        return
    if last.time is not None and last.time < since - SKEW:
        return
    assert last.seq is not None  # a stored message has its sequence number
    sub = await js.subscribe(
        subject,
        stream=s.usage_stream,
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.BY_START_TIME,
        config=ConsumerConfig(opt_start_time=since - SKEW),
    )
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=idle_timeout)
            except nats.errors.TimeoutError:
                log.warning("the usage stream went quiet before the end; the records may be partial")
                return
            record = _decoded(msg.data)  # a record we cannot read is skipped, not fatal
            if isinstance(record, Superseded) or (record is not None and lo <= record.finished_at < hi):
                yield record
            meta = msg.metadata
            if meta.sequence.stream >= last.seq or meta.timestamp.timestamp() > hi + SKEW.total_seconds():
                return
    finally:
        await sub.unsubscribe()


def _decoded(data: bytes) -> Usage | Superseded | None:
    try:
        return codec.decode_usage(data)
    except codec.DecodeError:
        pass
    try:
        return codec.decode_superseded(data)
    except codec.DecodeError:
        return None
