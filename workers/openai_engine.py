"""The `openai` engine: a pool backed by any OpenAI-compatible server (a hosted API as the
fallback pool, or an existing vLLM server), streamed over aiohttp, behind a circuit breaker.

Rules this module keeps:
- The upstream key comes from an environment variable named in config, never from a request.
- Retries happen only before the first token is yielded: released tokens cannot be taken back.
- 429, 5xx, resets and timeouts count against the breaker; other 4xx are the request's fault.
- While the breaker is open `generate` fails at once and `capacity()` has no free slots, so the
  worker stops pulling work it could only fail.

The wire structs are in `openai_wire.py`, the errors in `openai_errors.py`, the SSE framing in
`sse.py`; this module is the engine: HTTP, retries, timeouts, aborts and the breaker.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
import msgspec
import yarl

from workers import openai_wire as wire
from workers.openai_config import OpenAIUpstreamConfig
from workers.openai_errors import CircuitOpen, UpstreamError, UpstreamRejected, UpstreamTimeout
from workers.sse import DataEvents
from workers.circuit import (
    BreakerState,
    CircuitBreaker,
    Permit,
    StateHook,
)
from workers.engine import (
    Capacity,
    Engine,
    EngineError,
    EngineOutput,
    EngineRequest,
)

log = logging.getLogger(__name__)

_ERROR_BODY_LIMIT = 4096       # bytes of an error response read for its message
_T = TypeVar("_T")


class _Aborted(Exception):
    """`abort()` was called for this request; ends the stream with finish_reason "abort"."""


# -- the engine ----------------------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class _Call:
    request_id: str
    klass: str
    aborted: bool = False
    streamed: int = 0                                 # text deltas yielded, over all attempts
    finish: str | None = None
    usage: wire.Usage | None = None
    pending: asyncio.Future[Any] | None = None        # send or backoff in progress
    response: aiohttp.ClientResponse | None = None    # stream being read


class OpenAIUpstreamEngine(Engine):
    name = "openai"

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
        self._session: aiohttp.ClientSession | None = None
        self._headers: dict[str, str] = {}
        self._inflight: dict[str, _Call] = {}
        self._running: Counter[str] = Counter()

    async def start(self) -> None:
        if self._session is not None:
            return
        key = os.environ.get(self.config.api_key_env)
        self._headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if key:
            self._headers["Authorization"] = f"Bearer {key}"
        else:
            log.warning("$%s is not set: calling the upstream without an API key", self.config.api_key_env)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.config.connect_timeout_s)
        connector = aiohttp.TCPConnector(limit=self.config.max_concurrency)
        self._session = aiohttp.ClientSession(timeout=timeout, connector=connector)

    async def cleanup(self) -> None:
        for request_id in list(self._inflight):
            await self.abort(request_id)
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

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

    async def abort(self, request_id: str) -> None:
        call = self._inflight.get(request_id)
        if call is None or call.aborted:
            return
        call.aborted = True
        if call.pending is not None:
            call.pending.cancel()
        if call.response is not None:
            call.response.close()            # wakes a pending read and drops the connection

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        rid = request.request_id
        if self._session is None:
            raise EngineError(rid, "engine not started")
        if rid in self._inflight:
            raise EngineError(rid, "request is already running on this engine")
        url, body = self._build(request)
        call = self._inflight[rid] = _Call(rid, request.klass)
        self._running[request.klass] += 1
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.total_timeout_s
        try:
            for attempt in itertools.count():
                permit = self.breaker.acquire()
                if permit is None:
                    raise CircuitOpen(rid, self.breaker.retry_after())
                verdict: bool | None = None          # None: says nothing about the upstream
                try:
                    async with contextlib.aclosing(self._attempt(call, url, body, deadline)) as texts:
                        async for text in texts:
                            yield EngineOutput(text=text)
                    verdict = True
                    break
                except UpstreamError as err:
                    verdict = False if err.counts_against_breaker else None
                    err.partial = call.streamed > 0
                    if call.streamed or not err.retryable or attempt >= self.config.retries:
                        raise
                    delay = self._backoff(attempt, err.retry_after_s)
                    if delay > self.config.backoff_max_s or loop.time() + delay >= deadline:
                        raise                        # a long Retry-After: fail now, not hold the slot
                    log.info("upstream attempt %d for %s failed (%s); retrying in %.2fs",
                             attempt + 1, rid, err.message, delay)
                finally:
                    self._judge(permit, verdict)
                await self._abortable(call, asyncio.sleep(delay), loop.time() + delay + 1.0)
            yield self._final(request, call.finish or "stop", call.usage, call.streamed)
        except _Aborted:
            yield self._final(request, "abort", None, call.streamed)
        finally:
            del self._inflight[rid]
            self._running[request.klass] -= 1
            if not self._running[request.klass]:
                del self._running[request.klass]

    # -- one attempt's I/O -----------------------------------------------------------------------

    async def _attempt(self, call: _Call, url: str, body: bytes, deadline: float) -> AsyncIterator[str]:
        """One HTTP request: yields the text deltas, records finish and usage on `call`."""
        loop = asyncio.get_running_loop()
        call.finish, call.usage = None, None
        first_deadline = min(deadline, loop.time() + self.config.first_token_timeout_s)
        first_phase = "total" if first_deadline == deadline else "first_token"
        resp = await self._open(call, url, body, first_deadline, first_phase)
        try:
            while True:
                if call.streamed:
                    read_deadline = min(deadline, loop.time() + self.config.idle_timeout_s)
                    phase = "total" if read_deadline == deadline else "idle"
                else:
                    read_deadline, phase = first_deadline, first_phase
                chunk = await self._next_chunk(call, resp, read_deadline, phase)
                if chunk is wire.DONE:
                    break
                if chunk is None:                    # EOF: fine after a finish_reason, else cut short
                    if call.finish is None:
                        raise UpstreamError(call.request_id, "upstream closed the stream before it finished",
                                            retryable=not call.streamed)
                    break
                assert isinstance(chunk, wire.Chunk)
                if chunk.error is not None:
                    raise UpstreamError(call.request_id, f"upstream error: {chunk.error.message[:300]}",
                                        retryable=not call.streamed)
                call.usage = chunk.usage or call.usage
                for choice in chunk.choices[:1]:     # n=1: only choice 0 exists
                    text = choice.delta.content if choice.delta is not None else choice.text
                    if text:
                        call.streamed += 1
                        yield text
                    call.finish = choice.finish_reason or call.finish
            resp.release()                           # a clean end: the connection may be reused
        finally:
            call.response = None
            resp.close()

    async def _open(self, call: _Call, url: str, body: bytes, deadline: float, phase: str) -> aiohttp.ClientResponse:
        """Send the request and return a 200 event stream, or raise a classified error."""
        rid = call.request_id
        assert self._session is not None
        session, headers = self._session, {**self._headers, "X-Request-Id": rid}

        async def post() -> aiohttp.ClientResponse:
            return await session.post(url, data=body, headers=headers, allow_redirects=False)

        try:
            resp = await self._abortable(call, post(), deadline)
        except TimeoutError as exc:
            if isinstance(exc, aiohttp.ServerTimeoutError):
                phase = "connect"
            raise UpstreamTimeout(rid, phase, retryable=phase != "total") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamError(rid, f"upstream connection failed: {type(exc).__name__}", retryable=True) from exc
        call.response = resp
        if resp.status == 200 and resp.content_type == "text/event-stream":
            return resp
        try:
            status = resp.status
            if status == 200:
                raise UpstreamError(rid, f"upstream answered {resp.content_type}, not an event stream")
            if status == 429 or status >= 500:
                raise UpstreamError(rid, f"upstream returned HTTP {status}", status=status,
                                    retryable=True, retry_after_s=_retry_after(resp))
            if status in (400, 413, 422):
                param, message = await self._error_detail(call, resp, deadline)
                raise UpstreamRejected(rid, status, param, message)
            # 401/403/404...: our configuration, not the upstream's health. The body is not
            # echoed: an auth error may quote the key.
            raise UpstreamError(rid, f"upstream returned HTTP {status}", status=status)
        finally:
            call.response = None
            resp.close()

    async def _next_chunk(
        self, call: _Call, resp: aiohttp.ClientResponse, deadline: float, phase: str
    ) -> wire.Chunk | object | None:
        """The next SSE event's chunk; `wire.DONE` for `data: [DONE]`, None at end of stream."""
        retryable = not call.streamed                # nothing released yet: another attempt may
        events = DataEvents()
        payload = None
        while payload is None:
            try:
                async with asyncio.timeout_at(deadline):
                    line = await resp.content.readline()
            except TimeoutError:
                raise UpstreamTimeout(call.request_id, phase, retryable=retryable and phase != "total") from None
            except (aiohttp.ClientError, OSError) as exc:
                if call.aborted:
                    raise _Aborted from None
                raise UpstreamError(call.request_id, f"upstream stream broken: {type(exc).__name__}",
                                    retryable=retryable) from exc
            if call.aborted:
                raise _Aborted
            if not line:
                payload = events.end()
                break
            payload = events.feed(line)
        if payload is None:
            return None
        if payload == b"[DONE]":
            return wire.DONE
        try:
            return wire.decode_chunk(payload)
        except msgspec.DecodeError:
            raise UpstreamError(call.request_id, "upstream sent an undecodable chunk", retryable=retryable) from None

    async def _error_detail(self, call: _Call, resp: aiohttp.ClientResponse, deadline: float) -> tuple[str, str]:
        async def read_limited() -> bytes:
            raw = b""
            while len(raw) < _ERROR_BODY_LIMIT and (part := await resp.content.read(_ERROR_BODY_LIMIT - len(raw))):
                raw += part
            return raw

        try:
            env = wire.decode_error(await self._abortable(call, read_limited(), deadline))
        except (TimeoutError, aiohttp.ClientError, msgspec.DecodeError):
            return "", f"upstream rejected the request (HTTP {resp.status})"
        body = env.error or wire.ErrorBody(message=env.message or "", param=env.param)
        message = body.message[:300] or f"upstream rejected the request (HTTP {resp.status})"
        return body.param or "", message

    async def _abortable(self, call: _Call, aw: Awaitable[_T], deadline: float) -> _T:
        """Await `aw` until `deadline` in a task that `abort()` can cancel; TimeoutError when late."""
        if call.aborted:
            if asyncio.iscoroutine(aw):
                aw.close()
            raise _Aborted
        task = asyncio.ensure_future(aw)
        task.add_done_callback(_consume)
        call.pending = task
        try:
            await asyncio.wait((task,), timeout=max(0.0, deadline - asyncio.get_running_loop().time()))
        finally:
            call.pending = None
            if not task.done():
                task.cancel()
        if call.aborted:
            if task.done() and not task.cancelled() and task.exception() is None:
                result = task.result()
                if isinstance(result, aiohttp.ClientResponse):
                    result.close()
            raise _Aborted
        if not task.done():
            raise TimeoutError
        return task.result()

    # -- helpers ---------------------------------------------------------------------------------

    def _build(self, request: EngineRequest) -> tuple[str, bytes]:
        s = request.sampling
        body = wire.Body(
            model=self.config.model,
            stream=True,
            stream_options=wire.StreamOptions(include_usage=True),
            messages=None if request.prompt is not None else request.messages,
            prompt=request.prompt,
            max_tokens=s.max_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            stop=s.stop or None,
            seed=s.seed,
        )
        path = "/completions" if request.prompt is not None else "/chat/completions"
        return self.config.base_url.rstrip("/") + path, wire.encode(body)

    def _final(self, request: EngineRequest, finish: str, usage: wire.Usage | None, streamed: int) -> EngineOutput:
        if usage is not None:
            prompt_tokens, completion_tokens = usage.prompt_tokens, usage.completion_tokens
        else:
            # No usage chunk (an aborted stream, or an upstream that ignores include_usage):
            # count streamed chunks (about one token each) and estimate the prompt.
            chars = len(request.prompt) if request.prompt is not None else sum(len(m.content) for m in request.messages)
            prompt_tokens, completion_tokens = max(1, chars // 4), streamed
        finish = finish if finish in ("stop", "length", "abort", "content_filter") else "stop"
        return EngineOutput(text="", finish_reason=finish, prompt_tokens=prompt_tokens,
                            completion_tokens=completion_tokens)

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


def _retry_after(resp: aiohttp.ClientResponse) -> float | None:
    try:
        return float(resp.headers.get("Retry-After", ""))
    except ValueError:
        return None              # absent, or an HTTP date: fall back to our own backoff


def _consume(task: asyncio.Future[Any]) -> None:
    # Retrieve the outcome of a task we may have stopped waiting for, so asyncio does not log it.
    if not task.cancelled():
        task.exception()
