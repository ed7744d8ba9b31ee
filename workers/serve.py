"""One request's life on a worker: start it, feed the engine, release its deltas (through the
cascade gate when it has one), then end it exactly once: finished, failed, dead-lettered,
handed back (`-NAK`) or escalated, with its ack, its metrics and its usage record.

- A request that fails before any token reached the client is `-NAK`ed so another attempt may
  succeed; after tokens were streamed it ends with an error entry instead. The last attempt's
  failure is parked on `LW_DLQ` with its reason.
- An `EngineDead` ends nothing: the worker stops without acking (`on_dead`), and JetStream
  redelivers its requests elsewhere. A `CancelledError` (worker shutdown) likewise.
- A redelivered request first asks the edge holding its stream how it goes on
  (workers/continuing.py): from its start, after the tokens the client already has (the engine
  prefills them: `EngineRequest.continued`), not at all (the stream is over), or dead-lettered
  (it lost too many workers). Its usage record counts the answer once, as if unbroken, plus
  `continued_tokens` (the extra prefill); `takes_over` voids a fenced worker's late record.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

from core.policy.cascade import StreamGate, Verdict
from core.policy.pii.errors import PolicyError
from core.tracing import tracer
from schemas import codec
from schemas.continuation import Continuation, Outcome
from schemas.errors import ErrorCode
from schemas.frames import Delta, Finished, StreamError, TokenUsage
from schemas.subjects import Subjects
from schemas.work import Dispatch
from workers.active import Active, carries, is_plain, nak_with_delay
from workers.cache import AnswerStore
from workers.cascade import Escalator, stream_gate
from workers.engine import (
    CannotContinue,
    Continued,
    Engine,
    EngineDead,
    EngineError,
    EngineOutput,
    EngineRequest,
    RequestKey,
    UnsupportedRequest,
)
from workers.metering import UsageRecorder
from workers.metrics import WorkerMetrics
from workers.outbox import Outbox
from workers.pii import OutputRedaction

log = logging.getLogger("laneway.worker")

ACK, WPI, TERM = b"+ACK", b"+WPI", b"+TERM"
NAK_BACKOFF_S = 1.0  # a failed attempt is retried after this, not in a tight loop


class Serving:
    """Serves the dispatches a worker took; `active` holds the ones running, by (tenant, id)."""

    def __init__(
        self,
        worker_id: str,
        pool: str,
        subjects: Subjects,
        engine: Engine,
        metrics: WorkerMetrics,
        outbox: Outbox,
        usage: UsageRecorder,
        escalator: Escalator,
        answers: AnswerStore,
        active: dict[RequestKey, Active],
        room: asyncio.Event,
        on_dead: Callable[[BaseException], None],
        prefilled: Callable[[], None] = lambda: None,
        ask_edge: Callable[[Dispatch], Awaitable[Continuation | None]] | None = None,
    ) -> None:
        self.id = worker_id
        self.pool = pool
        self.s = subjects
        self.engine = engine
        self.metrics = metrics
        self.outbox = outbox
        self.usage = usage
        self.escalator = escalator
        self.answers = answers
        self.active = active
        self._room = room
        self._prefilled = prefilled  # a prompt's prefill is done (the first token came)
        self._on_dead = on_dead
        self._ask_edge = ask_edge
        self._tracing = tracer()

    def start(self, dispatch: Dispatch) -> None:
        request = dispatch.request
        key = RequestKey(request.tenant, request.request_id)
        if not request.reply_to.startswith(self.s.tok_tenant_prefix(request.tenant)):
            # Defence in depth: never stream one tenant's tokens onto another's subjects.
            log.error("refused a dispatch whose reply subject is outside its tenant's inbox")
            self.outbox.after(dispatch.ack_subject, TERM)
            return
        if key in self.active:
            return  # a duplicate delivery of a request already running here
        active = Active(dispatch, time.monotonic(), parts=[] if dispatch.cache_key else None)
        self.active[key] = active
        try:
            active.redaction = OutputRedaction.for_dispatch(dispatch.output_pii)
        except PolicyError as exc:  # the gate encoded it: a broker of another version?
            self._fail(active, ErrorCode.internal_error, f"the tenant's PII policy is unreadable here ({exc})")
            return
        if time.time() >= request.deadline:
            self._fail(active, ErrorCode.deadline_exceeded, "the deadline passed before the request started")
            return
        active.task = asyncio.create_task(self._serve(active), name=f"serve-{request.request_id}")

    async def fence(self, key: RequestKey, attempt: int) -> bool:
        """The scheduler judged this worker lost and handed the request back (`schemas.work.Fence`):
        it goes on elsewhere, so it stops here without a frame, an ack or a usage record. A later
        delivery of it, here again, is not the one fenced."""
        active = self.active.get(key)
        if active is None or active.dispatch.attempt > attempt:
            return False
        del self.active[key]
        if active.task is not None:
            active.task.cancel()
        await self.engine.abort(key)
        self.metrics.fenced.labels(self.pool).inc()
        self._room.set()
        return True

    # -- the request's task ----------------------------------------------------------------
    async def _serve(self, active: Active) -> None:
        r = active.dispatch.request
        ask = self._ask_edge if active.dispatch.attempt > 1 else None  # a redelivery: how it goes on
        if ask is not None and not self._goes_on(active, await ask(active.dispatch)):
            return
        if active.cancelled:  # while it asked: the engine had nothing to abort yet
            self._release(active, ACK)
            self._record_usage(active, "cancelled", 0, active.delivered_before, self.engine.model)
            return
        # A continuation's first tokens were let through already: no verdict to wait for.
        gate = None if active.continued else stream_gate(active.dispatch, self.engine)
        try:
            finished = await self._generate(active, gate)
            if gate is not None and gate.verdict is Verdict.ESCALATE:
                await self._escalate(active, gate.score)
                return
        except TimeoutError:
            await self.engine.abort(RequestKey(r.tenant, r.request_id))
            self._fail(active, ErrorCode.deadline_exceeded, "the deadline passed during generation")
            return
        except UnsupportedRequest as exc:
            self._fail(active, ErrorCode.invalid_request, exc.message, exc.param)
            return
        except CannotContinue as exc:
            self._not_continued(active, exc.why)
            return
        except EngineError as exc:
            self._engine_failed(active, exc)
            return
        except EngineDead as exc:
            log.error("engine died: %s; stopping without acking running requests", exc)
            self._on_dead(exc)
            return
        except asyncio.CancelledError:
            raise  # worker shutdown: left unacked on purpose, JetStream redelivers it
        except Exception:
            # The request task's top: a bug, not a request problem. Logged, the stream ended clearly.
            log.exception("serving %s failed", r.request_id)
            self._fail(active, ErrorCode.internal_error, "internal error in the worker")
            return
        self._finish(active, finished)

    def _goes_on(self, active: Active, answer: Continuation | None) -> bool:
        """Act on the edge's answer to a redelivery; False: the request ended here."""
        if answer is None or answer.verdict is Outcome.FRESH:
            return True
        active.delivered_before = answer.delivered  # metered here: the lost workers never did
        if answer.verdict is Outcome.GONE:  # nobody waits for it: it never runs
            self._release(active, TERM)
            prompt = active.dispatch.request.estimated_prompt_tokens() if answer.delivered else 0
            self._record_usage(active, ErrorCode.worker_lost.value, prompt, answer.delivered, self.engine.model)
            return False
        if answer.verdict is Outcome.EXHAUSTED:
            self._dead_letter(active, "max_migrations", answer.reason)
            return False
        active.seq, active.streamed, active.parts = answer.next_seq, True, None
        d, r = active.dispatch, active.dispatch.request
        # Redacted frames carried the answer as the client saw it, not as the engine made it.
        if (
            why := "its output is redacted" if d.output_pii else self.engine.why_not_continued(r.body, r.extra)
        ) is not None:
            self._not_continued(active, why)
            return False
        active.continued = Continued(answer.token_ids, answer.text)
        return True

    def _not_continued(self, active: Active, why: str) -> None:
        lost = "the worker serving this request was lost after the stream started"
        self._fail(active, ErrorCode.worker_lost, f"{lost}, and it could not be continued on another ({why})")

    async def _generate(self, active: Active, gate: StreamGate[EngineOutput] | None) -> Finished | None:
        """Run the engine until it finishes (the `Finished` to send) or the cascade escalates."""
        d, r = active.dispatch, active.dispatch.request
        request = EngineRequest(
            r.request_id,
            r.body,
            r.extra,
            priority=d.priority,
            klass=r.klass,
            confidence=gate is not None,
            cache_salt=d.cache_salt,
            tenant=r.tenant,
            adapter=d.adapter,
            continued=active.continued,
        )
        replayed = len(active.continued.token_ids) if active.continued else 0
        finished: Finished | None = None
        async with asyncio.timeout(max(0.0, r.deadline - time.time())):
            async for out in self.engine.generate(request):
                if gate is not None and out.tool_calls:
                    self._release_deltas(active, gate.commit())
                if carries(out):
                    self._release_deltas(active, gate.push(out, out.confidence) if gate else [out])
                if out.finish_reason is not None:
                    if gate is not None:
                        self._release_deltas(active, gate.finish())
                    if active.redaction is not None:  # the text it held back, redacted
                        for held in active.redaction.flush():
                            self._emit(active, held)
                    reason = "cancelled" if active.cancelled else out.finish_reason
                    prompt = max(0, out.prompt_tokens - replayed)
                    told = 0 if self.engine.shared_prefix_cache else min(out.cached_tokens, prompt)
                    messages, fields = r.echoed()
                    # The client's usage is the unbroken answer's: the replayed tokens once, as output.
                    finished = Finished(
                        r.request_id,
                        d.attempt,
                        active.next_seq(),
                        reason,
                        TokenUsage(prompt, out.completion_tokens + replayed, told),
                        self.engine.model,
                        out.finish_reasons,
                        out.vectors,
                        messages=messages,
                        fields=fields,
                    )
                    active.cached_tokens = out.cached_tokens  # metered whatever the client is told
                if gate is not None and gate.verdict is Verdict.ESCALATE:
                    break  # leaving the iterator aborts the small request in the engine
        return finished

    def _release_deltas(self, active: Active, outs: Iterable[EngineOutput]) -> None:
        """Send engine deltas to the client (after the cascade let them through), redacted
        where the tenant's policy says so."""
        r = active.dispatch.request
        for out in outs:
            if active.first_token_at is None:
                active.first_token_at = time.monotonic()
                self.metrics.ttft.labels(self.pool, r.klass).observe(active.first_token_at - active.started)
                self._prefilled()
            active.tokens += len(out.token_ids) or 1
            if active.redaction is not None:
                out = active.redaction.apply(out)
                if not carries(out):
                    continue  # all of it held until it can be judged
            self._emit(active, out)

    def _emit(self, active: Active, out: EngineOutput) -> None:
        d, r = active.dispatch, active.dispatch.request
        plain = is_plain(out)
        if not (plain and self.outbox.extend((r.reply_to, r.request_id, d.attempt), out.text, out.token_ids)):
            delta = Delta(r.request_id, d.attempt, active.next_seq(), out.text, list(out.token_ids))
            if delta.seq == 0 and d.headers:
                delta.headers = d.headers
            if not plain:
                delta.choice, delta.tool_calls, delta.logprobs = out.index, out.tool_calls, out.logprobs
                delta.refusal, delta.reasoning = out.refusal, out.reasoning
            self.outbox.emit(r.reply_to, delta)
            if active.parts is not None:
                active.parts.append(delta)  # the outbox extends this same object
        active.streamed = True

    # -- the ends --------------------------------------------------------------------------
    def _finish(self, active: Active, finished: Finished | None) -> None:
        if finished is None:  # the engine ended the stream without saying why
            self._fail(active, ErrorCode.engine_error, "the engine ended the stream without finishing")
            return
        if active.seq == 1 and active.dispatch.headers:  # no delta went first: the answer's headers
            finished.headers = active.dispatch.headers
        self.outbox.emit(active.dispatch.request.reply_to, finished)
        self._release(active, ACK)
        self.metrics.finished.labels(self.pool, finished.finish_reason).inc()
        u = finished.usage
        self._record_usage(
            active, finished.finish_reason, u.prompt_tokens, u.completion_tokens, finished.model, active.cached_tokens
        )
        self.answers.keep(active.dispatch, active.parts, active.cancelled, finished)

    def _engine_failed(self, active: Active, exc: EngineError) -> None:
        d = active.dispatch
        if active.streamed:
            self._fail(active, ErrorCode.engine_error, exc.message)
        elif d.last_attempt:
            self._dead_letter(active, "engine_error", exc.message)
        else:
            # Nothing reached the client: another attempt (maybe on another worker) may work.
            self._release(active, nak_with_delay(NAK_BACKOFF_S * d.attempt))

    async def _escalate(self, active: Active, score: float) -> None:
        """Low confidence and nothing released: the escalated copy is stored before this one is
        acked, so the client sees one uninterrupted answer, from the large pool."""
        r = active.dispatch.request
        if not await self.escalator.hand_over(active.dispatch, score):
            self._release(active, nak_with_delay(NAK_BACKOFF_S))  # serve it here after all
            return
        self._record_usage(active, "escalated", r.estimated_prompt_tokens(), 0, self.engine.model)
        self._release(active, ACK)

    def _fail(self, active: Active, code: ErrorCode, message: str, param: str | None = None) -> None:
        d = active.dispatch
        self.outbox.emit(
            d.request.reply_to,
            StreamError(d.request.request_id, d.attempt, active.next_seq(), code.value, message, param),
        )
        self.metrics.finished.labels(self.pool, code.value).inc()
        self._release(active, TERM)
        # Metered too: tokens already generated cost money, and the brokers free its quota slot.
        # Those the client got from lost workers count too (`_finish` has them from the engine).
        tokens = active.tokens + active.delivered_before
        self._record_usage(active, code.value, d.request.estimated_prompt_tokens(), tokens, self.engine.model)

    def _dead_letter(self, active: Active, reason: str, detail: str) -> None:
        """The last attempt failed: park the request on LW_DLQ with its reason, then end it."""
        r = active.dispatch.request
        headers = {
            "Laneway-Reason": reason,
            "Laneway-Detail": detail[:512],
            "Laneway-Attempt": str(active.dispatch.attempt),
            "Laneway-Worker": self.id,
        }
        self.outbox.dead_letter(self.s.dlq(r.klass, r.tenant), codec.encode(r), headers, active.dispatch.ack_subject)
        if reason == "max_migrations":  # the edge told the client already, in these words
            self._fail(active, ErrorCode.worker_lost, detail)
            return
        self._fail(
            active, ErrorCode.engine_error, f"the request failed on all {active.dispatch.attempt} attempts: {detail}"
        )

    def _release(self, active: Active, ack: bytes) -> None:
        request = active.dispatch.request
        if active.tokens:  # counted once per request: a labelled inc per token costs real CPU
            self.metrics.tokens.labels(self.pool, request.klass).inc(active.tokens)
        self.active.pop(RequestKey(request.tenant, request.request_id), None)
        self.outbox.after(active.dispatch.ack_subject, ack)
        self._room.set()

    def _record_usage(
        self,
        active: Active,
        finish_reason: str,
        prompt_tokens: int,
        completion_tokens: int,
        served_model: str,
        cached_tokens: int = 0,
    ) -> None:
        self.usage.record(
            active.dispatch,
            active.started,
            active.first_token_at,
            finish_reason,
            prompt_tokens,
            completion_tokens,
            served_model,
            cached_tokens,
            len(active.continued.token_ids) if active.continued else 0,
            takes_over=active.delivered_before > 0,  # it counts what the lost workers streamed
        )
        klass = active.dispatch.request.klass
        self.metrics.prompt_tokens.labels(self.pool, klass).inc(prompt_tokens)
        if cached_tokens:
            self.metrics.cached_prompt_tokens.labels(self.pool, klass).inc(cached_tokens)
        if self._tracing.enabled:
            now, r = time.monotonic(), active.dispatch.request
            ttft = None if active.first_token_at is None else active.first_token_at - active.started
            self._tracing.record(
                "laneway.worker.generate",
                r.traceparent,
                time.time() - (now - active.started),
                request_id=r.request_id,
                tenant=r.tenant,
                pool=self.pool,
                worker=self.id,
                model=served_model,
                finish_reason=finish_reason,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                ttft_s=ttft,
                attempt=active.dispatch.attempt,
            )
