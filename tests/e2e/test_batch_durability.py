"""A batch outlives the processes that run it, under `laneway up`: its bridge SIGKILLed mid-batch
(another run takes its lease over, `up` restarts the bridge), or every process stopped and
started again on the same data directory. Either way every line is answered exactly once in the
output file. A cancel stops it with what finished kept; the end of its completion window expires
the rest."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import openai
import pytest

from core.usage_log import billed, read_records
from loadtest.fleet import Fleet, _role
from loadtest.scenarios import PoolSpec, TenantSpec
from schemas.subjects import Subjects
from schemas.usage import Superseded, Usage
from tests.e2e.test_batches_api import chat_line, jsonl
from tests.openapi import validator
from tests.wait import eventually

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(420)]

LINES = 24
# A real step time (the default profile) and two lines at a time: the batch takes long enough to
# be cut in the middle, and a 2 s lease lets another run take it over soon after.
FLAGS = ["--pii", "off", "--batch-lease-s", "2", "--batch-concurrency", "2"]
POOL = PoolSpec(min_step_s=0.02)


def fleet(path) -> Fleet:
    return Fleet(path, [TenantSpec("acme")], [POOL], up_flags=FLAGS)


def client(f: Fleet) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{f.url}/v1", api_key=f.keys["acme"], max_retries=3)


async def start(c: openai.AsyncOpenAI, lines: int = LINES, max_tokens: int = 24, window: str = "24h"):
    content = jsonl([chat_line(f"line-{i}", f"Summarize ticket {i}", max_tokens=max_tokens) for i in range(lines)])
    file = await c.files.create(file=("in.jsonl", content), purpose="batch")
    return await c.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window=window)


async def progressed(c: openai.AsyncOpenAI, batch_id: str, at_least: int) -> None:
    async def enough() -> bool:
        counts = (await c.batches.retrieve(batch_id)).request_counts
        return counts is not None and counts.completed >= at_least

    assert await eventually(enough, timeout=120, interval=0.1)


async def ended(c: openai.AsyncOpenAI, batch_id: str):
    seen = []

    async def done() -> bool:
        try:
            seen.append(await c.batches.retrieve(batch_id))
        except (openai.APIConnectionError, openai.InternalServerError):
            return False  # the bridge is being restarted
        return seen[-1].status in ("completed", "failed", "expired", "cancelled")

    assert await eventually(done, timeout=300, interval=0.2)
    validator("Batch").validate(seen[-1].model_dump(exclude_unset=True))
    return seen[-1]


async def lines_of(c: openai.AsyncOpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(line) for line in (await c.files.content(file_id)).content.splitlines()]


async def assert_each_line_once(c: openai.AsyncOpenAI, batch) -> None:
    out = await lines_of(c, batch.output_file_id)
    assert sorted(o["custom_id"] for o in out) == sorted(f"line-{i}" for i in range(LINES))
    assert all(o["response"]["status_code"] == 200 for o in out)
    assert batch.request_counts.completed == LINES and batch.request_counts.failed == 0


async def test_a_batch_survives_its_bridge_killed_mid_batch(tmp_path) -> None:
    async with fleet(tmp_path / "lw") as f:
        c = client(f)
        since = datetime.now(UTC)
        batch = await start(c)
        await progressed(c, batch.id, 2)
        bridge = next(pid for pid in f.pids() if _role(pid) == "bridge")
        os.kill(bridge, signal.SIGKILL)
        done = await ended(c, batch.id)
        assert done.status == "completed", done
        await assert_each_line_once(c, done)
        await assert_each_line_billed_once(f, since)


async def assert_each_line_billed_once(f: Fleet, since: datetime) -> None:
    """The lines the killed bridge had in flight were generated (and metered) by it and again by
    the run that took over: `laneway usage` bills each line once (issue 35), as its output names."""
    nc = await f.up.connect_nats("ops")
    try:

        async def metered() -> list:  # every line's billed usage has landed (the batch ended
            # after its lines' Superseded records were written)
            records = [r async for r in read_records(nc.jetstream(), Subjects(), "acme", since, idle_timeout=2)]
            return records if len(billed(records)) >= LINES else []

        assert await eventually(metered, timeout=60, interval=0.5)
        records = await metered()
    finally:
        await nc.close()
    generated = [r for r in records if isinstance(r, Usage)]
    assert len(generated) > LINES, "no line was generated twice: the kill tested nothing"
    assert len(billed(records)) == LINES, f"{len(generated)} generations, billed {len(billed(records))}"
    assert any(isinstance(r, Superseded) for r in records)
    report = await asyncio.to_thread(
        subprocess.run,
        [
            sys.executable,
            "-m",
            "laneway.cli",
            "usage",
            "--tenant",
            "acme",
            "--since",
            since.isoformat(),
            "--csv",
            "--nats-url",
            f.nats_url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=f.up.nats_env("ops"),
        cwd=Path(__file__).resolve().parents[2],
    )
    assert report.returncode == 0, report.stderr
    total = report.stdout.strip().splitlines()[-1].split(",")
    assert total[:2] == ["total", str(LINES)], report.stdout


async def test_a_batch_survives_a_restart_of_every_process(tmp_path) -> None:
    data = tmp_path / "lw"
    async with fleet(data) as f:
        c = client(f)
        batch = await start(c)
        await progressed(c, batch.id, 2)
    async with fleet(data) as f:  # the same data dir: its JetStream store, its credentials
        c = client(f)
        done = await ended(c, batch.id)
        assert done.status == "completed", done
        await assert_each_line_once(c, done)


async def test_cancel_keeps_what_finished_and_stops_the_rest(tmp_path) -> None:
    async with fleet(tmp_path / "lw") as f:
        c = client(f)
        batch = await start(c, max_tokens=64)
        await progressed(c, batch.id, 1)
        cancelling = await c.batches.cancel(batch.id)
        assert cancelling.status in ("cancelling", "cancelled")
        done = await ended(c, batch.id)
        assert done.status == "cancelled" and done.cancelled_at is not None
        out, errors = await lines_of(c, done.output_file_id), await lines_of(c, done.error_file_id)
        assert len(out) >= 1 and len(out) + len(errors) == LINES < len(out) + LINES
        assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
        assert (done.request_counts.completed, done.request_counts.failed) == (len(out), len(errors))


async def test_the_completion_window_expires_the_rest(tmp_path) -> None:
    async with fleet(tmp_path / "lw") as f:
        c = client(f)
        batch = await start(c, lines=400, max_tokens=256, window="1m")  # far more than a minute's work
        done = await ended(c, batch.id)
        assert done.status == "expired" and done.expired_at is not None
        out, errors = await lines_of(c, done.output_file_id), await lines_of(c, done.error_file_id)
        assert out and errors and len(out) + len(errors) == 400
        assert {e["error"]["code"] for e in errors} == {"batch_expired"}
