"""`POST /v1/chat/completions` and `POST /v1/completions`: authenticate (key → tenant) → parse and validate → subscribe-first
(the edge's one frame subscription exists before any publish) → publish with `Nats-Msg-Id` and
wait for the PubAck ("accepted") → wait for the first entry → answer. Errors before the first
token are ordinary HTTP errors; after it they go in-band, then [DONE]. A client that goes away
turns into a cancel on `lw.cancel.<tenant>.<request_id>`: at once, or, when streams are resumable
(`--resume-window-s`, bridge/resume/routes.py), once the window passed without it coming back."""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web
from nats.aio.client import Client

from bridge.auth import ANSWER_ID, MAX_IDEMPOTENCY_KEY, REQUEST_ID_HEADER, answer_id, authenticate, idempotent_id
from bridge.config import BridgeConfig
from bridge.errors import EdgeError, from_code
from bridge.generate.admission import EdgeAdmission
from bridge.generate.publish import publish_request
from bridge.generate.translate import check_context, param_of, to_generate
from bridge.metrics import BridgeMetrics
from bridge.readiness import Readiness
from bridge.render.chat import renderer_for
from bridge.render.embeddings import EmbeddingRenderer
from bridge.render.respond import Render, Whole, collect_body, collect_json, stream_sse
from bridge.resume.routes import ResumableStreams
from bridge.streams.demux import REPLY_GRACE_S, Demux, ResponseStream
from core.catalogue import Catalogue
from core.policy.tenants import Tenant
from core.settings import Settings, context_limit
from core.tracing import tracer
from schemas import codec
from schemas.checks import MAX_TIMEOUT_S
from schemas.errors import ErrorCode
from schemas.frames import Delta, Entry, Finished, StreamError
from schemas.openai import Body
from schemas.requests import GenerateRequest

log = logging.getLogger("laneway.bridge")

CLASS_HEADER = "x-laneway-class"
TIMEOUT_HEADER = "x-laneway-timeout"

Decode = Callable[[bytes], tuple[Body, bytes]]


@dataclass(slots=True)
class _Run:
    """One generation in flight: its stream, its first entries, and whether another owner (a
    resumable stream) ends it."""

    stream: ResponseStream
    entries: list[Entry] = field(default_factory=list)
    held: bool = False


