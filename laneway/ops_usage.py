"""`laneway usage`: one tenant's metered usage from `LW_USAGE`, as a table or CSV.

  laneway usage --tenant acme --since 2026-11-01 [--until 2026-12-01] [--csv] [--group-by day]

Below the table, what Laneway stores for the tenant against its storage quota (its document in
`lw_tenants`): its files' bytes and count, as the bridge last counted them in `lw_storage`, and
its stored responses and conversations, counted by the server now.

A batch's line run again after its bridge died is billed once: the run its output line names
(`Superseded`, which the new run publishes; the other runs' records stay in the stream).

Reads with an ordered, ephemeral consumer filtered to `lw.usage.<tenant>`, starting at the
stream time `--since` (less a minute of clock-skew slack: a record's `finished_at` is the
worker's clock, its stream time the server's) and stopping once nothing is pending. Records are
then kept by `finished_at` in [since, until). Times are UTC unless they name a zone.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TextIO

import msgspec
import nats
import nats.errors
import nats.js.errors
from nats.js import JetStreamContext

from bridge.responses.stored.budget import CountFailed, RecordBudget
from core.connect import NatsSettings, connect_once
from core.policy import tenants
from core.policy.storage_quota import StorageQuota
from core.usage_log import billed, read_records
from laneway.flags import nats_from_env
from schemas.subjects import RESPONSES_BUCKET, STORAGE_BUCKET, Subjects, check_token
from schemas.usage import StorageUsage, Usage

GROUPS = ("model", "served_model", "pool", "class", "day")
# `cached`: requests answered from the response cache. The last three are the engines' prefix-cache
# hits: prompt tokens read from KV cache, their share of prompt tokens, and what they saved
# against the full prompt price (appended: CSV readers of the first columns are unaffected).
COLUMNS = (
    "requests",
    "cached",
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "cost_usd",
    "cached_tokens",
    "prefix_hit_rate",
    "prefix_saved_usd",
)


def parse_time(text: str) -> datetime:
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO date or date-time") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "A tenant's metered usage (tokens, cost, prefix-cache hits and what they saved) from the LW_USAGE stream."
    )
    parser.add_argument("--tenant", required=True)
    parser.add_argument("--since", required=True, type=parse_time, help="ISO date or date-time (UTC default)")
    parser.add_argument("--until", type=parse_time, help="exclusive end (default: now)")
    parser.add_argument("--csv", action="store_true", help="CSV on stdout instead of a table")
    parser.add_argument("--group-by", choices=GROUPS, default="model")
    parser.add_argument("--idle-timeout", type=float, default=5.0, help=argparse.SUPPRESS)


# -- summing (pure) -------------------------------------------------------------------------
@dataclass(slots=True)
class Row:
    group: str
    requests: int = 0
    cached: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    cached_tokens: int = 0
    prefix_saved_usd: float = 0.0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def prefix_hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def add(self, u: Usage) -> None:
        self.requests += 1
        self.cached += int(u.cached)
        self.prompt_tokens += u.prompt_tokens
        self.completion_tokens += u.completion_tokens
        self.cost_usd += u.cost_usd
        self.cached_tokens += u.cached_tokens
        self.prefix_saved_usd += u.prefix_saved_usd


def group_of(u: Usage, group_by: str) -> str:
    if group_by == "day":
        return datetime.fromtimestamp(u.finished_at, UTC).date().isoformat()
    return {"model": u.model, "served_model": u.served_model, "pool": u.pool, "class": u.klass}[group_by]


def summarize(records: Iterable[Usage], group_by: str) -> tuple[list[Row], Row]:
    """Rows sorted by group, and the total."""
    rows: dict[str, Row] = {}
    total = Row("total")
    for u in records:
        key = group_of(u, group_by)
        row = rows.get(key)
        if row is None:
            row = rows[key] = Row(key)
        row.add(u)
        total.add(u)
    return [rows[k] for k in sorted(rows)], total


def _cells(row: Row, percent: bool = False) -> list[str]:
    rate = f"{row.prefix_hit_rate:.1%}" if percent else f"{row.prefix_hit_rate:.4f}"
    return [
        row.group,
        str(row.requests),
        str(row.cached),
        str(row.prompt_tokens),
        str(row.completion_tokens),
        str(row.total_tokens),
        f"{row.cost_usd:.6f}",
        str(row.cached_tokens),
        rate,
        f"{row.prefix_saved_usd:.6f}",
    ]


def write_csv(rows: list[Row], total: Row, group_by: str, out: TextIO) -> None:
    writer = csv.writer(out)
    writer.writerow([group_by, *COLUMNS])
    for row in [*rows, total]:
        writer.writerow(_cells(row))


def write_table(rows: list[Row], total: Row, group_by: str, out: TextIO) -> None:
    table = [[group_by, *COLUMNS], *(_cells(r, percent=True) for r in rows), _cells(total, percent=True)]
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    out.write(line(table[0]) + "\n" + "  ".join("-" * w for w in widths) + "\n")
    for cells in table[1:-1]:
        out.write(line(cells) + "\n")
    out.write("  ".join("-" * w for w in widths) + "\n" + line(table[-1]) + "\n")


@dataclass(frozen=True, slots=True)
class Stored:
    """What the tenant stores: files (None: never counted) and stored records (None: unknown)."""

    files: StorageUsage | None
    records: int | None
    quota: StorageQuota


def storage_lines(tenant: str, stored: Stored) -> str:
    q = stored.quota
    if stored.files is None:
        files = f"storage: tenant {tenant!r} has stored no files (quota {q.file_bytes} bytes, {q.files} files)"
    else:
        at = datetime.fromtimestamp(stored.files.counted_at, UTC).isoformat(timespec="seconds")
        files = (
            f"storage: {stored.files.file_bytes} bytes in {stored.files.files} files of the quota's "
            f"{q.file_bytes} bytes and {q.files} files (counted {at})"
        )
    records = "?" if stored.records is None else str(stored.records)
    return f"{files}\nstored responses and conversations: {records} of the quota's {q.records}\n"


async def read_storage(js: JetStreamContext, s: Subjects, tenant: str) -> Stored:
    """The tenant's storage and its quota (a tenant with no document has the defaults)."""
    files, records, quota = None, None, StorageQuota()
    try:
        entry = await (await js.key_value(s.bucket(STORAGE_BUCKET))).get(tenant)
        files = msgspec.json.decode(entry.value, type=StorageUsage) if entry.value else None
    except (nats.js.errors.BucketNotFoundError, nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
        pass
    try:
        entry = await (await js.key_value(s.bucket("tenants"))).get(tenant)
        assert entry.value is not None  # a get's entry carries its message's data
        quota = tenants.decode(tenant, entry.value).storage
    except (nats.js.errors.BucketNotFoundError, nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
        pass
    bucket = s.bucket(RESPONSES_BUCKET)
    try:
        records = await RecordBudget(js, f"KV_{bucket}", f"$KV.{bucket}.").count(tenant)
    except CountFailed:  # no bridge has stored a response yet: no bucket
        records = 0
    except nats.errors.Error:
        pass
    return Stored(files, records, quota)


# -- the command ----------------------------------------------------------------------------
async def _quiet(exc: Exception) -> None:
    pass  # the one failure that matters is reported below, once


async def report(args: argparse.Namespace, out: TextIO) -> int:
    check_token("tenant", args.tenant)  # before any connection: a bad name is a usage error
    env = nats_from_env()
    n = NatsSettings(
        url=getattr(args, "nats_url", None) or env.url,
        prefix=getattr(args, "prefix", None) or env.prefix,
        user=getattr(args, "nats_user", None) or env.user,
        password=getattr(args, "nats_password", None) or env.password,
    )
    try:  # a one-shot command: fail fast instead of reconnecting forever like the services
        nc = await connect_once(n, "laneway-usage", error_cb=_quiet)
    except (OSError, nats.errors.Error) as exc:
        print(f"laneway usage: cannot reach NATS at {n.url}: {exc}", file=sys.stderr)
        return 1
    try:
        records = billed(
            [
                r
                async for r in read_records(
                    nc.jetstream(), n.subjects, args.tenant, args.since, args.until, args.idle_timeout
                )
            ]
        )
        stored = await read_storage(nc.jetstream(), n.subjects, args.tenant)
    finally:
        await nc.close()
    rows, total = summarize(records, args.group_by)
    if args.csv:
        write_csv(rows, total, args.group_by, out)
    elif not rows:
        out.write(f"no usage for tenant {args.tenant!r} since {args.since.isoformat()}\n")
    else:
        write_table(rows, total, args.group_by, out)
    if not args.csv:  # the CSV stays one table of the columns above
        out.write(storage_lines(args.tenant, stored))
    return 0


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    try:
        return asyncio.run(report(args, out or sys.stdout))
    except ValueError as exc:  # a tenant name that is not a subject token
        print(f"laneway usage: {exc}", file=sys.stderr)
        return 2
