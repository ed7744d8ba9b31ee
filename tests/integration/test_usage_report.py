"""`laneway usage` against records in a real LW_USAGE stream: sums, CSV, grouping, --since."""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import time
from datetime import UTC, datetime
from itertools import count

import nats
import pytest

from core.topology import StreamLimits, ensure_topology
from laneway import ops_usage as report
from schemas import codec
from schemas.subjects import Subjects
from schemas.usage import Usage

_prefixes = count()
_ids = count()


def usage(
    tenant: str,
    model: str,
    prompt: int,
    completion: int,
    cost: float,
    *,
    pool: str = "sim",
    cached: bool = False,
    finished_at: float | None = None,
    hits: int = 0,
    saved: float = 0.0,
) -> Usage:
    return Usage(
        request_id=f"r{next(_ids)}",
        tenant=tenant,
        klass="interactive",
        model=model,
        served_model=f"{model}@1",
        pool=pool,
        worker_id="w1",
        prompt_tokens=prompt,
        completion_tokens=completion,
        finish_reason="stop",
        queued_s=0.01,
        ttft_s=0.05,
        total_s=0.5,
        finished_at=finished_at or time.time(),
        cached=cached,
        cost_usd=cost,
        cached_tokens=hits,
        prefix_saved_usd=saved,
    )


