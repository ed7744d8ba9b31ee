"""`POST /v1/responses`: the generation path (`generate.routes.Generations`), with a Responses body in and Responses
events out, and the store (`stored/`): a response with `store` (OpenAI's default: true; a
tenant's `responses.store = false` forces it off) is kept once it has ended, before the answer's
end is sent, so a client that read the end finds it on any bridge (`_keep`); `previous_response_id`
continues a stored one; `background` runs detached (`stored/background.py`); `conversation`
continues and extends a stored conversation (`stored/conversations.py`).

What is stored of the input is what the engine got: the worker sends the request's messages
back on `Finished.messages` (`GenerateRequest.echo_input`), as the broker's PII stage left them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid

import msgspec
import nats.errors
import orjson
from aiohttp import web

from bridge.auth import ANSWER_ID, REQUEST_ID_HEADER, authenticate, tenant_of
from bridge.errors import EdgeError, not_found, storage_refused
from bridge.generate.routes import Generations
from bridge.render.responses import ResponsesRenderer
from bridge.responses.asked import ASKED, Asked, record_of, turn_of
from bridge.responses.stored.background import Background, Job, mark_lost, queued
from bridge.responses.stored.conversations import Conversations
from bridge.responses.stored.items import decode_messages
from bridge.responses.stored.lifecycle import ended, status_of
from bridge.responses.stored.routes import StoredRoutes
from bridge.responses.stored.store import Conflict, ResponseStore
from bridge.responses.translate import conversation_id, to_chat
from bridge.streams.demux import REPLY_GRACE_S, ResponseStream
from core.policy.storage_quota import StorageExceeded
from core.policy.stored import StoragePolicy
from core.policy.tenants import Tenant
from schemas import codec
from schemas.errors import PASSING, ErrorCode
from schemas.openai import Body, ChatBody, Message
from schemas.requests import GenerateRequest
from schemas.responses import ResponsesBody
from schemas.stored import Rerun, StoredResponse, decode_rerun, encode_rerun

log = logging.getLogger("laneway.bridge")
PUT_HEADROOM = 4096  # a KV put's subject and headers, beside its value
LISTED_PAST_DEADLINE_S = 60  # a listing outlives its response's deadline by this much


async def _admit(store: ResponseStore, tenant: Tenant) -> None:
    """One more stored response, if the tenant's budget of stored records has room."""
    try:
        await store.budget.admit(tenant.name, tenant.storage)
    except StorageExceeded as exc:
        raise storage_refused(exc, "store", "send store: false, or delete stored responses or conversations") from None


