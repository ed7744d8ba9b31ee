"""An object written to JetStream's Object Store chunk by chunk as it arrives, from an async
source: nats-py's `ObjectStore.put` takes bytes or a blocking reader (run in the loop's default
executor, one thread per upload), so an upload streamed from an HTTP body would have to be
held whole or tie up a thread. This writes the same layout nats-py (2.16) and every other
client read back with `ObjectStore.get`: the chunks on `$O.<bucket>.C.<nuid>`, then the meta
(`ObjectInfo`, rolled up) on `$O.<bucket>.M.<base64 name>`, the object existing only once its
meta is written. At most one chunk is held at a time: each publish waits for the server's ack.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterable
from datetime import UTC, datetime
from hashlib import sha256

from nats.js import api
from nats.js.kv import MSG_ROLLUP_SUBJECT
from nats.js.object_store import (
    OBJ_CHUNKS_PRE_TEMPLATE,
    OBJ_DEFAULT_CHUNK_SIZE,
    OBJ_DIGEST_TEMPLATE,
    OBJ_META_PRE_TEMPLATE,
    ObjectStore,
)

CHUNK_BYTES = OBJ_DEFAULT_CHUNK_SIZE


async def put_chunks(store: ObjectStore, name: str, chunks: AsyncIterable[bytes], nuid: str) -> int:
    """Write `name` from `chunks` (each at most a server message) on the chunk subject of `nuid`
    (any subject tokens: readers take it from the meta); returns its size. If the source or a
    publish fails (or the task is cancelled) the chunks written so far are purged and nothing of
    the object remains; a process killed meanwhile leaves them, for whoever knows `nuid` to
    sweep. A new object only: a name written before keeps its old chunks (`ObjectStore.put`
    replaces; Laneway's file ids are never reused by an upload)."""
    js = store._js  # nats-py keeps these private; 2.16's layout
    chunk_subject = chunk_subject_of(store, nuid)
    digest, size, count = sha256(), 0, 0
    try:
        async for chunk in chunks:
            if not chunk:
                continue
            digest.update(chunk)
            await js.publish(chunk_subject, chunk)
            size += len(chunk)
            count += 1
        info = api.ObjectInfo(
            name=name,
            bucket=store._name,
            nuid=nuid,
            size=size,
            chunks=count,
            mtime=datetime.now(UTC).isoformat(),
            options=api.ObjectMetaOptions(max_chunk_size=CHUNK_BYTES),
            digest=OBJ_DIGEST_TEMPLATE.format(digest=base64.urlsafe_b64encode(digest.digest()).decode()),
        )
        meta_subject = OBJ_META_PRE_TEMPLATE.format(
            bucket=store._name, obj=base64.urlsafe_b64encode(name.encode()).decode()
        )
        await js.publish(
            meta_subject, json.dumps(info.as_dict()).encode(), headers={api.Header.ROLLUP: MSG_ROLLUP_SUBJECT}
        )
    except BaseException:
        if count:
            await js.purge_stream(store._stream, subject=chunk_subject)
        raise
    return size


def chunk_subject_of(store: ObjectStore, nuid: str) -> str:
    return OBJ_CHUNKS_PRE_TEMPLATE.format(bucket=store._name, obj=nuid)
