"""Live configuration: watch a KV bucket and apply each change as it lands, without a restart.

A document that fails validation is logged and skipped: the last good value stays in force, so
a typo by an operator can never take the broker down.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import nats.errors
from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from core.tasks import cancel_and_wait, pause

log = logging.getLogger("laneway.config")


class BucketWatch:
    def __init__(
        self,
        js: JetStreamContext,
        bucket: str,
        on_put: Callable[[str, bytes], None],
        on_delete: Callable[[str], None],
        *,
        meta_only: bool = False,
    ) -> None:
        self._js = js
        self._meta_only = meta_only  # keys only: `on_put` gets b"" (the values stay on the server)
        self._bucket = bucket
        self._on_put = on_put
        self._on_delete = on_delete
        self._task: asyncio.Task[None] | None = None
        self.loaded = asyncio.Event()  # set once the current values have all been applied

    async def start(self, wait_s: float = 60.0) -> None:
        """`wait_s`: how long to wait for the bucket to exist (provisioning creates it;
        a worker or bridge may start first)."""
        deadline = asyncio.get_running_loop().time() + wait_s
        while True:
            try:
                kv = await self._js.key_value(self._bucket)
                break
            except BucketNotFoundError:
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await pause(0.25)
        watcher = await kv.watchall(meta_only=self._meta_only)
        self._task = asyncio.create_task(self._run(kv, watcher), name=f"watch-{self._bucket}")
        async with asyncio.timeout(10):
            await self.loaded.wait()

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def _run(self, kv: KeyValue, watcher) -> None:
        try:
            async for entry in watcher:
                if entry is None:  # end of the initial values, unless it came early
                    if self.loaded.is_set() or not await _stores_any(kv, ">"):
                        self.loaded.set()
                    continue
                try:
                    if entry.operation in (KV_DEL, KV_PURGE):
                        self._on_delete(entry.key)
                    else:
                        self._on_put(entry.key, entry.value)
                except ValueError as exc:
                    log.error("ignored invalid %s/%s: %s", self._bucket, entry.key, exc)
                if entry.delta == 0:
                    self.loaded.set()
        finally:
            try:
                await watcher.stop()
            except nats.errors.Error:  # connection closed or draining: the watch is gone anyway
                pass


async def current_values(kv: KeyValue, keys: str) -> list[bytes]:
    """The values stored now under `keys` (a KV key filter: `acme.*`, `>`), deletes left out: a
    snapshot, read once, where `BucketWatch` follows changes."""
    return [entry.value for entry in await current_entries(kv, keys) if entry.value]


async def current_keys(kv: KeyValue, keys: str = ">") -> list[str]:
    """The keys stored now under `keys`, deletes left out, sorted (`kv.keys()` without its race,
    and an empty bucket is `[]`)."""
    return sorted(entry.key for entry in await current_entries(kv, keys, meta_only=True))


async def current_entries(kv: KeyValue, keys: str, meta_only: bool = False) -> list[KeyValue.Entry]:
    """The last entry of each key under `keys`, deletes left out. It ends at the entry with
    nothing pending after it, not at nats-py's "nothing stored" marker alone: see `_stores_any`."""
    entries: list[KeyValue.Entry] = []
    watcher = await kv.watch(keys, meta_only=meta_only)
    try:
        async for entry in watcher:
            if entry is None:
                if not await _stores_any(kv, keys):
                    break
                continue
            if entry.operation not in (KV_DEL, KV_PURGE):
                entries.append(entry)
            if entry.delta == 0:
                break
    finally:
        await watcher.stop()
    return entries


async def _stores_any(kv: KeyValue, keys: str) -> bool:
    """Whether any key under `keys` has a message (a delete's marker counts: the watch delivers it).

    nats-py's watcher says "nothing stored" (a `None` first) when its consumer's info counts no
    message pending and none has reached the subscription yet. The server answers that info apart
    from the messages it pushes, and under load the answer can come first, with the messages
    already counted as delivered: `kv.keys()` then raised `NoKeysError` on a full bucket (seen in
    CI). That marker is checked here against the stream's subjects. nats-py keeps the bucket's
    context, stream and subject prefix private; they are read in this one place."""
    info = await kv._js.stream_info(kv._stream, subjects_filter=f"{kv._pre}{keys}")
    return bool(info.state.subjects)
