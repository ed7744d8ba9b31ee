"""The upstream publishers' client: generate straight over NATS, no HTTP in between.

    async with LanewayClient(nc, tenant="acme") as client:
        async for text in client.generate(model="laneway-sim", messages=[...]):
            print(text, end="")

It follows the same protocol as the bridge (docs/subject-protocol.md), so a service in
another language can do the same with any NATS client: subscribe to one inbox
`lw.tok.<tenant>.<edge_id>`, publish msgpack `GenerateRequest`s to `lw.req.<class>.<tenant>`
through JetStream with a random `Nats-Msg-Id` (no one else can guess it), read `TokenFrame`s,
and publish a `Cancel` to `lw.cancel.<tenant>.<request_id>` when giving up.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import nats.js.errors
from nats.aio.client import Client
from nats.aio.subscription import Subscription

from bridge import publish_errors
from bridge.streams.demux import REPLY_GRACE_S, Demux
from schemas import codec
from schemas.errors import ErrorCode
from schemas.frames import Delta, Finished, StreamError, TokenUsage
from schemas.openai import ChatBody, CompletionBody
from schemas.requests import Cancel, GenerateRequest
from schemas.subjects import MSG_ID_HEADER, Subjects


class LanewayError(Exception):
    """A request ended with an error; `code` is an `ErrorCode` value."""

    def __init__(self, code: str, message: str, request_id: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.request_id = request_id


class LanewayClient:
    def __init__(self, nc: Client, tenant: str, prefix: str = "lw") -> None:
        self._nc = nc
        self.tenant = tenant
        self.s = Subjects(prefix)
        self.edge_id = uuid.uuid4().hex[:12]
        self._demux = Demux()
        self._sub: Subscription | None = None
        self.last_usage: TokenUsage | None = None

    async def __aenter__(self) -> LanewayClient:
        self._sub = await self._nc.subscribe(self.s.tok(self.tenant, self.edge_id), cb=self._demux.on_frame)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()

    async def generate(
        self,
        body: ChatBody | CompletionBody,
        *,
        klass: str = "standard",
        timeout_s: float = 600.0,
        request_id: str | None = None,
        extra: bytes = b"",
    ) -> AsyncIterator[str]:
        """Yields text deltas of an OpenAI chat or completion body (and `extra`, its other
        fields as a JSON object); raises `LanewayError` if the request ends with an error."""
        now = time.time()
        chat, completion = (body, None) if isinstance(body, ChatBody) else (None, body)
        request = GenerateRequest(
            request_id=request_id or uuid.uuid4().hex,
            tenant=self.tenant,
            klass=klass,
            model=body.model,
            reply_to=self.s.tok(self.tenant, self.edge_id),
            created_at=now,
            deadline=now + timeout_s,
            chat=chat,
            completion=completion,
            extra=extra,
        )
        stream = self._demux.open(request.request_id, self.tenant, request.deadline + REPLY_GRACE_S, klass)
        subject = self.s.req(klass, self.tenant)
        last_error = self._nc.last_error
        done = False
        try:
            try:
                await self._nc.jetstream().publish(
                    subject, codec.encode(request), headers={MSG_ID_HEADER: uuid.uuid4().hex}
                )
            except nats.js.errors.APIError as exc:
                code = publish_errors.refusal(exc) or ErrorCode.overloaded
                raise LanewayError(code.value, exc.description or str(exc), request.request_id) from None
            except publish_errors.NOT_STORED as exc:
                if why := publish_errors.denied(self._nc, subject, last_error):
                    raise LanewayError(
                        ErrorCode.permission_denied.value,
                        f"{why}: this NATS user may not send requests as tenant {self.tenant!r}",
                        request.request_id,
                    ) from None
                # Not accepted (no PubAck): e.g. the stream is electing a new leader. Safe to retry
                # with the same request_id: this try is cancelled on the way out, so a copy of it
                # that was stored never runs (if the broker took that copy in before the cancel,
                # the retry is answered duplicate_request; never run twice).
                raise LanewayError(
                    ErrorCode.overloaded.value, "the request log is unavailable", request.request_id
                ) from exc
            while True:
                for entry in await stream.next_entries():
                    if isinstance(entry, Delta):
                        yield entry.text
                    elif isinstance(entry, Finished):
                        done = True
                        self.last_usage = entry.usage
                        return
                    elif isinstance(entry, StreamError):
                        done = True
                        raise LanewayError(entry.code, entry.message, request.request_id)
        finally:
            self._demux.close(request.request_id)
            if not done and self._nc.is_connected:
                await self._nc.publish(
                    self.s.cancel(self.tenant, request.request_id),
                    codec.encode(Cancel(request_id=request.request_id, tenant=self.tenant)),
                )
