"""Uploads cut off by a killed bridge leave nothing for good (issue 35, "Bounded per tenant").

An upload streams its chunks into the object store as they arrive and writes its meta at the
end. A bridge SIGKILLed in between cannot purge them (a failed or cancelled upload does), and its
hold lapses, so before the sweep those bytes stayed in the store for ever, counted in no quota.
Here a separate process plays that bridge and is SIGKILLed mid-upload.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import nats
import pytest

from bridge.files.store import FileStore
from core.policy.storage_quota import StorageQuota
from schemas.subjects import Subjects
from tests.wait import eventually

ROOT = Path(__file__).resolve().parents[2]
CHUNK = b"c" * 100_000

# The bridge's side of an upload: a hold for the bytes to come (a 1 s TTL, as if the upload
# could take no longer), then chunks for ever; it prints once some are stored.
UPLOADER = textwrap.dedent("""
    import asyncio, sys
    import nats
    from bridge.files.store import FileStore
    from core.policy.storage_quota import StorageQuota
    from schemas.subjects import Subjects

    async def main(url, prefix, file_id):
        nc = await nats.connect(url)
        files = await FileStore.open(nc.jetstream(), Subjects(prefix))
        await files.hold("acme", file_id, 10_000_000, 1, StorageQuota())

        async def chunks():
            for i in range(10**6):
                if i == 3:
                    print("stored", flush=True)
                yield b"c" * 100_000
                await asyncio.sleep(0.05)
        await files.put_stream("acme", file_id, chunks())

    asyncio.run(main(*sys.argv[1:]))
""")


async def object_bytes(js, files: FileStore) -> int:
    return (await js.stream_info(files.data._stream)).state.bytes


@pytest.fixture
async def store(nats_server, request):
    """(js, a FileStore of its own prefix, the prefix)."""
    prefix = f"sweep{abs(hash(request.node.name)) % 10**8}"
    nc = await nats.connect(nats_server.url)
    yield nc.jetstream(), await FileStore.open(nc.jetstream(), Subjects(prefix)), prefix
    await nc.close()


async def test_the_chunks_of_an_upload_whose_bridge_was_killed_are_swept(nats_server, store):
    js, files, prefix = store
    kept = await files.put("acme", b"k" * 1000, "kept.jsonl", "batch")
    baseline = await object_bytes(js, files)

    proc = subprocess.Popen(
        [sys.executable, "-c", UPLOADER, nats_server.url, prefix, "file-killed"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert (await asyncio.to_thread(proc.stdout.readline)).strip() == "stored"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert await object_bytes(js, files) > baseline + 2 * len(CHUNK)  # left behind

    # Swept once the upload's hold has lapsed: before, it might still be running.
    assert await eventually(files.sweep_uploads, timeout=30)
    assert await object_bytes(js, files) <= baseline
    assert [f.id for f in await files.list("acme")] == [kept.id]
    assert await files.content("acme", kept.id) == b"k" * 1000
    assert await files.sweep_uploads() == 0


async def test_a_running_upload_and_whole_files_are_left_alone(store):
    js, files, _ = store
    whole = await files.put("acme", b"w" * 1000, "w.jsonl", "batch")
    await files.hold("acme", "file-running", 1_000_000, 60, StorageQuota())
    more = asyncio.Event()

    async def chunks():
        yield CHUNK
        yield CHUNK
        await more.wait()
        yield CHUNK

    upload = asyncio.create_task(files.put_stream("acme", "file-running", chunks()))

    async def two_chunks_stored() -> bool:
        return await object_bytes(js, files) >= 2 * len(CHUNK) + 1000

    assert await eventually(two_chunks_stored, timeout=10)

    assert await files.sweep_uploads() == 0
    more.set()
    assert await upload == 3 * len(CHUNK)
    done = await files.finish("acme", "file-running", 3 * len(CHUNK), "r.jsonl", "batch", None)
    assert await files.sweep_uploads() == 0
    assert sorted(f.id for f in await files.list("acme")) == sorted([whole.id, done.id])
    assert await files.content("acme", done.id) == 3 * CHUNK
