"""The worker loop: pull when there is room, feed the engine, one frame per step per inbox, ack.

- Pull: a `Credit` goes to `lw.pull.<pool>` only while the engine has a free slot
  (`workers/pulling.py`); the answer is a `Batch` of dispatches.
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
  So does the death of any of its own loops (the flusher, the pull loop): a worker that can no
  longer answer must not keep taking work, so it stops pulling and exits non-zero.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg

from broker.gate.cache import CachedResponse, ResponseCache
from broker.routing.cascade import CascadeSettings, StreamGate, Verdict
from broker.runtime.connect import connect
from schemas import codec
from schemas.errors import ErrorCode
from schemas.frames import Delta, Finished, StreamError, TokenUsage
from schemas.subjects import MSG_ID_HEADER, msg_id
from schemas.work import Dispatch, Heartbeat
from workers.engine import (
    Engine,
    EngineDead,
    EngineError,
    EngineOutput,
    EngineRequest,
    UnsupportedRequest,
)
from workers.config import WorkerConfig
from workers.metering import UsageRecorder
from workers.metrics import WorkerMetrics
from workers.outbox import Outbox
from workers.pulling import Puller

__all__ = ["Worker", "WorkerConfig"]

log = logging.getLogger("laneway.worker")

ACK, WPI, TERM = b"+ACK", b"+WPI", b"+TERM"
NAK_BACKOFF_S = 1.0     # a failed attempt is retried after this, not in a tight loop


def nak_with_delay(delay_s: float) -> bytes:
    return b'-NAK {"delay": %d}' % int(delay_s * 1e9)


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
        self._flusher: asyncio.Task[None] | None = None
        self._cache: ResponseCache | None = None
        self._stores: set[asyncio.Task[bool]] = set()
        self.usage = UsageRecorder(self._outbox, self.s, self.config.pool, self.id)

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        n = self.config.nats
        self._nc = await connect(n.url, f"laneway-worker-{self.id}", n.user, n.password)
        self._tasks.append(self._watched(self._heartbeats(), "heartbeats"))
        await self.usage.start(self._nc.jetstream())
        # Load and warm up before taking any work: the first request pays no cold start.
        await self.engine.start()
        await self.engine.warmup()
        self.ready = True
        await self._heartbeat()
        await self._nc.subscribe(self.s.cancel_all, cb=self._on_cancel)
        await self._nc.subscribe(self.s.worker_ping, cb=self._on_ping)
        puller = Puller(self._nc, self.s.pull(self.config.pool), self.config, self.engine, self.metrics,
                        self._active, self._on_batch, self._room, self._stopping)
        self._flusher = self._watched(self._outbox.run(self._nc), "flusher")
        self._tasks += [self._flusher, self._watched(self._in_progress(), "in-progress"),
                        self._watched(puller.run(), "pull-loop")]
        log.info("worker %s ready: pool=%s engine=%s model=%s", self.id, self.config.pool,
                 self.engine.name, self.engine.model)

    async def wait(self) -> int:
        """Until stopped or dead; the process exit code."""
        await self._stopping.wait()
        return 1 if self.dead is not None else 0

    def _watched(self, loop: Coroutine[object, object, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(loop, name=name)
        task.add_done_callback(self._loop_ended)
        return task

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        error = None if task.cancelled() else task.exception()
        if error is not None:
            log.error("worker loop %s died: %r; stopping without taking more work", task.get_name(), error,
                      exc_info=error)
            self._die(error)

    def _die(self, error: BaseException) -> None:
        """Stop pulling; `wait()` returns 1 and running requests are left unacked."""
        self.dead = error
        self._stopping.set()
        self._room.set()

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
        if self._nc is not None and not (self._flusher is not None and self._flusher.done()):
            await self._outbox.flush(self._nc)    # not if it already failed: it would again
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await self.engine.cleanup()
        if self._stores:
            await asyncio.wait(self._stores, timeout=5)
        await self.usage.stop()
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
    def _on_batch(self, dispatches: list[Dispatch]) -> None:
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
            self._die(exc)
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
        self._outbox.dead_letter(self.s.dlq(r.klass, r.tenant), codec.encode(r), headers,
                                 active.dispatch.ack_subject)
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
        self.usage.record(active.dispatch, active.started, active.first_token_at, finish_reason,
                          prompt_tokens, completion_tokens, served_model)

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
