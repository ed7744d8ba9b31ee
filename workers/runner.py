"""The worker loop: pull when there is room, feed the engine, one frame per step per inbox, ack.

- Pull: a `Credit` goes to `lw.pull.<pool>` only while the engine has a free slot; the broker
  holds it open until there is work (long poll), so an idle worker costs one message per
  `pull_wait_s`.
- Frames: each stream's deltas go into an outbox keyed by reply subject; a flusher publishes
  ONE `TokenFrame` per inbox per event-loop turn (and at most one per `frame_interval_s`). An
  engine step wakes every stream it produced a token for in the same turn, so a frame carries
  that whole step (one NATS message per inbox instead of one per token per stream: nats-py
  costs ~17 µs of CPU per message).
- Acks: in-progress (`+WPI`) for every running request every `in_progress_s`, the final `+ACK`
  after the request's last frame (same connection, so the order holds), `+TERM` for requests
  refused here. A request that fails before any token reached the client is `-NAK`ed so another
  attempt may succeed; after tokens were streamed it ends with an error entry instead.
- An `EngineDead` stops the worker without acking: JetStream redelivers its requests elsewhere.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
import uuid
from dataclasses import dataclass, field

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from broker.gate.cache import CachedResponse, ResponseCache
from broker.routing.cascade import CascadeSettings, StreamGate, Verdict
from broker.usage.meter import PRICES_KEY, Meter, parse_price_book
from laneway.connect import NatsSettings, connect
from laneway.livecfg import BucketWatch
from schemas import codec
from schemas.errors import ErrorCode
from schemas.frames import Delta, Finished, StreamError, TokenUsage
from schemas.subjects import MSG_ID_HEADER, msg_id
from schemas.usage import Usage
from schemas.work import Credit, Dispatch, Heartbeat
from workers.engine import (
    Engine,
    EngineDead,
    EngineError,
    EngineOutput,
    EngineRequest,
    UnsupportedRequest,
)
from workers.metrics import WorkerMetrics
from workers.outbox import Outbox

log = logging.getLogger("laneway.worker")

ACK, WPI, TERM = b"+ACK", b"+WPI", b"+TERM"
NAK_BACKOFF_S = 1.0     # a failed attempt is retried after this, not in a tight loop


def nak_with_delay(delay_s: float) -> bytes:
    return b'-NAK {"delay": %d}' % int(delay_s * 1e9)


@dataclass(frozen=True)
class WorkerConfig:
    nats: NatsSettings = field(default_factory=NatsSettings)
    pool: str = "default"
    worker_id: str = ""
    classes: tuple[str, ...] = ()           # empty: every class
    pull_wait_s: float = 5.0
    heartbeat_s: float = 2.0
    in_progress_s: float = 5.0              # must stay well under the consumer's ack_wait
    drain_s: float = 30.0                   # on SIGTERM, let running requests finish this long
    # At most one flush per interval: a real engine step (≥ 5 ms on a GPU) is always longer, so
    # this never delays a token there, but an engine that steps faster (the zero-delay sim, or
    # tiny models) has its steps coalesced instead of costing one NATS message per step.
    frame_interval_s: float = 0.002

    def with_id(self) -> "WorkerConfig":
        if self.worker_id:
            return self
        wid = f"{socket.gethostname().split('.')[0]}-{uuid.uuid4().hex[:6]}"
        return WorkerConfig(**{**self.__dict__, "worker_id": wid})


@dataclass(slots=True, eq=False)
class _Active:
    dispatch: Dispatch
    started: float
    seq: int = 0
    streamed: bool = False
    cancelled: bool = False
    first_token_at: float | None = None
    task: asyncio.Task[None] | None = None
    tokens: int = 0
    parts: list[str] | None = None          # the answer's text, kept only when it will be cached


class Worker:
    def __init__(self, config: WorkerConfig, engine: Engine, metrics: WorkerMetrics | None = None) -> None:
        self.config = config.with_id()
        self.id = self.config.worker_id
        self.s = self.config.nats.subjects
        self.engine = engine
        self.metrics = metrics or WorkerMetrics()
        self.ready = False
        self.dead: BaseException | None = None
        self._nc: Client | None = None
        self._active: dict[tuple[str, str], _Active] = {}
        self._outbox = Outbox(self.id, self.config.pool, self.metrics, self.config.frame_interval_s)
        self._room = asyncio.Event()
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._late_pulls: set[asyncio.Task[None]] = set()
        self._cache: ResponseCache | None = None
        self._stores: set[asyncio.Task[bool]] = set()
        self.meter = Meter()
        self._prices: BucketWatch | None = None

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        n = self.config.nats
        self._nc = await connect(n.url, f"laneway-worker-{self.id}", n.user, n.password)
        self._tasks.append(asyncio.create_task(self._heartbeats(), name="heartbeats"))
        js = self._nc.jetstream()
        self._prices = BucketWatch(js, self.s.bucket("routing"), self._put_routing, lambda key: None)
        await self._prices.start()
        # Load and warm up before taking any work: the first request pays no cold start.
        await self.engine.start()
        await self.engine.warmup()
        self.ready = True
        await self._heartbeat()
        await self._nc.subscribe(self.s.cancel_all, cb=self._on_cancel)
        await self._nc.subscribe(self.s.worker_ping, cb=self._on_ping)
        self._tasks += [
            asyncio.create_task(self._outbox.run(self._nc), name="flusher"),
            asyncio.create_task(self._in_progress(), name="in-progress"),
            asyncio.create_task(self._pull_loop(), name="pull-loop"),
        ]
        log.info("worker %s ready: pool=%s engine=%s model=%s", self.id, self.config.pool,
                 self.engine.name, self.engine.model)

    async def wait(self) -> int:
        """Until stopped or dead; the process exit code."""
        await self._stopping.wait()
        return 1 if self.dead is not None else 0

    async def stop(self) -> None:
        """Stop pulling; let running requests finish for `drain_s`; then hand the rest back."""
        self._stopping.set()
        self.ready = False
        pending = [a.task for a in self._active.values() if a.task is not None]
        if pending and self.dead is None:
            await asyncio.wait(pending, timeout=self.config.drain_s)
        for active in list(self._active.values()):
            if active.task is not None:
                active.task.cancel()    # unacked: JetStream redelivers them
        if self._nc is not None:
            await self._outbox.flush(self._nc)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await self.engine.cleanup()
        if self._stores:
            await asyncio.wait(self._stores, timeout=5)
        if self._prices is not None:
            await self._prices.stop()
        if self._nc is not None:
            try:
                if self._nc.is_connected:
                    await self._heartbeat()
                    await self._nc.drain()
                else:
                    await self._nc.close()
            except Exception as exc:  # closing anyway
                log.debug("close: %s", exc)
            self._nc = None

    async def __aenter__(self) -> "Worker":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- pulling --------------------------------------------------------------------------
    def _credit(self) -> Credit | None:
        """Room from the engine's state, corrected by what this runner has accepted: a request
        handed to a serving task is not in the engine until that task first runs, and counting
        it twice is safer than over-committing the engine."""
        cap = self.engine.capacity()
        running: dict[str, int] = {}
        unstarted_cost = 0
        for active in self._active.values():
            klass = active.dispatch.request.klass
            running[klass] = running.get(klass, 0) + 1
            if active.first_token_at is None:
                unstarted_cost += active.dispatch.request.estimated_cost()
        free = min(cap.free_slots, cap.total_slots - len(self._active))
        self.metrics.slots_total.labels(self.config.pool).set(cap.total_slots)
        self.metrics.slots_in_use.labels(self.config.pool).set(len(self._active))
        if free <= 0:
            return None
        return Credit(worker_id=self.id, pool=self.config.pool, free_slots=free,
                      token_budget=max(0, cap.token_budget - unstarted_cost),
                      total_slots=cap.total_slots, classes=list(self.config.classes),
                      running=running, wait_s=self.config.pull_wait_s)

    async def _pull_loop(self) -> None:
        subject = self.s.pull(self.config.pool)
        while not self._stopping.is_set():
            credit = self._credit()
            if credit is None:
                self._room.clear()
                await self._room.wait()
                continue
            self._room.clear()
            self.metrics.pulls.labels(self.config.pool).inc()
            pull = asyncio.create_task(self._pull(subject, credit))
            room = asyncio.create_task(self._room.wait())
            await asyncio.wait({pull, room}, return_when=asyncio.FIRST_COMPLETED)
            room.cancel()
            if not pull.done():
                # Room grew while the broker holds our pull open: a fresh credit replaces it
                # (the broker answers the old one at once); the old one's reply is still served.
                self._late_pulls.add(pull)
                pull.add_done_callback(self._late_pulls.discard)
                continue
            await pull

    async def _pull(self, subject: str, credit: Credit) -> None:
        try:
            reply = await self._nc.request(subject, codec.encode(credit),
                                           timeout=self.config.pull_wait_s + 2.0)
        except (NatsTimeout, asyncio.TimeoutError):
            return
        except NoRespondersError:
            await asyncio.sleep(0.5)    # no broker yet, or it is restarting
            return
        except Exception as exc:        # disconnected: the client reconnects
            log.warning("pull failed: %s", exc)
            await asyncio.sleep(0.5)
            return
        dispatches = codec.decode_batch(reply.data).dispatches
        if self._stopping.is_set():
            # Raced with shutdown: hand them straight back for another worker.
            for d in dispatches:
                self._outbox.after(d.ack_subject, nak_with_delay(0))
            return
        for dispatch in dispatches:
            self._start(dispatch)

    def _start(self, dispatch: Dispatch) -> None:
        request = dispatch.request
        key = (request.tenant, request.request_id)
        if not request.reply_to.startswith(self.s.tok_tenant_prefix(request.tenant)):
            # Defence in depth: never stream one tenant's tokens onto another's subjects.
            log.error("refused a dispatch whose reply subject is outside its tenant's inbox")
            self._outbox.after(dispatch.ack_subject, TERM)
            return
        if key in self._active:
            return  # a duplicate delivery of a request already running here
        active = _Active(dispatch, time.monotonic(), parts=[] if dispatch.cache_key else None)
        self._active[key] = active
        if time.time() >= request.deadline:
            self._fail(active, ErrorCode.deadline_exceeded, "the deadline passed before the request started")
            return
        active.task = asyncio.create_task(self._serve(active), name=f"serve-{request.request_id}")

    # -- serving one request --------------------------------------------------------------
    async def _serve(self, active: _Active) -> None:
        d = active.dispatch
        r = d.request
        # Cascade: hold the first tokens until their confidence says keep or escalate.
        gate = (StreamGate(CascadeSettings(min_mean_logprob=d.cascade_min_logprob, window=d.cascade_window))
                if d.escalate_to and self.engine.supports_logprobs else None)
        engine_request = EngineRequest(r.request_id, r.messages, r.prompt, r.sampling,
                                       priority=d.priority, klass=r.klass, logprobs=gate is not None)
        finished: Finished | None = None
        try:
            async with asyncio.timeout(max(0.0, r.deadline - time.time())):
                async for out in self.engine.generate(engine_request):
                    if out.text or out.token_ids:
                        for released in (gate.push(out, out.logprobs) if gate else [out]):
                            self._release_delta(active, released)
                    if out.finish_reason is not None:
                        if gate is not None:
                            for released in gate.finish():
                                self._release_delta(active, released)
                        reason = "cancelled" if active.cancelled else out.finish_reason
                        finished = Finished(r.request_id, d.attempt, self._seq(active), reason,
                                            TokenUsage(out.prompt_tokens, out.completion_tokens),
                                            self.engine.model)
                    if gate is not None and gate.verdict is Verdict.ESCALATE:
                        break   # leaving the iterator aborts the small request in the engine
            if gate is not None and gate.verdict is Verdict.ESCALATE:
                await self._escalate(active, gate.score)
                return
        except TimeoutError:
            await self.engine.abort(r.request_id)
            self._fail(active, ErrorCode.deadline_exceeded, "the deadline passed during generation")
            return
        except UnsupportedRequest as exc:
            self._fail(active, ErrorCode.invalid_request, f"{exc.param}: {exc.message}")
            return
        except EngineError as exc:
            if active.streamed:
                self._fail(active, ErrorCode.engine_error, exc.message)
            elif d.last_attempt:
                self._dead_letter(active, "engine_error", exc.message)
            else:
                # Nothing reached the client: another attempt (maybe on another worker) may work.
                self._release(active, nak_with_delay(NAK_BACKOFF_S * d.attempt))
            return
        except EngineDead as exc:
            log.error("engine died: %s; stopping without acking running requests", exc)
            self.dead = exc
            self._stopping.set()
            self._room.set()
            return
        except asyncio.CancelledError:
            raise   # worker shutdown: left unacked on purpose, JetStream redelivers it
        except Exception:
            # A bug, not a request problem: end the stream clearly rather than leave it hanging.
            log.exception("serving %s failed", r.request_id)
            self._fail(active, ErrorCode.internal_error, "internal error in the worker")
            return
        if finished is None:    # the engine ended the stream without saying why
            self._fail(active, ErrorCode.engine_error, "the engine ended the stream without finishing")
            return
        self._outbox.emit(r.reply_to, finished)
        self._release(active, ACK)
        self.metrics.finished.labels(self.config.pool, finished.finish_reason).inc()
        self._record_usage(active, finished.finish_reason, finished.usage.prompt_tokens,
                           finished.usage.completion_tokens, finished.model)
        self._store_answer(active, finished)

    def _release_delta(self, active: _Active, out: EngineOutput) -> None:
        """Send one engine delta to the client (after the cascade let it through)."""
        d, r = active.dispatch, active.dispatch.request
        if active.first_token_at is None:
            active.first_token_at = time.monotonic()
            self.metrics.ttft.labels(self.config.pool, r.klass).observe(active.first_token_at - active.started)
        if not self._outbox.extend(r.request_id, d.attempt, out.text, out.token_ids):
            self._outbox.emit(r.reply_to, Delta(r.request_id, d.attempt, self._seq(active), out.text,
                                                list(out.token_ids)))
        active.streamed = True
        active.tokens += len(out.token_ids) or 1
        if active.parts is not None:
            active.parts.append(out.text)

    async def _escalate(self, active: _Active, score: float) -> None:
        """Low confidence and nothing released: re-send the request for the larger pool (a new
        JetStream message, stored before this one is acked), then ack this one. The client sees
        one uninterrupted answer, from the large pool."""
        d, r = active.dispatch, active.dispatch.request
        escalated = msgspec.structs.replace(r, escalated=True)
        try:
            await self._nc.jetstream().publish(
                self.s.req(r.klass, r.tenant), codec.encode(escalated),
                headers={MSG_ID_HEADER: f"{msg_id(r.tenant, r.request_id)}:esc"})
        except Exception as exc:   # not stored: serve it here after all, on the next attempt
            log.warning("escalating %s failed (%s); retrying it", r.request_id, exc)
            self._release(active, nak_with_delay(NAK_BACKOFF_S))
            return
        self.metrics.escalations.labels(self.config.pool).inc()
        log.info("escalated %s to %s (mean logprob %.2f)", r.request_id, d.escalate_to, score)
        self._record_usage(active, "escalated", r.estimated_prompt_tokens(), 0, self.engine.model)
        self._release(active, ACK)

    def _fail(self, active: _Active, code: ErrorCode, message: str) -> None:
        d = active.dispatch
        self._outbox.emit(d.request.reply_to, StreamError(d.request.request_id, d.attempt,
                                                   self._seq(active), code.value, message))
        self.metrics.finished.labels(self.config.pool, code.value).inc()
        self._release(active, TERM)
        # Metered too: tokens already generated cost money, and the brokers free its quota slot.
        self._record_usage(active, code.value, d.request.estimated_prompt_tokens(), active.tokens,
                           self.engine.model)

    def _dead_letter(self, active: _Active, reason: str, detail: str) -> None:
        """The last attempt failed: park the request on LW_DLQ with its reason, then end it."""
        r = active.dispatch.request
        headers = {"Laneway-Reason": reason, "Laneway-Detail": detail[:512],
                   "Laneway-Attempt": str(active.dispatch.attempt), "Laneway-Worker": self.id}
        self._outbox.dead_letter(self.s.dlq(r.klass, r.tenant), codec.encode(r), headers)
        self._fail(active, ErrorCode.engine_error,
                   f"the request failed on all {active.dispatch.attempt} attempts: {detail}")

    def _release(self, active: _Active, ack: bytes) -> None:
        request = active.dispatch.request
        if active.tokens:   # counted once per request: a labelled inc per token costs real CPU
            self.metrics.tokens.labels(self.config.pool, request.klass).inc(active.tokens)
        self._active.pop((request.tenant, request.request_id), None)
        self._outbox.after(active.dispatch.ack_subject, ack)
        self._room.set()

    def _record_usage(self, active: _Active, finish_reason: str, prompt_tokens: int,
                      completion_tokens: int, served_model: str) -> None:
        r = active.dispatch.request
        now = time.monotonic()
        usage = Usage(
            request_id=r.request_id, tenant=r.tenant, klass=r.klass, model=r.model,
            served_model=served_model, pool=self.config.pool, worker_id=self.id,
            prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
            finish_reason=finish_reason, queued_s=active.dispatch.queued_s,
            ttft_s=None if active.first_token_at is None else active.first_token_at - active.started,
            total_s=now - active.started, finished_at=time.time(),
            cost_usd=self.meter.cost(self.config.pool, prompt_tokens, completion_tokens),
        )
        # Core publish into LW_USAGE: stored by JetStream without a round trip per request.
        self._outbox.after(self.s.usage(r.tenant), codec.encode(usage))

    def _store_answer(self, active: _Active, finished: Finished) -> None:
        """Cache a complete deterministic answer, in the background (never on the frame path)."""
        d = active.dispatch
        if active.parts is None or active.cancelled or finished.model != d.cache_model:
            return
        answer = CachedResponse("".join(active.parts), finished.usage.prompt_tokens,
                                finished.usage.completion_tokens, finished.finish_reason, finished.model)
        task = asyncio.create_task(self._cache_store(d.cache_key, answer))
        self._stores.add(task)
        task.add_done_callback(self._stores.discard)

    async def _cache_store(self, key: str, answer: CachedResponse) -> bool:
        if self._cache is None:   # the broker that set cache_key created the bucket
            self._cache = ResponseCache(await self._nc.jetstream().key_value(self.s.bucket("cache")))
        return await self._cache.store(key, answer)

    def _put_routing(self, key: str, value: bytes) -> None:
        if key == PRICES_KEY:
            self.meter = Meter(parse_price_book(value))

    # -- frames ---------------------------------------------------------------------------
    @staticmethod
    def _seq(active: _Active) -> int:
        seq = active.seq
        active.seq += 1
        return seq

    # -- cancels, liveness ----------------------------------------------------------------
    async def _on_cancel(self, msg: Msg) -> None:
        try:
            cancel = codec.decode_cancel(msg.data)
        except codec.DecodeError:
            return
        active = self._active.get((cancel.tenant, cancel.request_id))
        if active is not None and not active.cancelled:
            active.cancelled = True
            await self.engine.abort(cancel.request_id)

    async def _on_ping(self, msg: Msg) -> None:
        await self._heartbeat()

    async def _in_progress(self) -> None:
        while True:
            await asyncio.sleep(self.config.in_progress_s)
            for active in list(self._active.values()):
                self._outbox.after(active.dispatch.ack_subject, WPI)

    async def _heartbeat(self) -> None:
        breaker = getattr(self.engine, "breaker", None)   # the openai engine's circuit breaker
        if breaker is not None:
            self.metrics.breaker_state.labels(self.config.pool).set(int(breaker.state))
        cap = self.engine.capacity() if self.ready else None
        beat = Heartbeat(
            worker_id=self.id, pool=self.config.pool, engine=self.engine.name,
            model=self.engine.model, ready=self.ready and not self._stopping.is_set(),
            total_slots=cap.total_slots if cap else 0, free_slots=cap.free_slots if cap else 0,
            token_budget=cap.token_budget if cap else 0, interval_s=self.config.heartbeat_s,
            stopping=self._stopping.is_set(),
        )
        await self._nc.publish(self.s.worker_event(self.id), codec.encode(beat))

    async def _heartbeats(self) -> None:
        while True:
            try:
                await self._heartbeat()
            except Exception as exc:  # disconnected: next beat retries
                log.debug("heartbeat failed: %s", exc)
            await asyncio.sleep(self.config.heartbeat_s)
