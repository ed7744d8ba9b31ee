"""`laneway batches` and `laneway files` as an operator runs them: the command line in a process of
its own, against a running stack's bridge (its OpenAI API), with a tenant's key from the
environment. A batch is held running by lines that say HOLD (they wait in the engine until the
test releases them), so `watch` is seen following a batch that is still going."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import replace

import openai
import pytest

from bridge.config import BridgeConfig
from loadtest.stack import Stack, demo_settings
from tests.e2e.conftest import KEY
from tests.e2e.test_batches_api import chat_line, jsonl
from tests.e2e.test_overload import HeldEngine
from tests.wait import eventually

pytestmark = [pytest.mark.timeout(180)]

PREFIX = "bcli"
# The lease renews, and with it the batch's public counts, every third of this.
BRIDGE_FLAGS = {"batch_lease_s": 1.5}


@pytest.fixture(scope="module")
async def engine() -> HeldEngine:
    return HeldEngine()


@pytest.fixture(scope="module")
async def stack(nats_server, engine):
    async with Stack(
        nats_server.url,
        demo_settings(KEY),
        engines=[engine],
        prefix=PREFIX,
        bridge_config=replace(BridgeConfig(), **BRIDGE_FLAGS),
    ) as s:
        yield s


@pytest.fixture
def api(stack) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=KEY, max_retries=0)


class Cli:
    """`laneway ARGS` in a child process, its output read as it comes."""

    def __init__(self, stack: Stack, tmp_path) -> None:
        # The key from the environment; a data dir with no `up` key in it, so that is the key used.
        self.env = {
            **os.environ,
            "LANEWAY_BASE_URL": f"{stack.url}/v1",
            "LANEWAY_API_KEY": KEY,
            "LANEWAY_DATA_DIR": str(tmp_path / "no-up-here"),
        }

    async def start(self, *args: str) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "laneway.cli",
            *args,
            env=self.env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )

    async def run(self, *args: str) -> tuple[int, str, str]:
        proc = await self.start(*args)
        out, err = await proc.communicate()
        return proc.returncode, out.decode(), err.decode()


@pytest.fixture
def cli(stack, tmp_path) -> Cli:
    return Cli(stack, tmp_path)


async def lines_of(stream: asyncio.StreamReader, into: list[str]) -> None:
    async for raw in stream:
        into.append(raw.decode())


async def held_batch(cli: Cli, api: openai.AsyncOpenAI, tmp_path, plain: int, held: int, failing: int = 0):
    lines = [chat_line(f"plain-{i}", f"Say {i}") for i in range(plain)]
    lines += [chat_line(f"held-{i}", f"HOLD {i}") for i in range(held)]
    lines += [chat_line(f"bad-{i}", "no such model", model="no-such-model") for i in range(failing)]
    path = tmp_path / "in.jsonl"
    path.write_bytes(jsonl(lines))
    rc, out, err = await cli.run("files", "upload", str(path))
    assert rc == 0, err
    file_id = out.strip()
    return await api.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")


async def test_watch_follows_a_running_batch_and_ends_with_its_counts(cli, api, engine, tmp_path) -> None:
    engine.release.clear()
    batch = await held_batch(cli, api, tmp_path, plain=6, held=2, failing=1)
    watch = await cli.start("batches", "watch", batch.id, "--interval", "0.2")
    out: list[str] = []
    err: list[str] = []
    readers = [asyncio.create_task(lines_of(watch.stdout, out)), asyncio.create_task(lines_of(watch.stderr, err))]

    async def running_and_progressed() -> bool:  # the plain and failing lines are done, HOLD waits
        counts = (await api.batches.retrieve(batch.id)).request_counts
        return counts.completed + counts.failed >= 7 and any(line.startswith("in_progress") for line in err)

    assert await eventually(running_and_progressed, timeout=60), (err, out)
    assert watch.returncode is None  # still watching: the batch has not ended
    engine.release.set()
    assert await asyncio.wait_for(watch.wait(), 60) == 0, (err, out)
    await asyncio.gather(*readers)
    done = await api.batches.retrieve(batch.id)
    assert done.status == "completed"
    assert (done.request_counts.completed, done.request_counts.failed, done.request_counts.total) == (8, 1, 9)
    assert out[0].strip() == f"{batch.id} completed: 8 completed, 1 failed, 9 total", (err, out)
    assert err[-1].startswith("completed") and "9/9 lines, 1 failed" in err[-1], err


async def test_list_show_download_of_an_ended_batch(cli, api, engine, tmp_path) -> None:
    engine.release.set()
    batch = await held_batch(cli, api, tmp_path, plain=3, held=0, failing=1)
    rc, out, err = await cli.run("batches", "watch", batch.id, "--interval", "0.2")
    assert rc == 0, err

    rc, out, err = await cli.run("batches", "list")
    assert rc == 0, err
    row = next(line.split() for line in out.splitlines() if line.startswith(batch.id))
    assert row[1:5] == ["completed", "3", "1", "4"]

    rc, out, err = await cli.run("batches", "show", batch.id)
    assert rc == 0, err
    shown = json.loads(out)
    assert shown["id"] == batch.id and shown["request_counts"] == {"total": 4, "completed": 3, "failed": 1}

    rc, out, err = await cli.run("batches", "download", batch.id, "--dir", str(tmp_path / "results"))
    assert rc == 0, err
    answered = [
        json.loads(line) for line in (tmp_path / "results" / f"{batch.id}_output.jsonl").read_text().splitlines()
    ]
    failed = [json.loads(line) for line in (tmp_path / "results" / f"{batch.id}_errors.jsonl").read_text().splitlines()]
    assert sorted(o["custom_id"] for o in answered) == ["plain-0", "plain-1", "plain-2"]
    assert [o["custom_id"] for o in failed] == ["bad-0"]


async def test_cancel_stops_a_running_batch_and_watch_says_so_with_exit_1(cli, api, engine, tmp_path) -> None:
    engine.release.clear()
    batch = await held_batch(cli, api, tmp_path, plain=2, held=2)
    watch = await cli.start("batches", "watch", batch.id, "--interval", "0.2")

    async def in_progress() -> bool:
        return (await api.batches.retrieve(batch.id)).status == "in_progress"

    assert await eventually(in_progress, timeout=60)

    rc, out, err = await cli.run("batches", "cancel", batch.id)
    assert rc == 0, err
    assert out.split() == [batch.id, "cancelling"]
    out_bytes, err_bytes = await asyncio.wait_for(watch.communicate(), 60)
    assert watch.returncode == 1, err_bytes
    assert (await api.batches.retrieve(batch.id)).status == "cancelled"
    assert out_bytes.decode().startswith(f"{batch.id} cancelled:")

    rc, out, err = await cli.run("batches", "download", "batch_does_not_exist")
    assert rc == 1 and "404" in err and out == ""


async def test_files_list_show_download_delete(cli, api, tmp_path) -> None:
    path = tmp_path / "notes.jsonl"
    path.write_bytes(jsonl([chat_line("a", "hello")]))
    rc, out, err = await cli.run("files", "upload", str(path), "--purpose", "user_data")
    assert rc == 0, err
    file_id = out.strip()
    assert (await api.files.retrieve(file_id)).filename == "notes.jsonl"

    rc, out, err = await cli.run("files", "list", "--purpose", "user_data")
    assert rc == 0, err
    assert [line.split()[:3] for line in out.splitlines() if line.startswith(file_id)] == [
        [file_id, "user_data", str(path.stat().st_size)]
    ]

    rc, out, err = await cli.run("files", "show", file_id)
    assert rc == 0 and json.loads(out)["filename"] == "notes.jsonl", err

    rc, out, err = await cli.run("files", "download", file_id)
    assert rc == 0 and out.encode() == path.read_bytes(), err

    rc, out, err = await cli.run("files", "delete", file_id)
    assert rc == 0 and out.strip() == f"deleted {file_id}", err
    with pytest.raises(openai.NotFoundError):
        await api.files.retrieve(file_id)
    rc, out, err = await cli.run("files", "show", file_id)
    assert rc == 1 and "404" in err


async def test_a_wrong_key_and_no_bridge_are_said_in_one_line(cli, stack, tmp_path) -> None:
    cli.env["LANEWAY_API_KEY"] = "sk-not-a-tenant"
    rc, _out, err = await cli.run("batches", "list")
    assert rc == 1 and "401" in err and len(err.strip().splitlines()) == 1, err

    del cli.env["LANEWAY_API_KEY"]
    rc, _out, err = await cli.run("files", "list")
    assert rc == 2 and "no API key" in err, err

    # the key `laneway up` keeps in its data dir, when none is given
    data_dir = tmp_path / "up-data"
    data_dir.mkdir()
    (data_dir / "demo-api-key").write_text(KEY + "\n")
    rc, _out, err = await cli.run("files", "list", "--data-dir", str(data_dir))
    assert rc == 0, err

    rc, _out, err = await cli.run("batches", "list", "--api-key", KEY, "--base-url", "http://127.0.0.1:1/v1")
    assert rc == 1 and "cannot reach the bridge at http://127.0.0.1:1/v1" in err, err