class Responses(Generations):
    def __init__(
        self,
        *args,
        store: ResponseStore | None = None,
        background: Background | None = None,
        routes: StoredRoutes | None = None,
        conversations: Conversations | None = None,
    ) -> None:
        super().__init__(*args)
        self.store = store
        self.background = background
        self.routes = routes
        self.conversations = conversations

    async def _parse(self, request: web.Request) -> tuple[ChatBody, bytes]:
        body, extra = await super()._parse(request)
        asked, chat = await self._ask(body, extra, tenant_of(request, self.catalogue.tenants))
        request[ASKED] = asked
        return chat

    async def _ask(
        self, body: Body | ResponsesBody, extra: bytes, tenant: Tenant | None
    ) -> tuple[Asked, tuple[ChatBody, bytes]]:
        """What the request asks of the store (under `tenant`: every look-up is its own), and the
        chat body the engine gets: the stored history, then the input."""
        assert isinstance(body, ResponsesBody)  # this endpoint decodes with decode_responses
        policy = tenant.responses if tenant is not None else StoragePolicy()
        store = body.store is not False and policy.store and self.store is not None
        if body.background and not store:
            why = "store is false" if body.store is False else "this API key's responses are never stored"
            raise EdgeError(
                ErrorCode.invalid_request, f"a background response is a stored one, and {why}", "background"
            )
        if store and tenant is not None and self.store is not None:  # (`store` says it is not None)
            await _admit(self.store, tenant)
        history: list[Message] = []
        conversation = conversation_id(body)
        if conversation is not None:
            if body.previous_response_id is not None:
                raise EdgeError(
                    ErrorCode.invalid_request,
                    "a response continues either a conversation or a previous response, not both",
                    "conversation",
                )
            if self.conversations is None or tenant is None:
                raise not_found("conversation", conversation, "conversation")
            history = await self.conversations.history(tenant.name, conversation)
        elif body.previous_response_id is not None:
            found = (
                None
                if self.store is None or tenant is None
                else await self.store.get(tenant.name, body.previous_response_id)
            )
            if found is None:
                raise not_found("response", body.previous_response_id, "previous_response_id")
            record = found[0]
            if record.history == b"[]":  # not ended, or ended with nothing to continue from
                raise EdgeError(
                    ErrorCode.invalid_request,
                    f"the response {body.previous_response_id!r} is "
                    f"{status_of(record)} and holds no conversation to continue",
                    "previous_response_id",
                )
            history = decode_messages(record.history)
        return Asked(body, store, policy, len(history), conversation, tenant), to_chat(body, extra, history)

    def _renderer(self, request: web.Request, generate: GenerateRequest) -> ResponsesRenderer:
        return request[ASKED].renderer(generate)

    async def _answer(self, request: web.Request, generate: GenerateRequest, started: float) -> web.StreamResponse:
        asked = request[ASKED]
        asked.ask_echo(generate)
        if asked.body.background:
            return await self._background(request, generate, asked)
        asked.before_end = lambda: self._keep(generate, asked)  # a stream's: before its last event
        response = await super()._answer(request, generate, started)
        await self._keep(generate, asked)  # a whole answer's: before its body leaves
        return response

    async def _keep(self, generate: GenerateRequest, asked: Asked) -> None:
        """An ended response kept, if it is stored, and its turn added to its conversation, before
        the answer's end is sent: a client that read the answer and then asks for the response or
        the conversation's items finds them, on any bridge (OpenAI's API reads its own writes).
        The writes run in tasks of their own: a client gone meanwhile does not stop them. Once."""
        render = asked.render
        if asked.kept or render is None or render.final is None:
            return
        asked.kept = True
        writes = []
        if (turn := turn_of(render, asked)) is not None and self.conversations is not None:
            writes.append(self.conversations.append_later(*turn))
        if asked.store and self.store is not None:  # (`asked.store` says it is not None)
            record = record_of(render, generate, asked)
            writes.append(self.store.keep(generate.tenant, render.id, record, asked.policy.retention_s))
        if writes:
            await asyncio.shield(asyncio.gather(*writes))

    async def complete(self, tenant: Tenant, raw: bytes, request_id: str, klass: str, deadline: float) -> bytes:
        """A batch's line: the Response object `POST /v1/responses` answers with `stream` false, by
        the endpoint's own rules (`_parse`): `store` as there (a stored line is retrieved, and
        continued, like any stored response), `previous_response_id` and `conversation` looked up
        under the batch's tenant. `stream` and `background` are refused: the output line is the answer."""
        asked, (body, extra) = await self._ask(*self.parse(raw), tenant)
        if asked.body.background:
            raise EdgeError(
                ErrorCode.invalid_request,
                "a batch's requests are answered whole, in its output file: background must be false or left out",
                "background",
            )
        generate = self._line_request(tenant, body, extra, request_id, klass, deadline)
        asked.ask_echo(generate)
        answer = await self._collect(generate, asked.renderer(generate))
        await self._keep(generate, asked)
        return answer

    def _append_turn(self, render: ResponsesRenderer, asked: Asked) -> None:
        """An ended response's turn added to its conversation, if it has one (later)."""
        if (turn := turn_of(render, asked)) is not None and self.conversations is not None:
            self.conversations.append_later(*turn)

    def _job(
        self,
        tenant: str,
        stream: ResponseStream,
        asked: Asked,
        generate: GenerateRequest,
        ttl_s: int,
        revision: int,
        rerunnable: bool,
    ) -> Job:
        render = asked.render
        assert render is not None  # made by _renderer or _rebuilt
        return Job(
            tenant,
            stream,
            render,
            ttl_s,
            revision,
            lambda: record_of(render, generate, asked),
            lambda: self._append_turn(render, asked),
            rerunnable,
        )

    async def _background(self, request: web.Request, generate: GenerateRequest, asked: Asked) -> web.StreamResponse:
        """Stored `queued` first (an Idempotency-Key's second try stops here), then listed with
        its request for another bridge, then accepted (the PubAck), then answered at once: the
        Response object, or (stream) its events as the runner stores them."""
        assert self.store is not None and self.background is not None and self.routes is not None
        render = self._renderer(request, generate)
        payload = self._payload(generate)
        tenant, ttl_s = generate.tenant, asked.policy.retention_s
        listing = encode_rerun(Rerun(payload, await request.read(), asked.history_len, asked.conversation or ""))
        # One too big for a NATS message cannot be kept: it fails with its bridge.
        rerunnable = len(listing) + PUT_HEADROOM <= self._nc.max_payload
        try:
            revision = await self.store.put(
                tenant,
                render.id,
                queued(render, generate.request_id, self.edge_id, self.background.lease_s, rerunnable),
                ttl_s,
                after=0,
            )
        except Conflict:  # an Idempotency-Key's id, already created
            raise EdgeError(
                ErrorCode.duplicate_request,
                "a request with this Idempotency-Key was already accepted",
                "Idempotency-Key",
            ) from None
        try:
            if rerunnable:
                listed_s = int(max(generate.deadline - time.time(), 0) + LISTED_PAST_DEADLINE_S)
                await self.store.list_running(tenant, render.id, listing, listed_s)
            stream = await self._published(generate, payload)
        except BaseException:
            with contextlib.suppress(nats.errors.Error):  # never accepted: nothing to keep
                await self.store.delete(tenant, render.id)
            if rerunnable:
                with contextlib.suppress(nats.errors.Error):
                    await self.store.unlist(tenant, render.id)
            raise
        self.background.run(self._job(tenant, stream, asked, generate, ttl_s, revision, rerunnable))
        headers = {REQUEST_ID_HEADER: request[ANSWER_ID]}
        if asked.body.stream:
            return await self.routes.follow(
                request, authenticate(request, self.catalogue.tenants), render.id, -1, headers
            )
        return web.Response(
            body=orjson.dumps(render.snapshot("queued")), content_type="application/json", headers=headers
        )

    async def take_over(self, tenant_name: str, response_id: str, record: StoredResponse, revision: int) -> Job | None:
        """A background response whose bridge is gone (`stored/takeover.py`), run again here from
        its start under a new request id, its first generation stopped; or, when it cannot be
        (`_rebuilt`), marked failed. A passing refusal leaves it for the next look; any other
        refusal ends it failed."""
        assert self.store is not None and self.background is not None
        tenant = self.catalogue.tenants.get(tenant_name)
        ttl_s = tenant.responses.retention_s if tenant is not None else StoragePolicy().retention_s
        rebuilt = await self._rebuilt(tenant, response_id, record) if tenant is not None else None
        if rebuilt is None:
            await mark_lost(self.store, self._cancel, tenant_name, response_id, record, revision, ttl_s)
            return None
        asked, original, head = rebuilt
        generate = msgspec.structs.replace(
            original, request_id=uuid.uuid4().hex, reply_to=self.s.tok(tenant_name, self.edge_id), edge=self.edge_id
        )
        claimed = msgspec.structs.replace(
            record,
            owner=self.edge_id,
            beat_at=time.time(),
            lease_s=self.background.lease_s,
            request_id=generate.request_id,
        )
        try:
            revision = await self.store.put(tenant_name, response_id, claimed, ttl_s, after=revision)
        except Conflict:
            return None  # another bridge took it over, or it was cancelled
        await self._cancel(tenant_name, record.request_id)  # the first generation, if it still runs
        try:
            if generate.deadline <= time.time():
                raise EdgeError(
                    ErrorCode.deadline_exceeded,
                    "the deadline passed before another bridge could run the response again",
                )
            stream = await self._published(generate, self._payload(generate))
        except EdgeError as exc:
            left = (
                msgspec.structs.replace(claimed, beat_at=0.0)
                if exc.code in PASSING
                else ended(claimed, "failed", {"code": "server_error", "message": exc.message})
            )
            with contextlib.suppress(Conflict):
                await self.store.put(tenant_name, response_id, left, ttl_s, after=revision)
            return None
        log.info("background response %s taken over from %s", response_id, record.owner)
        job = self._job(tenant_name, stream, asked, original, ttl_s, revision, True)
        job.take_events(head)
        job.started = True
        return job

    async def _rebuilt(
        self, tenant: Tenant, response_id: str, record: StoredResponse
    ) -> tuple[Asked, GenerateRequest, bytes] | None:
        """The response as its first bridge began it, from the request listed with it, and its
        opening events; None when no request is listed (none was kept, or the listing expired),
        when it no longer reads (another version of Laneway wrote it), or when a streamed one's
        readers have seen output another run would not repeat token for token."""
        assert self.store is not None  # take_over, the caller, runs with a store
        listed = await self.store.listed(tenant.name, response_id) if record.rerunnable else None
        if listed is None:
            return None
        try:
            rerun = decode_rerun(listed)
            original = codec.decode_request(rerun.request)
            asked = Asked(
                self.parse(rerun.body)[0], True, tenant.responses, rerun.history_len, rerun.conversation or None, tenant
            )
            render = asked.renderer(original)
            head = render.start() if render.streaming else b""
        except Exception:  # never a takeover retried forever: it fails instead
            log.exception("background response %s: its request no longer reads", response_id)
            return None
        return (asked, original, head) if _begins(head, record) else None

    async def _published(self, generate: GenerateRequest, payload: bytes) -> ResponseStream:
        """The request accepted (its PubAck), its frames awaited by a stream opened first."""
        stream = self.demux.open(
            generate.request_id, generate.tenant, generate.deadline + REPLY_GRACE_S, generate.klass
        )
        try:
            await self._publish(generate, payload)
        except BaseException:
            self.demux.close(generate.request_id)
            raise
        return stream


def _begins(head: bytes, record: StoredResponse) -> bool:
    """A new run's opening events (`head`) begin with every event readers may have seen."""
    return record.first_event == 0 and head.startswith(b"".join(record.events))
