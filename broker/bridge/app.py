"""The bridge process: OpenAI-compatible HTTP in, `GenerateRequest` on JetStream, frames back out.

Per request: authenticate (key → tenant) → parse and validate → subscribe-first (the edge's one
frame subscription exists before any publish) → publish with `Nats-Msg-Id` and wait for the
PubAck ("accepted") → wait for the first entry → answer. Errors before the first token are
ordinary HTTP errors; after it they go in-band, then [DONE]. A client that goes away turns into
a cancel on `lw.cancel.<tenant>.<request_id>`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import uuid

import nats.js.errors
from aiohttp import web
from nats.aio.client import Client
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from broker import tenants as tenant_docs
from broker.bridge import openapi
from broker.bridge.admin import AdminConfig, Evaluator, admin_app
from broker.bridge.errors import EdgeError, body_timeout, from_code, unauthorized
from broker.bridge.readiness import Readiness
from broker.bridge.respond import collect_json, stream_sse
from broker.bridge.server import HttpServer
from broker.bridge.translate import check_context, param_of, to_generate
from broker.classes import DEFAULT_CLASSES
from broker.config import BridgeConfig, LogicalModel, Settings
from broker.demux import REPLY_GRACE_S, Demux, ResponseStream
from broker.metrics import BridgeMetrics
from broker.models import decode_models, served_names
from broker.routing import rules as rule_docs
from broker.routing.rules import RuleSet
from broker.routing.store import RuleStore, is_rules_key
from broker.runtime.connect import connect
from broker.runtime.kvwatch import BucketWatch
from broker.tenants import Tenant, TenantDirectory
from broker.topology import ensure_topology, put_settings, seed_settings
from schemas import codec
from schemas.errors import ErrorCode
from schemas.frames import Entry, StreamError
from schemas.openai import (
    ChatCompletionRequest,
    Model,
    ModelList,
)
from schemas.requests import Cancel, GenerateRequest
from schemas.subjects import MSG_ID_HEADER, msg_id

log = logging.getLogger("laneway.bridge")

CLASS_HEADER = "x-laneway-class"
TIMEOUT_HEADER = "x-laneway-timeout"
WORKER_LOST_CHECK_S = 1.0


class Bridge:
    def __init__(self, config: BridgeConfig, settings: Settings | None = None,
                 metrics: BridgeMetrics | None = None, *, admin: AdminConfig | None = None,
                 evaluator: Evaluator | None = None) -> None:
        self.config = config
        self.settings = settings or Settings()
        self.s = config.nats.subjects
        self.metrics = metrics or BridgeMetrics()
        self.edge_id = uuid.uuid4().hex[:12]
        self.tenants = TenantDirectory()
        self.models: dict[str, LogicalModel] = {}
        self.rules: RuleSet | None = None
        self.admin = admin or AdminConfig()
        self.evaluator = evaluator
        self.rule_store: RuleStore | None = None
        self.classes = {c.name for c in DEFAULT_CLASSES}
        self.readiness = Readiness(config.worker_stale_s)
        self.demux = Demux(self.metrics)
        self.url = ""
        self._nc: Client | None = None
        self._server: HttpServer | None = None
        self._watches: list[BucketWatch] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._cancel_on_reconnect: list[tuple[str, str]] = []

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        n = self.config.nats
        self._nc = await connect(n.url, f"laneway-bridge-{self.edge_id}", n.user, n.password,
                                 on_disconnect=self._nats_lost, on_reconnect=self._nats_back)
        js = self._nc.jetstream()
        await ensure_topology(js, self.s, self.config.limits)
        # The settings file into KV: by default only what KV never had, so a restart cannot undo
        # an operator's live edit.
        provision = put_settings if self.config.settings_overwrite else seed_settings
        await provision(js, self.s, self.settings)
        self._watches = [
            BucketWatch(js, self.s.bucket("tenants"), self._put_tenant, self.tenants.remove),
            BucketWatch(js, self.s.bucket("routing"), self._put_routing, self._delete_routing),
            BucketWatch(js, self.s.bucket("classes"), lambda k, v: self.classes.add(k),
                        self.classes.discard),
        ]
        for watch in self._watches:
            await watch.start()
        self.rule_store = await RuleStore.open(js, self.s)
        # Subscribe first: frames for a request can never arrive before we listen.
        await self._nc.subscribe(self.s.tok_edge(self.edge_id), cb=self.demux.on_frame,
                                 pending_msgs_limit=1_000_000, pending_bytes_limit=1 << 30)
        await self._nc.subscribe(self.s.worker_events, cb=self.readiness.on_heartbeat)
        await self._nc.subscribe(self.s.broker_events, cb=self.readiness.on_broker)
        await self._nc.publish(self.s.worker_ping, b"")
        self._tasks.append(asyncio.create_task(self._watch_workers(), name="worker-lost"))
        self._server = HttpServer(self.build_app(), self.metrics, max_connections=self.config.max_connections,
                                  header_timeout_s=self.config.header_timeout_s)
        port = await self._server.start(self.config.host, self.config.port)
        self.url = f"http://{self.config.host}:{port}"
        log.info("bridge listening on %s (edge %s)", self.url, self.edge_id)

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop()
            self._server = None
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for watch in self._watches:
            await watch.stop()
        if self._nc is not None:
            await self._nc.close()
            self._nc = None

    async def __aenter__(self) -> "Bridge":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def wait_ready(self, timeout: float = 30.0) -> None:
        """Until every configured pool has a ready worker (start-up ordering in tests and `up`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            pools = self.readiness.ready_pools()
            if (self.models and all(pools.get(m.pool) for m in self.models.values())
                    and self.readiness.brokers()):
                return
            if loop.time() > deadline:
                raise TimeoutError(f"no ready worker for some pool after {timeout}s: {pools}")
            await self._nc.publish(self.s.worker_ping, b"")
            await asyncio.sleep(0.1)

    def _put_tenant(self, name: str, value: bytes) -> None:
        self.tenants.put(tenant_docs.decode(name, value))

    def _put_routing(self, key: str, value: bytes) -> None:
        if key == "models":
            self.models = decode_models(value)
        elif is_rules_key(key):
            self.rules = rule_docs.decode(value)
            self.metrics.eval_quality.clear()
            quality = self.rules.gate.candidate_quality if self.rules.gate else None
            if quality is not None:
                self.metrics.eval_quality.labels(str(self.rules.version)).set(quality)

    def _delete_routing(self, key: str) -> None:
        if is_rules_key(key):
            self.rules = None
            self.metrics.eval_quality.clear()

    def model_names(self) -> list[str]:
        return sorted(served_names(self.models, self.rules))

    # -- the app --------------------------------------------------------------------------
    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_body_bytes,
                              middlewares=[self._errors_middleware, self._read_body])
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/v1/models", self.list_models)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics_endpoint)
        app.router.add_get("/openapi.json", self.openapi_spec)
        app.add_subapp("/v1/admin", admin_app(self.rule_store, self.evaluator, self.admin))
        return app

    @web.middleware
    async def _errors_middleware(self, request: web.Request, handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except EdgeError as exc:
            self.metrics.rejected.labels(exc.code.value if exc.code else str(exc.status)).inc()
            return exc.response()
        except web.HTTPException as exc:  # aiohttp's own: 404 route, 405 method, 413 body size
            if exc.status < 400:
                raise
            code = ErrorCode.payload_too_large if exc.status == 413 else ErrorCode.invalid_request
            err = EdgeError(code, exc.reason or "request refused", status=exc.status,
                            code_name="not_found" if exc.status == 404 else None)
            return err.response()

    @web.middleware
    async def _read_body(self, request: web.Request, handler) -> web.StreamResponse:
        """Every body is read whole within --body-timeout before a handler (admin's too) sees it: a
        client trickling its body holds a connection no longer than that."""
        if request.body_exists:
            try:
                async with asyncio.timeout(self.config.body_timeout_s):
                    await request.read()    # kept by aiohttp: the handler's read() returns it
            except TimeoutError:
                raise body_timeout(self.config.body_timeout_s) from None
        return await handler(request)

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        pools = self.readiness.ready_pools()
        wanted = sorted({m.pool for m in self.models.values()})
        status = {pool: pools.get(pool, 0) for pool in wanted}
        brokers = self.readiness.brokers()
        ready = (bool(self._nc and self._nc.is_connected) and all(status.values()) and bool(status)
                 and brokers > 0)
        return web.json_response({"ready": ready, "nats": bool(self._nc and self._nc.is_connected),
                                  "brokers": brokers, "pools": status}, status=200 if ready else 503)

    async def metrics_endpoint(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def openapi_spec(self, request: web.Request) -> web.Response:
        return web.Response(body=openapi.spec(tuple(self.model_names())), content_type="application/json")

    async def list_models(self, request: web.Request) -> web.Response:
        self._authenticate(request)
        data = [Model(id=name, created=0) for name in self.model_names()]
        return web.Response(body=codec.encode_json(ModelList(data)), content_type="application/json")

    # -- chat completions -----------------------------------------------------------------
    def _authenticate(self, request: web.Request) -> Tenant:
        header = request.headers.get("Authorization", "")
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise unauthorized("missing API key: send 'Authorization: Bearer <key>'")
        tenant = self.tenants.authenticate(key.strip())
        if tenant is None:
            raise unauthorized("invalid API key")
        return tenant

    async def _parse(self, request: web.Request) -> ChatCompletionRequest:
        body = await request.read()
        try:
            return codec.decode_chat_request(body)
        except codec.ValidationError as exc:
            raise EdgeError(ErrorCode.invalid_request, str(exc), param_of(str(exc))) from None
        except codec.DecodeError as exc:
            raise EdgeError(ErrorCode.invalid_request, f"the body is not valid JSON: {exc}") from None
        except codec.TooDeep as exc:
            raise EdgeError(ErrorCode.invalid_request, str(exc)) from None

    def _class_for(self, request: web.Request, tenant: Tenant) -> str:
        klass = request.headers.get(CLASS_HEADER, tenant.default_class)
        if klass not in self.classes:
            raise EdgeError(ErrorCode.unknown_class, f"unknown priority class {klass!r}", CLASS_HEADER)
        if not tenant.may_use(klass):
            raise EdgeError(ErrorCode.invalid_request, f"this API key may not use class {klass!r}",
                            CLASS_HEADER, status=403, type="permission_error", code_name="class_not_allowed")
        return klass

    def _deadline(self, request: web.Request, now: float) -> float:
        timeout = self.settings.default_timeout_s
        raw = request.headers.get(TIMEOUT_HEADER)
        if raw is not None:
            try:
                asked = float(raw)
            except ValueError:
                asked = -1.0
            if not 0 < asked <= 86400:
                raise EdgeError(ErrorCode.invalid_request, "must be a number of seconds in (0, 86400]",
                                TIMEOUT_HEADER)
            timeout = min(timeout, asked)
        return now + timeout

    def _request_id(self, request: web.Request, tenant: Tenant) -> str:
        # A client retry that carries the same idempotency key maps to the same request id, so
        # JetStream's dedup window stores it once: exactly one generation.
        key = request.headers.get("Idempotency-Key")
        if key:
            return hashlib.sha256(f"{tenant.name}\0{key}".encode()).hexdigest()[:32]
        return uuid.uuid4().hex

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        tenant = self._authenticate(request)
        body = await self._parse(request)
        klass = self._class_for(request, tenant)
        self._check_model(body.model)
        now = time.time()
        request_id = self._request_id(request, tenant)
        generate = to_generate(body, request_id=request_id, tenant=tenant.name, klass=klass,
                               reply_to=self.s.tok(tenant.name, self.edge_id), now=now,
                               deadline=self._deadline(request, now))
        payload = codec.encode(generate)
        if len(payload) > self._nc.max_payload:
            raise EdgeError(ErrorCode.payload_too_large,
                            f"the request is {len(payload)} bytes; the limit is {self._nc.max_payload}")
        check_context(generate, self._max_context(body.model))
        stream = self.demux.open(request_id, tenant.name, generate.deadline + REPLY_GRACE_S)
        published = False
        try:
            await self._publish(generate, payload)
            published = True
            entries = await self._first_entries(stream, generate)
            first = entries[0]
            if isinstance(first, StreamError):
                raise from_code(first.code, first.message, first.param, first.headers)
            if body.stream:
                include_usage = bool(body.stream_options and body.stream_options.include_usage)
                response = await stream_sse(request, stream, generate, entries, include_usage, started,
                                            self.metrics)
            else:
                response = await collect_json(stream, generate, entries, started, self.metrics)
            self.metrics.requests.labels(klass, str(response.status)).inc()
            return response
        finally:
            self.demux.close(request_id)
            # The client left, the deadline passed here, or the edge ended the stream: stop the
            # work. A stream its worker or the broker ended needs nothing more.
            if published and (not stream.closed or stream.edge_failed):
                await self._cancel(tenant.name, request_id)

    def _check_model(self, name: str) -> None:
        """Refuse early what the broker would refuse: unknown models, and a models-table pool with
        no ready worker. Rule-routed models are left to the broker, which may spill them."""
        if self.rules is not None and self.rules.serves(name):
            return
        model = self.models.get(name)
        if model is None:
            raise EdgeError(ErrorCode.unknown_model, f"the model {name!r} does not exist", "model")
        if not self.readiness.ready_pools().get(model.pool):
            raise EdgeError(ErrorCode.no_worker, f"no worker is ready to serve {name!r}; retry shortly")

    def _max_context(self, name: str) -> int:
        """A models-table entry's own context; a rule-routed model's pool is chosen later, by the
        broker, so it gets the bridge's --max-context-tokens."""
        model = self.models.get(name)
        return model.max_context_tokens if model is not None else self.config.max_context_tokens

    async def _publish(self, generate: GenerateRequest, payload: bytes) -> None:
        if not self._nc.is_connected:    # nats-py would buffer it and leave the client waiting
            raise EdgeError(ErrorCode.unavailable, "Laneway lost its connection to NATS; retry shortly")
        subject = self.s.req(generate.klass, generate.tenant)
        headers = {MSG_ID_HEADER: msg_id(generate.tenant, generate.request_id)}
        try:
            ack = await self._nc.jetstream().publish(subject, payload, headers=headers, timeout=5.0)
        except nats.js.errors.APIError as exc:
            description = (exc.description or "").lower()
            if "per subject" in description:
                raise EdgeError(ErrorCode.queue_full,
                                f"too many queued requests for class {generate.klass!r}; retry later",
                                headers={"x-ratelimit-limit-requests": "backlog",
                                         "x-ratelimit-remaining-requests": "0"}) from None
            if "maximum" in description or "resource" in description or exc.code == 503:
                raise EdgeError(ErrorCode.overloaded, "Laneway is at capacity; retry later") from None
            raise
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError,
                nats.js.errors.NoStreamResponseError, nats.errors.ConnectionClosedError):
            raise EdgeError(ErrorCode.overloaded, "the request log is unavailable; retry later") from None
        if ack.duplicate:
            # The same Idempotency-Key was accepted moments ago: it is generated exactly once,
            # by the request that first sent it.
            raise EdgeError(ErrorCode.duplicate_request,
                            "a request with this Idempotency-Key was already accepted", "Idempotency-Key")

    # -- NATS lost ------------------------------------------------------------------------
    def _nats_lost(self) -> None:
        """Without NATS no frame can arrive and no request can be stored: end every open stream
        now with a clear error instead of letting clients wait out their deadlines. Their work
        may still run once NATS is back, so cancels for them go out on reconnect."""
        failed = self.demux.fail_all(ErrorCode.unavailable,
                                     "Laneway lost its connection to NATS; retry shortly")
        self._cancel_on_reconnect += [(s.tenant, s.request_id) for s in failed]
        if failed:
            log.warning("NATS lost: ended %d open streams with `unavailable`", len(failed))

    def _nats_back(self) -> None:
        pending, self._cancel_on_reconnect = self._cancel_on_reconnect, []
        for tenant, request_id in pending:
            self._tasks.append(asyncio.create_task(self._cancel(tenant, request_id)))
        self._tasks = [t for t in self._tasks if not t.done()]

    async def _first_entries(self, stream: ResponseStream, generate: GenerateRequest) -> list[Entry]:
        try:
            return await stream.next_entries()
        except TimeoutError:
            raise EdgeError(ErrorCode.deadline_exceeded, "no response before the deadline") from None

    async def _cancel(self, tenant: str, request_id: str) -> None:
        if self._nc is not None and self._nc.is_connected:
            await self._nc.publish(self.s.cancel(tenant, request_id),
                                   codec.encode(Cancel(request_id=request_id, tenant=tenant)))

    # -- worker loss ----------------------------------------------------------------------
    async def _watch_workers(self) -> None:
        """A stream whose worker stopped heartbeating ends with `worker_lost` instead of hanging
        until JetStream redelivers (which cannot help once tokens reached the client)."""
        while True:
            await asyncio.sleep(WORKER_LOST_CHECK_S)
            for stream in self.demux.streams():
                if (stream.streamed and not stream.closed and stream.source
                        and self.readiness.known(stream.source)
                        and not self.readiness.alive(stream.source)):
                    stream.fail(ErrorCode.worker_lost,
                                "the worker serving this request was lost after the stream started")
