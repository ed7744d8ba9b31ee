"""The `openai` engine: a pool backed by any OpenAI-compatible server (a hosted API as the
fallback pool, or an existing vLLM server), streamed over aiohttp, behind a circuit breaker.

It passes the client's OpenAI body through: the typed fields and the verbatim `extra` ones go
upstream with only `model` (the configured one) and streaming-with-usage forced, and every choice's
text, tool-call pieces, logprobs, refusal, reasoning and finish reason come back as received.

Rules this module keeps:
- The upstream key comes from an environment variable named in config, never from a request.
- Retries happen only before the first token is yielded: released tokens cannot be taken back.
- 429, 5xx, resets and timeouts count against the breaker; other 4xx are the request's fault.
- While the breaker is open `generate` fails at once and `capacity()` has no free slots, so the
  worker stops pulling work it could only fail.

Embeddings (`EmbeddingBody`) go to `{base_url}/embeddings`, not streamed, with base64 vectors
asked for and decoded straight to float32 bytes. The rules above hold: nothing is yielded until
the whole answer is in, so any retryable failure may be retried; the whole answer must arrive
within `first_token_timeout_s` per attempt (an embedding's answer is its first token), and
within `total_timeout_s` over all attempts; usage.prompt_tokens is the upstream's.

The wire structs are in `openai_wire.py`, the errors in `openai_errors.py`, the SSE framing in
`sse.py`, one attempt's HTTP I/O (send, read the stream or the whole answer, classify failures,
abortable awaits) in `openai_http.py`; this module is the engine: lifecycle, capacity, aborts,
retries over the total deadline, the breaker, request bodies and the final output.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable

import aiohttp
import msgspec
import yarl

from core import env
from schemas.openai import EmbeddingBody
from workers.engine import (
    Capacity,
    Engine,
    EngineError,
    EngineOutput,
    EngineRequest,
    RequestKey,
    UnsupportedRequest,
)
from workers.engines import openai_wire as wire
from workers.engines.openai.circuit import BreakerState, CircuitBreaker, Permit, StateHook
from workers.engines.openai.config import OpenAIUpstreamConfig
from workers.engines.openai.errors import CircuitOpen, UpstreamError, UpstreamRejected, UpstreamTimeout
from workers.engines.openai.http import Aborted, Call, UpstreamHTTP, abortable

__all__ = [
    "CircuitOpen",
    "OpenAIUpstreamConfig",
    "OpenAIUpstreamEngine",
    "UpstreamError",
    "UpstreamRejected",
    "UpstreamTimeout",
]

log = logging.getLogger(__name__)


# -- the engine ----------------------------------------------------------------------------------


class OpenAIUpstreamEngine(Engine):
    name = "openai"
    supports_logprobs = True  # chat `logprobs: true` / completions `logprobs: 0` upstream
    shared_prefix_cache = True  # one API key for every tenant: hits metered, not told

    def __init__(
        self,
        config: OpenAIUpstreamConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_breaker_change: StateHook | None = None,
    ) -> None:
        self.config = config
        self.model = config.model
        self._hook = on_breaker_change
        self.breaker = CircuitBreaker(config.breaker, clock=clock, on_change=self._breaker_changed)
        self._http: UpstreamHTTP | None = None
        self._inflight: dict[RequestKey, Call] = {}
        self._running: Counter[str] = Counter()

    async def start(self) -> None:
        if self._http is not None:
            return
        key = env.named(self.config.api_key_env)
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        else:
            log.warning("$%s is not set: calling the upstream without an API key", self.config.api_key_env)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.config.connect_timeout_s)
        connector = aiohttp.TCPConnector(limit=self.config.max_concurrency)
        session = aiohttp.ClientSession(timeout=timeout, connector=connector)
        self._http = UpstreamHTTP(self.config, session, headers)

    async def cleanup(self) -> None:
        for key in list(self._inflight):
            await self.abort(key)
        if self._http is not None:
            http, self._http = self._http, None
            await http.session.close()

    def capacity(self) -> Capacity:
        free = max(0, self.config.max_concurrency - len(self._inflight))
        allowance = self.breaker.allowance()
        if allowance is not None:
            free = min(free, allowance)
        return Capacity(
            total_slots=self.config.max_concurrency,
            free_slots=free,
            token_budget=self.config.token_budget if free else 0,
            running=dict(self._running),
        )

    async def abort(self, key: RequestKey) -> None:
        call = self._inflight.get(key)
        if call is None or call.aborted:
            return
        call.aborted = True
        if call.pending is not None:
            call.pending.cancel()
        if call.response is not None:
            call.response.close()  # wakes a pending read and drops the connection

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        rid, key = request.request_id, request.key
        http = self._http
        if http is None:
            raise EngineError(rid, "engine not started")
        if key in self._inflight:
            raise EngineError(rid, "request is already running on this engine")
        if request.adapter:
            # Never the base model in its place: the client asked for the adapter's answers.
            raise UnsupportedRequest(
                rid,
                "model",
                f"the model {request.body.model!r} is a LoRA adapter, and "
                "this pool's engine (a hosted upstream) serves none",
            )
        url, body = self._build(request)
        embedding = isinstance(request.body, EmbeddingBody)
        # Upstream it goes by its bare id (X-Request-Id, for the upstream's logs): the tenant's
        # name is not the hosted provider's to know.
        call = self._inflight[key] = Call(
            rid,
            request.klass,
            choices=request.body.choices,
            logprobs=wire.client_wants_logprobs(request.body),
            confidence=request.confidence and not embedding,
            embedding=len(request.body.inputs) if isinstance(request.body, EmbeddingBody) else 0,
        )
        attempt_fn = http.attempt_embedding if embedding else http.attempt
        self._running[request.klass] += 1
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.total_timeout_s
        try:
            for attempt in itertools.count():
                permit = self.breaker.acquire()
                if permit is None:
                    raise CircuitOpen(rid, self.breaker.retry_after())
                verdict: bool | None = None  # None: says nothing about the upstream
                try:
                    async with contextlib.aclosing(attempt_fn(call, url, body, deadline)) as reads:
                        async for outputs in reads:
                            for output in outputs:
                                if call.aborted:  # abort() ran while an output was out
                                    raise Aborted
                                call.streamed += 1
                                yield output
                    verdict = True
                    break
                except UpstreamError as err:
                    verdict = False if err.counts_against_breaker else None
                    err.partial = call.streamed > 0
                    if call.streamed or not err.retryable or attempt >= self.config.retries:
                        raise
                    delay = self._backoff(attempt, err.retry_after_s)
                    if delay > self.config.backoff_max_s or loop.time() + delay >= deadline:
                        raise  # a long Retry-After: fail now, not hold the slot
                    log.info(
                        "upstream attempt %d for %s failed (%s); retrying in %.2fs",
                        attempt + 1,
                        rid,
                        err.message,
                        delay,
                    )
                finally:
                    self._judge(permit, verdict)
                await abortable(call, asyncio.sleep(delay), loop.time() + delay + 1.0)
            yield self._final(request, call, aborted=False)
        except Aborted:
            yield self._final(request, call, aborted=True)
        finally:
            del self._inflight[key]
            self._running[request.klass] -= 1
            if not self._running[request.klass]:
                del self._running[request.klass]

    # -- helpers ---------------------------------------------------------------------------------

    def _build(self, request: EngineRequest) -> tuple[str, bytes]:
        body = request.body
        try:
            extra = wire.forwarded_extra(request, self.config.allow_fields)  # UnsupportedRequest naming a field
            if isinstance(body, EmbeddingBody):
                data = wire.encode_embedding_body(body, self.config.model, extra)
            else:
                data = wire.encode_body(body, self.config.model, extra, sampled_logprobs=request.confidence)
        except (ValueError, msgspec.DecodeError) as exc:
            raise EngineError(request.request_id, f"malformed extra fields: {exc}") from None
        return self.config.base_url.rstrip("/") + wire.path_of(body), data

    def _final(self, request: EngineRequest, call: Call, *, aborted: bool) -> EngineOutput:
        usage = None if aborted else call.usage
        if call.embedding:
            body = request.body
            assert isinstance(body, EmbeddingBody)
            prompt_tokens = (
                usage.prompt_tokens
                if usage is not None
                else max(1, sum(len(t) for t in body.texts()) // 4 + body.token_count())
            )
            return EngineOutput(
                text="",
                finish_reason="abort" if aborted else "stop",
                prompt_tokens=prompt_tokens,
                vectors=[] if aborted else call.vectors,
            )
        cached_tokens = 0
        if usage is not None:
            prompt_tokens, completion_tokens = usage.prompt_tokens, usage.completion_tokens
            cached_tokens = usage.cached_tokens  # the upstream's prefix-cache hits, relayed
        else:
            # No usage chunk (an aborted stream, or an upstream that ignores include_usage):
            # count streamed deltas (about one token each) and estimate the prompt.
            chars = sum(len(t) for t in request.body.texts())
            prompt_tokens, completion_tokens = max(1, chars // 4), call.streamed
        reasons = ["abort" if aborted else wire.finish_reason(call.finishes.get(i)) for i in range(call.choices)]
        return EngineOutput(
            text="",
            finish_reason=reasons[0],
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_tokens=cached_tokens,
            finish_reasons=reasons if call.choices > 1 else [],
        )

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        """Jittered exponential delay, or the upstream's Retry-After when that is longer."""
        delay = min(self.config.backoff_max_s, self.config.backoff_s * 2**attempt) * random.uniform(0.5, 1.0)
        return max(delay, retry_after or 0.0)

    def _judge(self, permit: Permit, verdict: bool | None) -> None:
        if verdict is True:
            self.breaker.success(permit)
        elif verdict is False:
            self.breaker.failure(permit)
        else:
            self.breaker.release(permit)

    def _breaker_changed(self, old: BreakerState, new: BreakerState) -> None:
        # The origin only: a base URL may carry credentials in its userinfo or query.
        origin = yarl.URL(self.config.base_url).origin()
        log.warning("upstream %s circuit breaker: %s -> %s", origin, old.name, new.name)
        if self._hook is not None:
            self._hook(old, new)
