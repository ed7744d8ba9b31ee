"""The bridge process: OpenAI-compatible HTTP in, `GenerateRequest` on JetStream, frames back out.

This module starts and stops the pieces and serves the small routes. The wings, in the order a
request meets them: `auth.py` (key → tenant), `generate/` (chat, completions, embeddings: the
one path every generation takes), `responses/`, `files/` and `batch/` (the endpoints over it),
`streams/` (frames back, by request; streams whose NATS or worker went away), `render/` (entries
→ OpenAI JSON and SSE), `resume/` (resumable streams). The shared `core.catalogue.Catalogue`
keeps tenants, classes, models and rules current from KV. The bridge waits for provisioning
(`core/provision.py`) to have made the streams and live buckets; the one bucket it creates is its
own runtime state, the stored responses (`responses/stored/store.py`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid

import nats.errors
from aiohttp import web
from nats.aio.client import Client
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from bridge import openapi
from bridge.admin import AdminConfig, Evaluator, admin_app
from bridge.auth import REQUEST_ID_HEADER, answer_id, authenticate, bearer_key, tenant_of
from bridge.batch.api import BatchesApi
from bridge.batch.runner import BatchRunner
from bridge.batch.store import BatchStore
from bridge.config import BridgeConfig
from bridge.errors import EdgeError, body_timeout
from bridge.files.routes import FilesApi, is_upload
from bridge.files.store import SWEEP_EVERY_S, FileStore
from bridge.generate.admission import EdgeAdmission
from bridge.generate.routes import Generations
from bridge.metrics import BridgeMetrics
from bridge.readiness import Readiness
from bridge.responses.routes import Responses
from bridge.responses.stored.background import Background
from bridge.responses.stored.conversations import Conversations
from bridge.responses.stored.routes import StoredRoutes
from bridge.responses.stored.store import ResponseStore
from bridge.responses.stored.takeover import Takeover
from bridge.responses.translate import decode_responses
from bridge.resume.relay import RelayClient, RelayServer
from bridge.resume.routes import ResumableStreams
from bridge.resume.window import Resumes
from bridge.server import HttpServer
from bridge.streams.continuation import Continuations
from bridge.streams.demux import BufferLimits, Demux
from bridge.streams.losses import Losses
from core.catalogue import Catalogue
from core.connect import connect, disconnect
from core.liveness import hold
from core.looplag import LoopLag
from core.provision import wait_provisioned
from core.routing.rules import RuleSet
from core.routing.store import RuleStore
from core.settings import Settings
from core.tasks import beat_forever, cancel_and_wait, pause
from schemas import codec
from schemas.errors import ErrorCode
from schemas.openai_out import Model, ModelList
from schemas.requests import Cancel

log = logging.getLogger("laneway.bridge")


class Bridge:
    def __init__(
        self,
        config: BridgeConfig,
        settings: Settings | None = None,
        metrics: BridgeMetrics | None = None,
        *,
        admin: AdminConfig | None = None,
        evaluator: Evaluator | None = None,
    ) -> None:
        self.config = config
        self.settings = settings or Settings()
        self.s = config.nats.subjects
        self.metrics = metrics or BridgeMetrics()
        self.edge_id = uuid.uuid4().hex[:12]
        self.catalogue = Catalogue(on_rules=self._rules_changed)
        self.admin = admin or AdminConfig()
        self.evaluator = evaluator
        self.rule_store: RuleStore | None = None
        self.responses: ResponseStore | None = None
        self.background: Background | None = None
        self.takeover: Takeover | None = None
        self.readiness = Readiness(config.worker_stale_s)
        self.demux = Demux(
            self.metrics,
            BufferLimits(config.stream_buffer_bytes, config.tenant_buffer_bytes, config.resume_tenant_bytes),
        )
        self.loop_lag = LoopLag()
        self.admission = EdgeAdmission(
            config, self.demux, self.loop_lag, self.metrics, self.catalogue.rank, self.catalogue.classes
        )
        self.losses = Losses(self.demux, self.readiness, self.loop_lag)
        self.continuations = Continuations(self.demux, config.max_migrations)
        self.resumes = Resumes(
            self.edge_id, config.resume_window_s, self.demux.limits, self.demux, self.metrics, self._cancel
        )
        self.relay: RelayServer | None = None
        self.url = ""
        self.files: FileStore | None = None
        self.batches: BatchStore | None = None
        self.batch_runner: BatchRunner | None = None
        self.endpoints: dict[str, Generations] = {}  # what a batch's lines are answered by
        self._nc: Client | None = None
        self._server: HttpServer | None = None
        self._loop_lag_task: asyncio.Task[None] | None = None
        self._sweep_task: asyncio.Task[None] | None = None

    @property
    def rules(self) -> RuleSet | None:
        return self.catalogue.rules

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        n = self.config.nats
        self._nc = await connect(n, f"laneway-bridge-{self.edge_id}", on_disconnect=self.losses.nats_lost)
        js = self._nc.jetstream()
        await wait_provisioned(js, self.s, "bridge")  # `laneway up` or `laneway ops provision`
        await self.catalogue.start(js, self.s)
        self.rule_store = await RuleStore.open(js, self.s)
        self.files = await FileStore.open(js, self.s)
        self.batches = await BatchStore.open(js, self.s)
        self.responses = await ResponseStore.open(js, self.s, self.config.store_replicas)
        # Subscribe first: frames for a request can never arrive before we listen.
        await self._nc.subscribe(
            self.s.tok_edge(self.edge_id),
            cb=self.demux.on_frame,
            pending_msgs_limit=1_000_000,
            pending_bytes_limit=1 << 30,
        )
        await self._nc.subscribe(self.s.cont_edge(self.edge_id), cb=self.continuations.on_ask)
        await self._nc.subscribe(self.s.worker_events, cb=self.readiness.on_heartbeat)
        # Held while this bridge is connected, never answered: the interest workers probe to
        # cancel the work of a bridge that is gone (workers/orphans.py).
        await hold(self._nc, self.s.alive(self.edge_id))  # workers/orphans.py probes it
        if self.resumes.enabled:  # other replicas ask for the streams this one holds
            self.relay = RelayServer(self._nc, self.s, self.resumes)
            await self._nc.subscribe(self.s.resume(self.edge_id), cb=self.relay.on_control)
        await self._nc.subscribe(self.s.broker_events, cb=self.readiness.on_broker)
        await self._nc.publish(self.s.worker_ping, b"")
        self._loop_lag_task = asyncio.create_task(self.loop_lag.run(), name="loop-lag")
        self._sweep_task = asyncio.create_task(
            beat_forever(self.files.sweep_uploads, SWEEP_EVERY_S), name="upload-sweep"
        )
        self.losses.start()
        app = self.build_app()
        self.batch_runner = BatchRunner(
            self.batches,
            self.files,
            self.endpoints,
            self.catalogue,
            self.edge_id,
            self._cancel,
            concurrency=self.config.batch_concurrency,
            lease_s=self.config.batch_lease_s,
        )
        await self.batch_runner.start()
        if self.takeover is not None:
            await self.takeover.start()
        self._server = HttpServer(
            app,
            self.metrics,
            max_connections=self.config.max_connections,
            header_timeout_s=self.config.header_timeout_s,
        )
        port = await self._server.start(self.config.host, self.config.port)
        self.url = f"http://{self.config.host}:{port}"
        log.info("bridge listening on %s (edge %s)", self.url, self.edge_id)

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop()
            self._server = None
        if self.batch_runner is not None:
            await self.batch_runner.stop()  # its batches go to another bridge at once
            self.batch_runner = None
        await self.losses.stop()
        if self.takeover is not None:
            await self.takeover.stop()
            self.takeover = None
        if self.background is not None:
            await self.background.stop()
        if self.responses is not None:
            await self.responses.drain()
        if self.relay is not None:
            await self.relay.stop()
        await self.resumes.stop()  # cancels the generations no client will come back for
        await cancel_and_wait(self._loop_lag_task, self._sweep_task)
        self._loop_lag_task = self._sweep_task = None
        await self.catalogue.stop()
        if self._nc is not None:
            await disconnect(self._nc, drain=False)
            self._nc = None

    async def __aenter__(self) -> Bridge:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def wait_ready(self, timeout: float = 30.0) -> None:
        """Until every configured pool has a ready worker (start-up ordering in tests and `up`)."""
        if (nc := self._nc) is None:
            raise RuntimeError("Bridge.start() first")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            pools = self.readiness.ready_pools()
            models = self.catalogue.models
            if models and all(pools.get(m.pool) for m in models.values()) and self.readiness.brokers():
                return
            if loop.time() > deadline:
                raise TimeoutError(f"no ready worker for some pool after {timeout}s: {pools}")
            await nc.publish(self.s.worker_ping, b"")
            await pause(0.1)

    def _rules_changed(self, rules: RuleSet | None) -> None:
        self.metrics.eval_quality.clear()
        if rules is not None and rules.gate and rules.gate.candidate_quality is not None:
            self.metrics.eval_quality.labels(str(rules.version)).set(rules.gate.candidate_quality)

    def model_names(self, tenant: str = "") -> list[str]:
        """The models a tenant may call; "" (anyone: the unauthenticated OpenAPI document) names
        only those open to every tenant."""
        models = self.catalogue.models
        return sorted(n for n in self.catalogue.model_names() if n not in models or models[n].serves(tenant))

    async def _cancel(self, tenant: str, request_id: str) -> None:
        """While NATS is away nats-py buffers the cancel and sends it on reconnect."""
        if self._nc is None or self._nc.is_closed:
            return
        try:
            await self._nc.publish(
                self.s.cancel(tenant, request_id), codec.encode(Cancel(request_id=request_id, tenant=tenant))
            )
        except nats.errors.Error as exc:  # the reconnect buffer full, the connection closing
            log.warning("cancel for %s dropped: %s", request_id, type(exc).__name__)

    # -- the app --------------------------------------------------------------------------
    def build_app(self) -> web.Application:
        nc, files, batches, rule_store = self._nc, self.files, self.batches, self.rule_store
        if nc is None or files is None or batches is None or rule_store is None:
            raise RuntimeError("Bridge.build_app() needs what Bridge.start() opens")
        relay = RelayClient(nc, self.s, self.edge_id, self.metrics, self.config.write_timeout_s)
        resumable = ResumableStreams(self.resumes, relay, self.metrics, self.config.write_timeout_s)
        shared = (
            nc,
            self.edge_id,
            self.config,
            self.settings,
            self.catalogue,
            self.readiness,
            self.demux,
            self.metrics,
            self._cancel,
            self.admission,
            resumable,
        )
        chat = Generations(codec.decode_chat_request, *shared)
        completions = Generations(codec.decode_completion_request, *shared)
        routes = background = None
        if self.responses is not None:
            routes = StoredRoutes(self.responses, self.catalogue, self._cancel)
            background = self.background = Background(
                self.responses, self.demux, self.edge_id, self._cancel, self.config.background_lease_s
            )
        conversations = Conversations(self.responses, self.catalogue) if self.responses is not None else None
        responses = Responses(
            decode_responses,
            *shared,
            store=self.responses,
            background=background,
            routes=routes,
            conversations=conversations,
        )
        if background is not None:
            self.takeover = Takeover(background, responses.take_over)
        embeddings = Generations(codec.decode_embedding_request, *shared)
        self.endpoints = {
            "/v1/chat/completions": chat,
            "/v1/completions": completions,
            "/v1/embeddings": embeddings,
            "/v1/responses": responses,
        }
        app = web.Application(
            client_max_size=self.config.max_body_bytes, middlewares=[self._errors_middleware, self._read_body]
        )
        app.router.add_post("/v1/chat/completions", chat)
        app.router.add_post("/v1/completions", completions)
        app.router.add_post("/v1/responses", responses)
        app.router.add_post("/v1/embeddings", embeddings)
        if routes is not None and conversations is not None:
            routes.add_to(app)
            conversations.add_to(app)
        app.router.add_get("/v1/models", self.list_models)
        app.router.add_get("/v1/models/{model:.+}", self.get_model)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics_endpoint)
        app.router.add_get("/openapi.json", self.openapi_spec)
        FilesApi(files, self.catalogue, self.config.max_file_bytes, self.config.body_timeout_s).routes(app)
        BatchesApi(batches, files, self.catalogue).routes(app)
        app.add_subapp("/v1/admin", admin_app(rule_store, self.evaluator, self.admin))
        return app

    @web.middleware
    async def _errors_middleware(self, request: web.Request, handler) -> web.StreamResponse:
        response = await self._answer_or_error(request, handler)
        if not response.prepared and REQUEST_ID_HEADER not in response.headers:
            # Every answer carries one; the generation routes set theirs before streaming.
            response.headers[REQUEST_ID_HEADER] = answer_id(request, uuid.uuid4().hex)
        return response

    async def _answer_or_error(self, request: web.Request, handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except EdgeError as exc:
            self.metrics.rejected.labels(exc.code.value if exc.code else str(exc.status)).inc()
            return exc.response()
        except web.HTTPException as exc:  # aiohttp's own: 404 route, 405 method, 413 body size
            if exc.status < 400:
                raise
            code = ErrorCode.payload_too_large if exc.status == 413 else ErrorCode.invalid_request
            err = EdgeError(
                code,
                exc.reason or "request refused",
                status=exc.status,
                code_name="not_found" if exc.status == 404 else None,
            )
            return err.response()

    @web.middleware
    async def _read_body(self, request: web.Request, handler) -> web.StreamResponse:
        """Every body is read whole within --body-timeout before a handler (admin's too) sees it: a
        client trickling its body holds a connection no longer than that. Only a caller with a
        valid key gets its body read: an anonymous one is answered 401 (by the handler, which
        authenticates first) without a byte of its body held."""
        if request.body_exists and self._known_key(request) and not is_upload(request):
            try:
                async with asyncio.timeout(self.config.body_timeout_s):
                    await request.read()  # kept by aiohttp: the handler's read() returns it
            except TimeoutError:
                raise body_timeout(self.config.body_timeout_s) from None
        return await handler(request)

    def _known_key(self, request: web.Request) -> bool:
        """The bearer key is a tenant's, or an admin's on the admin API: from the headers alone."""
        if request.path.startswith("/v1/admin/"):
            return (key := bearer_key(request)) != "" and self.admin.authenticate(key) is not None
        return tenant_of(request, self.catalogue.tenants) is not None

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        pools = self.readiness.ready_pools()
        wanted = sorted({m.pool for m in self.catalogue.models.values()})
        status = {pool: pools.get(pool, 0) for pool in wanted}
        brokers = self.readiness.brokers()
        ready = bool(self._nc and self._nc.is_connected) and all(status.values()) and bool(status) and brokers > 0
        return web.json_response(
            {
                "ready": ready,
                "pid": os.getpid(),  # which server answers (`up`)
                "nats": bool(self._nc and self._nc.is_connected),
                "brokers": brokers,
                "pools": status,
                "pii": self.readiness.pii_stages(),
            },
            status=200 if ready else 503,
        )

    async def metrics_endpoint(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def openapi_spec(self, request: web.Request) -> web.Response:
        return web.Response(body=openapi.spec(tuple(self.model_names())), content_type="application/json")

    async def list_models(self, request: web.Request) -> web.Response:
        tenant = authenticate(request, self.catalogue.tenants)
        data = [Model(id=name, created=0) for name in self.model_names(tenant.name)]
        return web.Response(body=codec.encode_json(ModelList(data)), content_type="application/json")

    async def get_model(self, request: web.Request) -> web.Response:
        tenant = authenticate(request, self.catalogue.tenants)
        name = request.match_info["model"]
        if name not in self.model_names(tenant.name):
            raise EdgeError(ErrorCode.unknown_model, f"the model {name!r} does not exist", "model")
        return web.Response(body=codec.encode_json(Model(id=name, created=0)), content_type="application/json")