def args_for(url: str, prefix: str, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nats-url", default=url)
    parser.add_argument("--prefix", default=prefix)
    report.configure(parser)
    return parser.parse_args(list(argv))


@pytest.fixture
async def stream(nats_server):
    """A fresh prefix with its LW_USAGE stream, and a publisher into it."""
    s = Subjects(f"u{next(_prefixes)}")
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    await ensure_topology(js, s, StreamLimits())

    async def publish(*records: Usage) -> None:
        for record in records:
            await js.publish(s.usage(record.tenant), codec.encode(record))

    yield s, publish
    await nc.close()


async def run_report(url: str, s: Subjects, *argv: str) -> str:
    out = io.StringIO()
    assert await report.report(args_for(url, s.prefix, *argv), out) == 0
    return out.getvalue()


async def test_table_and_csv_sums(nats_server, stream) -> None:
    s, publish = stream
    await publish(
        usage("acme", "chat", 1500, 400, 0.01),
        usage("acme", "chat", 1000, 200, 0.005),
        usage("acme", "chat", 1000, 200, 0.0, cached=True),
        usage("acme", "code", 3000, 1000, 0.05, pool="big"),
        usage("globex", "chat", 99_999, 99_999, 9.0),
    )  # another tenant: never counted
    since = datetime.fromtimestamp(time.time() - 3600, UTC).isoformat()
    text = await run_report(nats_server.url, s, "--tenant", "acme", "--since", since)
    lines = text.splitlines()
    assert lines[0].split() == ["model", *report.COLUMNS]
    chat = next(line for line in lines if line.startswith("chat")).split()
    assert chat == ["chat", "3", "1", "3500", "800", "4300", "0.015000", "0", "0.0%", "0.000000"]
    total = lines[-3].split()  # the last lines: what the tenant stores
    assert lines[-2].startswith("storage: tenant 'acme' has stored no files")
    assert lines[-1] == "stored responses and conversations: 0 of the quota's 10000"
    assert total == ["total", "4", "1", "6500", "1800", "8300", "0.065000", "0", "0.0%", "0.000000"]

    rows = list(
        csv.DictReader(
            io.StringIO(
                await run_report(
                    nats_server.url, s, "--tenant", "acme", "--since", since, "--csv", "--group-by", "pool"
                )
            )
        )
    )
    assert [r["pool"] for r in rows] == ["big", "sim", "total"]
    assert int(rows[1]["prompt_tokens"]) == 3500 and float(rows[2]["cost_usd"]) == pytest.approx(0.065)
    assert sum(int(r["requests"]) for r in rows[:-1]) == int(rows[-1]["requests"]) == 4


async def test_prefix_cache_hits_their_rate_and_savings(nats_server, stream) -> None:
    s, publish = stream
    await publish(
        usage("acme", "chat", 2000, 100, 0.003, hits=1536, saved=0.0023),
        usage("acme", "chat", 2000, 100, 0.004, hits=512, saved=0.0007),
        usage("acme", "code", 1000, 50, 0.002),
    )  # no hits: 0 saved, 0%
    since = datetime.fromtimestamp(time.time() - 3600, UTC).isoformat()
    lines = (await run_report(nats_server.url, s, "--tenant", "acme", "--since", since)).splitlines()
    chat = next(line for line in lines if line.startswith("chat")).split()
    assert chat[-3:] == ["2048", "51.2%", "0.003000"]
    assert next(line for line in lines if line.startswith("code")).split()[-3:] == ["0", "0.0%", "0.000000"]
    assert lines[-3].split()[-3:] == ["2048", "41.0%", "0.003000"]
    rows = list(
        csv.DictReader(io.StringIO(await run_report(nats_server.url, s, "--tenant", "acme", "--since", since, "--csv")))
    )
    total = rows[-1]
    assert (int(total["cached_tokens"]), float(total["prefix_hit_rate"])) == (2048, pytest.approx(0.4096, abs=1e-4))
    assert float(total["prefix_saved_usd"]) == pytest.approx(0.003)


async def test_since_and_until_filter(nats_server, stream) -> None:
    s, publish = stream
    await publish(usage("acme", "chat", 100, 10, 0.001))
    await asyncio.sleep(0.05)  # scenario, kept: the clock moves past the first record ...
    cut = datetime.now(UTC)
    await asyncio.sleep(0.05)  # ... and past the cut before the next two, so the cut lies between them
    await publish(usage("acme", "chat", 200, 20, 0.002), usage("acme", "chat", 300, 30, 0.003))
    rows = list(
        csv.DictReader(
            io.StringIO(await run_report(nats_server.url, s, "--tenant", "acme", "--since", cut.isoformat(), "--csv"))
        )
    )
    assert rows[-1]["requests"] == "2" and rows[-1]["prompt_tokens"] == "500"
    early = list(
        csv.DictReader(
            io.StringIO(
                await run_report(
                    nats_server.url, s, "--tenant", "acme", "--since", "2026-01-01", "--until", cut.isoformat(), "--csv"
                )
            )
        )
    )
    assert early[-1]["requests"] == "1" and early[-1]["prompt_tokens"] == "100"


async def test_group_by_day(nats_server, stream) -> None:
    s, publish = stream
    now = time.time()
    await publish(
        usage("acme", "chat", 10, 1, 0.0, finished_at=now - 2 * 86400),
        usage("acme", "chat", 20, 2, 0.0, finished_at=now - 86400),
        usage("acme", "chat", 30, 3, 0.0, finished_at=now),
    )
    since = datetime.fromtimestamp(now - 3 * 86400, UTC).isoformat()
    rows = list(
        csv.DictReader(
            io.StringIO(
                await run_report(nats_server.url, s, "--tenant", "acme", "--since", since, "--csv", "--group-by", "day")
            )
        )
    )
    days = [datetime.fromtimestamp(t, UTC).date().isoformat() for t in (now - 2 * 86400, now - 86400, now)]
    assert [r["day"] for r in rows] == [*days, "total"]


async def test_no_usage_and_the_command_entry_point(nats_server, stream) -> None:
    s, publish = stream
    text = await run_report(nats_server.url, s, "--tenant", "nobody", "--since", "2026-01-01")
    assert "no usage for tenant 'nobody'" in text
    await publish(usage("acme", "chat", 7, 3, 0.5))
    out = io.StringIO()
    # `run` is what `laneway usage` calls: it owns its event loop, so it runs in a thread here.
    rc = await asyncio.to_thread(
        report.run, args_for(nats_server.url, s.prefix, "--tenant", "acme", "--since", "2026-01-01", "--csv"), out
    )
    assert rc == 0 and out.getvalue().splitlines()[-1] == "total,1,0,7,3,10,0.500000,0,0.0000,0.000000"


def test_bad_arguments() -> None:
    with pytest.raises(SystemExit):
        args_for("nats://x", "lw", "--tenant", "acme", "--since", "last tuesday")
    with pytest.raises(SystemExit):
        args_for("nats://x", "lw", "--tenant", "acme", "--since", "2026-11-01", "--group-by", "colour")
    assert report.run(args_for("nats://x", "lw", "--tenant", "a.b", "--since", "2026-11-01")) == 2
    # nothing listens on port 1: the command says so at once instead of retrying forever
    assert report.run(args_for("nats://127.0.0.1:1", "lw", "--tenant", "a", "--since", "2026-11-01")) == 1