class Generations:
    """One OpenAI generation endpoint; `decode` reads its body kind (chat or completion)."""

    def __init__(
        self,
        decode: Decode,
        nc: Client,
        edge_id: str,
        config: BridgeConfig,
        settings: Settings,
        catalogue: Catalogue,
        readiness: Readiness,
        demux: Demux,
        metrics: BridgeMetrics,
        cancel: Callable[[str, str], Awaitable[None]],
        admission: EdgeAdmission,
        resumable: ResumableStreams,
    ) -> None:
        self._decode = decode
        self._nc = nc
        self.edge_id = edge_id
        self.config = config
        self.settings = settings
        self.s = config.nats.subjects
        self.catalogue = catalogue
        self.readiness = readiness
        self.demux = demux
        self.metrics = metrics
        self._cancel = cancel
        self._admit = admission
        self.resumable = resumable
        self._tracing = tracer()

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        # An error answer gets its x-request-id from the app's middleware (the same answer_id).
        started = time.monotonic()
        tenant = authenticate(request, self.catalogue.tenants)
        if self.resumable.asked(request):  # a stream cut off comes back: its body is not read
            return await self.resumable.resume(
                request, tenant.name, lambda request_id: {REQUEST_ID_HEADER: answer_id(request, request_id)}
            )
        request_id = self._request_id(request, tenant)
        # Before the body is parsed: under overload, a refusal must cost the bridge next to nothing.
        # The class is in the headers: each is admitted by its own share (bridge/generate/admission.py).
        klass = self._class_for(request, tenant)
        try:
            return await self._admitted(request, tenant, klass, request_id, started)
        except EdgeError as exc:
            self.metrics.refused.labels(klass, tenant.name, exc.code.value if exc.code else str(exc.status)).inc()
            raise

    async def _admitted(
        self, request: web.Request, tenant: Tenant, klass: str, request_id: str, started: float
    ) -> web.StreamResponse:
        self._admit(tenant.name, self.catalogue.classes[klass])
        body, extra = await self._parse(request)
        now = time.time()
        generate = self._request(tenant, body, extra, request_id, klass, now, self._deadline(request, now))
        # The request's trace: the client's when it sent a traceparent; its id rides the request.
        span = self._tracing.start(
            "laneway.bridge.request",
            request.headers.get("traceparent", ""),
            request_id=request_id,
            tenant=tenant.name,
            klass=klass,
            model=body.model,
            stream=body.stream,
        )
        generate.traceparent = span.traceparent
        outcome = "error"
        try:
            response = await self._answer(request, generate, started)
            outcome = str(response.status)
            return response
        except EdgeError as exc:
            outcome = exc.code.value if exc.code else str(exc.status)
            raise
        finally:
            span.end(outcome=outcome)

    async def _answer(self, request: web.Request, generate: GenerateRequest, started: float) -> web.StreamResponse:
        """Store the request, wait for its first entry, then answer it, streamed or whole."""
        body, klass = generate.body, generate.klass
        async with self._generation(generate, self._payload(generate)) as run:
            stream, entries = run.stream, run.entries
            render = self._renderer(request, generate)
            headers = {
                REQUEST_ID_HEADER: request[ANSWER_ID],
                "openai-processing-ms": str(int((time.monotonic() - started) * 1000)),
            }
            if isinstance(entries[0], (Delta, Finished)):
                headers.update(entries[0].headers)
            if not body.stream or isinstance(render, EmbeddingRenderer):  # an embedding never streams
                response: web.StreamResponse = await collect_json(
                    stream, generate, render, entries, started, self.metrics, headers
                )
            elif self.resumable.covers(request):
                run.held = True  # from here `Resumes` ends the stream, and cancels it if need be
                response = await self.resumable.stream(request, stream, generate, render, entries, started, headers)
            else:
                response = await stream_sse(
                    request,
                    stream,
                    generate,
                    render,
                    entries,
                    started,
                    self.metrics,
                    headers,
                    self.config.write_timeout_s,
                )
            self.metrics.requests.labels(klass, str(response.status)).inc()
            return response

    async def complete(self, tenant: Tenant, raw: bytes, request_id: str, klass: str, deadline: float) -> bytes:
        """The whole answer to a request no client waits on (a batch's line): the endpoint's JSON
        body. Every check of the HTTP path applies; a refusal or an in-band error raises EdgeError."""
        body, extra = self.parse(raw)
        generate = self._line_request(tenant, body, extra, request_id, klass, deadline)
        return await self._collect(generate, renderer_for(generate))

    def _line_request(
        self, tenant: Tenant, body: Body, extra: bytes, request_id: str, klass: str, deadline: float
    ) -> GenerateRequest:
        """A batch line's request, once its body passed the HTTP path's checks."""
        if body.stream:
            raise EdgeError(
                ErrorCode.invalid_request,
                "a batch's requests are answered whole: stream must be false or left out",
                "stream",
            )
        return self._request(tenant, body, extra, request_id, klass, time.time(), deadline)

    def _request(
        self, tenant: Tenant, body: Body, extra: bytes, request_id: str, klass: str, now: float, deadline: float
    ) -> GenerateRequest:
        """The request for the broker, once the model is known to be served."""
        self._check_model(body.model, tenant.name)
        return to_generate(
            body,
            extra,
            request_id=request_id,
            tenant=tenant.name,
            klass=klass,
            reply_to=self.s.tok(tenant.name, self.edge_id),
            edge=self.edge_id,
            now=now,
            deadline=deadline,
        )

    async def _collect(self, generate: GenerateRequest, render: Whole) -> bytes:
        """Publish a batch line's request and collect its answer whole."""
        started = time.monotonic()
        async with self._generation(generate, self._payload(generate)) as run:
            return await collect_body(run.stream, generate, render, run.entries, started, self.metrics)

    @contextlib.asynccontextmanager
    async def _generation(self, generate: GenerateRequest, payload: bytes) -> AsyncIterator[_Run]:
        """The request stored and its first entries arrived (an error before any token raises);
        on the way out its stream is ended and, unless it finished, its work cancelled (unless
        the run was handed on: `held`)."""
        stream = self.demux.open(
            generate.request_id, generate.tenant, generate.deadline + REPLY_GRACE_S, generate.klass
        )
        run = _Run(stream)
        published = False
        try:
            await self._publish(generate, payload)
            published = True
            run.entries = await self._first_entries(stream)
            first = run.entries[0]
            if isinstance(first, StreamError):
                if first.code == ErrorCode.duplicate_request.value:
                    # Over HTTP only a reused Idempotency-Key names a request id twice.
                    raise EdgeError(
                        ErrorCode.duplicate_request,
                        "a request with this Idempotency-Key was already accepted",
                        "Idempotency-Key",
                    )
                raise from_code(first.code, first.message, first.param, first.headers)
            yield run
        finally:
            if not run.held:
                await self._end(stream, published)

    async def _end(self, stream: ResponseStream, published: bool) -> None:
        self.demux.close(stream.request_id)
        # The client left, the deadline passed here, or the edge ended the stream: stop the
        # work. A stream its worker or the broker ended needs nothing more.
        if stream.edge_failed or (published and not stream.closed):
            await self._cancel(stream.tenant, stream.request_id)

    def _payload(self, generate: GenerateRequest) -> bytes:
        """The request's bytes on the wire, once it is known to fit (NATS, the model's context)."""
        try:
            payload = codec.encode(generate)
        except OverflowError:
            # JSON allows any integer; the msgpack wire carries 64 bits. Typed fields have bounds
            # and are refused by name already: this is a free-form value (a content part's, say).
            raise EdgeError(ErrorCode.invalid_request, "an integer in the request does not fit in 64 bits") from None
        if len(payload) > self._nc.max_payload:
            raise EdgeError(
                ErrorCode.payload_too_large, f"the request is {len(payload)} bytes; the limit is {self._nc.max_payload}"
            )
        check_context(
            generate, context_limit(self.catalogue.models, generate.body.model, self.config.max_context_tokens)
        )
        return payload

    async def _parse(self, request: web.Request) -> tuple[Body, bytes]:
        return self.parse(await request.read())

    def parse(self, body: bytes) -> tuple[Body, bytes]:
        try:
            return self._decode(body)
        except codec.ValidationError as exc:
            raise EdgeError(ErrorCode.invalid_request, str(exc), param_of(str(exc))) from None
        except codec.DecodeError as exc:
            raise EdgeError(ErrorCode.invalid_request, f"the body is not valid JSON: {exc}") from None
        except codec.TooDeep as exc:
            raise EdgeError(ErrorCode.invalid_request, str(exc)) from None

    def _renderer(self, request: web.Request, generate: GenerateRequest) -> Render | EmbeddingRenderer:
        """How entries become bytes: chat or text completions here; `/v1/responses` overrides it."""
        return renderer_for(generate)

    def _class_for(self, request: web.Request, tenant: Tenant) -> str:
        klass = request.headers.get(CLASS_HEADER, tenant.default_class)
        if klass not in self.catalogue.classes:
            raise EdgeError(ErrorCode.unknown_class, f"unknown priority class {klass!r}", CLASS_HEADER)
        if not tenant.may_use(klass):
            raise EdgeError(ErrorCode.class_not_allowed, f"this API key may not use class {klass!r}", CLASS_HEADER)
        return klass

    def _deadline(self, request: web.Request, now: float) -> float:
        timeout = self.settings.default_timeout_s
        raw = request.headers.get(TIMEOUT_HEADER)
        if raw is not None:
            try:
                asked = float(raw)
            except ValueError:
                asked = -1.0
            if not 0 < asked <= MAX_TIMEOUT_S:
                raise EdgeError(
                    ErrorCode.invalid_request,
                    f"must be a number of seconds in (0, {MAX_TIMEOUT_S:.0f}]",
                    TIMEOUT_HEADER,
                )
            timeout = min(timeout, asked)
        return now + timeout

    def _request_id(self, request: web.Request, tenant: Tenant) -> str:
        """Laneway's id for this request (frames, usage, audit, logs)."""
        key = request.headers.get("Idempotency-Key")
        if key is not None and not 0 < len(key) <= MAX_IDEMPOTENCY_KEY:
            raise EdgeError(
                ErrorCode.invalid_request,
                f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} characters",
                "Idempotency-Key",
            )
        request_id = idempotent_id(self.config.idempotency_secret, tenant.name, key) if key else uuid.uuid4().hex
        answer_id(request, request_id)
        return request_id

    def _check_model(self, name: str, tenant: str) -> None:
        """Refuse early what the broker would refuse: unknown models (another tenant's private
        model among them), and a models-table pool with no ready worker. Rule-routed models are
        left to the broker, which may spill them."""
        rules = self.catalogue.rules
        if rules is not None and rules.serves(name):
            return
        model = self.catalogue.models.get(name)
        if model is None or not model.serves(tenant):
            raise EdgeError(ErrorCode.unknown_model, f"the model {name!r} does not exist", "model")
        if not self.readiness.ready_pools().get(model.pool):
            raise EdgeError(ErrorCode.no_worker, f"no worker is ready to serve {name!r}; retry shortly")

    async def _publish(self, generate: GenerateRequest, payload: bytes) -> None:
        await publish_request(self._nc, self.s, self.config, self.metrics, self._cancel, generate, payload)

    async def _first_entries(self, stream: ResponseStream) -> list[Entry]:
        try:
            return await stream.next_entries()
        except TimeoutError:
            raise EdgeError(ErrorCode.deadline_exceeded, "no response before the deadline") from None
