"""A tenant's own NATS client speaking the subject protocol by hand: how an upstream service
publishes past the bridge with the NATS user `laneway up` generated for its tenant."""

from __future__ import annotations

import asyncio
import time
import uuid

from schemas import codec
from schemas.frames import Delta, Entry
from schemas.requests import GenerateRequest
from schemas.subjects import MSG_ID_HEADER, Subjects
from tests.requests import chat

S = Subjects("lw")


class Publisher:
    """A tenant's own NATS client, speaking the subject protocol by hand."""

    def __init__(self, nc, tenant: str) -> None:
        self.nc, self.tenant = nc, tenant
        self.edge = uuid.uuid4().hex[:12]
        self.entries: dict[str, asyncio.Queue] = {}

    async def start(self) -> Publisher:
        async def on_frame(msg) -> None:
            for entry in codec.decode_frame(msg.data).entries:
                self.entries.setdefault(entry.request_id, asyncio.Queue()).put_nowait(entry)

        await self.nc.subscribe(S.tok(self.tenant, self.edge), cb=on_frame)
        return self

    def request(self, klass: str = "batch", max_tokens: int = 4, **fields) -> GenerateRequest:
        now = time.time()
        body = chat("hello", max_tokens=max_tokens)
        return GenerateRequest(
            request_id=uuid.uuid4().hex,
            tenant=self.tenant,
            klass=klass,
            model=body.model,
            reply_to=S.tok(self.tenant, self.edge),
            created_at=now,
            deadline=now + 120,
            chat=body,
            **fields,
        )

    async def publish(self, request: GenerateRequest, stored_as: str | None = None) -> None:
        headers = {MSG_ID_HEADER: stored_as or uuid.uuid4().hex}
        await self.nc.jetstream().publish(S.req(request.klass, self.tenant), codec.encode(request), headers=headers)

    async def first(self, request_id: str):
        """The first entry that is not a delta: how the request ended, or None if it streamed."""
        queue = self.entries.setdefault(request_id, asyncio.Queue())
        while True:
            entry = await asyncio.wait_for(queue.get(), 60)
            if not isinstance(entry, Delta):
                return entry

    async def next(self, request_id: str):
        return await asyncio.wait_for(self.entries.setdefault(request_id, asyncio.Queue()).get(), 60)

    async def rest(self, request_id: str) -> tuple[list[Delta], Entry]:
        """The deltas still to come, and the entry that ended the stream."""
        deltas = []
        while isinstance(entry := await self.next(request_id), Delta):
            deltas.append(entry)
        return deltas, entry
