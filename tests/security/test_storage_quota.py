"""A tenant's storage is bounded (issue 35, "Bounded per tenant"): on `laneway up`, with the
official `openai` client. On main a tenant stored as much as it liked (no limit anywhere), and
an upload was held whole in the bridge's memory (three 150 MB uploads: 61 -> 945 MB RSS).

Stored responses and conversations had no budget either: a tenant's count of them is bounded
now (each is one NATS message, so their bytes are too).

acme's quota is small (3 MB in 5 files, 3 stored records); globex keeps the defaults."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import openai
import pytest
import pytest_asyncio

from loadtest.fleet import Fleet, rss_bytes
from loadtest.scenarios import PoolSpec, TenantSpec
from schemas.subjects import Subjects
from tests.wait import eventually

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(300)]

MODEL = "laneway-sim"
QUOTA = 3_000_000
MB = 1_000_000
ROOT = Path(__file__).resolve().parents[2]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fleet(tmp_path_factory):
    tenants = [
        TenantSpec("acme", more=(f"storage.file_bytes = {QUOTA}", "storage.files = 5", "storage.records = 3")),
        TenantSpec("globex"),
    ]
    async with Fleet(
        tmp_path_factory.mktemp("storage") / "lw", tenants, [PoolSpec(profile="zero")], up_flags=["--pii", "off"]
    ) as running:
        yield running


def client(fleet: Fleet, tenant: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{fleet.url}/v1", api_key=fleet.keys[tenant], max_retries=0)


async def stored_bytes(fleet: Fleet) -> int:
    """Every byte in the files' object store, all tenants (as the bridge's NATS user)."""
    nc = await fleet.up.connect_nats("svc-bridge")
    try:
        return (await nc.jetstream().stream_info(f"OBJ_{Subjects().bucket('file_data')}")).state.bytes
    finally:
        await nc.close()


async def clear(c: openai.AsyncOpenAI) -> None:
    for f in [f async for f in c.files.list()]:
        await c.files.delete(f.id)


async def test_a_tenant_over_its_byte_quota_is_refused_and_nothing_is_stored(fleet: Fleet) -> None:
    acme, globex = client(fleet, "acme"), client(fleet, "globex")
    await clear(acme)
    first = await acme.files.create(file=("a.jsonl", b"a" * (2 * MB)), purpose="batch")
    before = await stored_bytes(fleet)
    with pytest.raises(openai.PermissionDeniedError) as refused:
        await acme.files.create(file=("b.jsonl", b"b" * (2 * MB)), purpose="batch")
    error = refused.value.body
    assert refused.value.status_code == 403 and error["code"] == "storage_quota_exceeded", error
    assert error["param"] == "file" and "file_bytes" in error["message"] and str(QUOTA) in error["message"]
    assert await stored_bytes(fleet) == before
    assert [f.id async for f in acme.files.list()] == [first.id]
    assert (await acme.files.content(first.id)).content == b"a" * (2 * MB)
    # The neighbour is unaffected: its own quota, its own bytes.
    other = await globex.files.create(file=("g.jsonl", b"g" * (2 * MB)), purpose="batch")
    assert other.bytes == 2 * MB
    # A file that fits still goes in, and the count of files is bounded too.
    await acme.files.create(file=("c.jsonl", b"c" * 1000), purpose="batch")
    for i in range(3):
        await acme.files.create(file=(f"s{i}.jsonl", b"s"), purpose="batch")
    with pytest.raises(openai.PermissionDeniedError) as too_many:
        await acme.files.create(file=("six.jsonl", b"6"), purpose="batch")
    assert "files limit is 5" in too_many.value.body["message"]
    await clear(acme)


async def test_an_upload_of_unknown_length_is_held_as_it_streams(fleet: Fleet) -> None:
    """Sent chunked (no Content-Length): the bridge holds quota as the bytes come, so one that
    fits goes in and one that does not is cut off where it passes the quota, nothing kept."""
    acme = client(fleet, "acme")
    await clear(acme)

    async def upload(size: int) -> tuple[int, dict]:
        async def body():
            for _ in range(size // 100_000):
                yield b"z" * 100_000

        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("file", body(), filename="chunked.jsonl", content_type="application/octet-stream")
        async with aiohttp.ClientSession() as http:
            async with http.post(
                f"{fleet.url}/v1/files", data=form, headers={"Authorization": f"Bearer {fleet.keys['acme']}"}
            ) as resp:
                assert resp.request_info.headers.get("Transfer-Encoding") == "chunked"
                return resp.status, await resp.json()

    status, body = await upload(2 * MB)
    assert status == 200 and body["bytes"] == 2 * MB, body
    before = await stored_bytes(fleet)
    status, body = await upload(2 * MB)
    assert status == 403 and body["error"]["code"] == "storage_quota_exceeded", body
    assert await stored_bytes(fleet) == before
    assert [f.bytes async for f in acme.files.list()] == [2 * MB]
    await clear(acme)


async def test_two_uploads_racing_past_the_quota_are_not_both_kept(fleet: Fleet) -> None:
    """Each upload holds its bytes before it counts what the tenant keeps, and counts the holds
    written before its own: the later one sees the earlier, whichever bridge task runs first."""
    acme = client(fleet, "acme")
    for _ in range(3):
        await clear(acme)
        results = await asyncio.gather(
            *(acme.files.create(file=(f"{i}.jsonl", bytes([65 + i]) * (2 * MB)), purpose="batch") for i in range(2)),
            return_exceptions=True,
        )
        kept = [r for r in results if not isinstance(r, BaseException)]
        refused = [r for r in results if isinstance(r, openai.PermissionDeniedError)]
        assert len(kept) == 1 and len(refused) == 1, results  # the earlier hold wins; never both
        assert sum([f.bytes async for f in acme.files.list()]) <= QUOTA
    await clear(acme)


async def test_a_large_upload_streams_through_the_bridge(fleet: Fleet) -> None:
    """The bridge's memory while a 100 MB file goes in grows by far less than the file: it holds
    a chunk at a time (on main it held the whole file, and more)."""
    globex = client(fleet, "globex")
    bridges = fleet.up.role_pids("bridge")
    base = sum(rss_bytes(pid) for pid in bridges)
    assert bridges and base > 0
    peak = base
    size = 100 * MB
    upload = asyncio.create_task(globex.files.create(file=("big.jsonl", b"x" * size), purpose="batch"))
    while not upload.done():
        peak = max(peak, sum(rss_bytes(pid) for pid in bridges))
        await asyncio.sleep(0.02)
    file = await upload
    peak = max(peak, sum(rss_bytes(pid) for pid in bridges))
    assert file.bytes == size
    assert peak - base < size // 4, f"the bridge grew {(peak - base) / MB:.0f} MB for a {size // MB} MB file"
    content = (await globex.files.content(file.id)).content
    assert len(content) == size and content == b"x" * size
    await globex.files.delete(file.id)


async def test_stored_responses_and_conversations_are_bounded_per_tenant(fleet: Fleet) -> None:
    acme, globex = client(fleet, "acme"), client(fleet, "globex")
    kept = [await acme.responses.create(model=MODEL, input=f"note {i}", max_output_tokens=4) for i in range(2)]
    await acme.conversations.create()

    async def stored() -> bool:  # an ended response is written after its answer
        try:
            return all([await acme.responses.retrieve(r.id) for r in kept])
        except openai.NotFoundError:
            return False

    assert await eventually(stored)
    with pytest.raises(openai.PermissionDeniedError) as refused:
        await acme.responses.create(model=MODEL, input="one more", max_output_tokens=4)
    error = refused.value.body
    assert error["code"] == "storage_quota_exceeded" and error["param"] == "store", error
    assert "records limit is 3" in error["message"] and "store: false" in error["message"]
    with pytest.raises(openai.PermissionDeniedError):
        await acme.conversations.create()
    unstored = await acme.responses.create(model=MODEL, input="not kept", max_output_tokens=4, store=False)
    assert unstored.store is False
    assert (await globex.responses.create(model=MODEL, input="mine", max_output_tokens=4)).store is True
    assert (await acme.responses.retrieve(kept[0].id)).id == kept[0].id  # what was kept stays
    await acme.responses.delete(kept[0].id)

    async def room_again() -> bool:
        try:
            kept[0] = await acme.responses.create(model=MODEL, input="after a delete", max_output_tokens=4)
        except openai.PermissionDeniedError:
            return False
        return True

    assert await eventually(room_again, timeout=30, interval=0.5)
    assert await eventually(stored)  # 3 records again: 2 responses and the conversation


async def test_laneway_usage_shows_what_a_tenant_stores(fleet: Fleet) -> None:
    acme = client(fleet, "acme")
    await clear(acme)
    await acme.files.create(file=("u.jsonl", b"u" * 12_345), purpose="batch")
    since = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
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
            since,
            "--nats-url",
            fleet.nats_url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=fleet.up.nats_env("ops"),
        cwd=ROOT,
    )
    assert report.returncode == 0, report.stderr
    assert f"storage: 12345 bytes in 1 files of the quota's {QUOTA} bytes and 5 files" in report.stdout, report.stdout
    assert "stored responses and conversations: 3 of the quota's 3" in report.stdout, report.stdout


async def test_the_bridges_user_may_sweep_uploads_cut_off(fleet: Fleet) -> None:
    """The sweep (bridge/files/store.py) lists the store's chunk subjects and purges: under the
    generated permissions, as the bridge runs it (its periodic task only logs a failure)."""
    from bridge.files.store import FileStore

    acme = client(fleet, "acme")
    await clear(acme)
    kept = await acme.files.create(file=("kept.jsonl", b"k" * 1000), purpose="batch")
    nc = await fleet.up.connect_nats("svc-bridge")
    try:
        files = await FileStore.open(nc.jetstream(), Subjects())
        assert await files.sweep_uploads() == 0
    finally:
        await nc.close()
    assert (await acme.files.content(kept.id)).content == b"k" * 1000
    await clear(acme)
