"""Reading what a KV bucket holds now, when nats-py's "nothing stored" marker comes too early.

nats-py's watcher puts that marker first when its consumer's info counts nothing pending and no
message has reached the subscription yet. Under load the server's info answer can overtake the
messages it already pushed, and `kv.keys()` then raised `NoKeysError` on a bucket full of keys
(a CI failure of `ensure_intake`). The tests here put the marker ahead of the pushed messages,
as that race does, and read the bucket the ways Laneway does.
"""

from __future__ import annotations

import asyncio

import nats
import nats.js.errors
import pytest
from nats.js.api import KeyValueConfig
from nats.js.kv import KeyValue

from core.kvwatch import BucketWatch, current_keys, current_values


@pytest.fixture
def early_marker(monkeypatch):
    """Every watch started from here on sees the marker before any pushed message."""
    watch = KeyValue.watch

    async def watch_with_early_marker(self, *args, **kwargs):
        watcher = await watch(self, *args, **kwargs)
        queued = []
        while not watcher._updates.empty():
            queued.append(watcher._updates.get_nowait())
        if None not in queued:  # a bucket with keys: the real watcher put no marker
            watcher._updates.put_nowait(None)
        for item in queued:
            watcher._updates.put_nowait(item)
        return watcher

    monkeypatch.setattr(KeyValue, "watch", watch_with_early_marker)


@pytest.fixture
async def bucket(nats_server, request):
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    kv = await js.create_key_value(KeyValueConfig(bucket=f"snap{abs(hash(request.node.name)) % 10**8}"))
    for key in ("acme.a", "acme.b", "globex.a", "acme.gone"):
        await kv.put(key, key.encode())
    await kv.delete("acme.gone")
    yield js, kv
    await nc.close()


async def test_the_marker_alone_fails_nats_pys_own_keys(bucket, early_marker):
    """The race as CI met it: without Laneway's check, a full bucket reads as empty."""
    _, kv = bucket
    with pytest.raises(nats.js.errors.NoKeysError):
        await kv.keys()


async def test_current_keys_and_values_read_every_stored_key_past_an_early_marker(bucket, early_marker):
    _, kv = bucket
    assert await current_keys(kv) == ["acme.a", "acme.b", "globex.a"]
    assert sorted(await current_values(kv, "acme.*")) == [b"acme.a", b"acme.b"]
    assert await current_values(kv, "initech.*") == []  # the marker is the truth here


async def test_a_bucket_with_nothing_or_only_deletes_reads_empty(nats_server, early_marker):
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        empty = await js.create_key_value(KeyValueConfig(bucket="snapempty"))
        assert await current_keys(empty) == []
        await empty.put("x", b"1")
        await empty.delete("x")
        assert await current_keys(empty) == []
    finally:
        await nc.close()


async def test_a_bucket_watch_is_loaded_only_once_the_stored_values_are_applied(bucket, early_marker):
    js, kv = bucket
    seen: dict[str, bytes] = {}
    watch = BucketWatch(js, kv._name, seen.__setitem__, lambda key: seen.pop(key, None))
    await watch.start()
    try:
        assert watch.loaded.is_set() and set(seen) == {"acme.a", "acme.b", "globex.a"}
        await kv.put("initech.a", b"later")
        async with asyncio.timeout(10):
            while "initech.a" not in seen:  # changes still land after the first load
                await asyncio.sleep(0.01)
    finally:
        await watch.stop()


async def test_a_tenants_storage_is_counted_past_an_early_marker(nats_server, early_marker):
    """The storage quota's count (`FileStore.held`) read the bucket the racy way: under the race
    a tenant with files would have counted as holding nothing, and its next upload passed."""
    from bridge.files.store import FileStore
    from schemas.subjects import Subjects

    nc = await nats.connect(nats_server.url)
    try:
        files = await FileStore.open(nc.jetstream(), Subjects("snapfiles"))
        await files.put("acme", b"x" * 1000, "a.jsonl", "batch")
        await files.put("acme", b"y" * 500, "b.jsonl", "user_data")
        held = await files.held("acme")
        assert (held.bytes, held.files) == (1500, 2)
    finally:
        await nc.close()
