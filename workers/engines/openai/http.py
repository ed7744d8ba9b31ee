"""One attempt's HTTP I/O against an OpenAI-compatible upstream, for the `openai` engine.

`UpstreamHTTP.attempt` sends one streamed request and yields its deltas as lists of `EngineOutput`s,
one list per read (a read usually holds many events: one generator step per read, not per token);
`UpstreamHTTP.attempt_embedding` sends one `/embeddings` request and reads the whole answer into
the `Call`. Either raises a classified `UpstreamError` (status, timeout phase, retryable) and
leaves retrying, the breaker and the final output to the engine (`openai_engine.py`).

`Call` is one request's state shared by the engine and its attempts; `abortable` awaits anything
(a send, a read, a backoff) in a task that the engine's `abort()` can cancel, raising `Aborted`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp
import msgspec

from workers.engine import EngineOutput
from workers.engines import openai_wire as wire
from workers.engines.openai.config import OpenAIUpstreamConfig
from workers.engines.openai.errors import UpstreamError, UpstreamRejected, UpstreamTimeout
from workers.engines.openai.sse import EventSplitter, EventTooLarge

_ERROR_BODY_LIMIT = 4096  # bytes of an error response read for its message
_EMBEDDING_BODY_LIMIT = 256 << 20  # an embedding answer: 2048 inputs x 3072 dims as base64 is ~34 MB
_T = TypeVar("_T")


class Aborted(Exception):
    """`abort()` was called for this request; ends the stream with finish_reason "abort"."""


@dataclass(slots=True, eq=False)
class Call:
    """One request's state, shared by the engine and its attempts."""

    request_id: str
    klass: str
    aborted: bool = False
    choices: int = 1
    logprobs: bool = False  # the client asked for them
    confidence: bool = False  # the cascade asked for sampled logprobs
    streamed: int = 0  # outputs yielded, over all attempts
    finishes: dict[int, str] = field(default_factory=dict)  # choice index → upstream finish reason
    usage: wire.Usage | None = None
    embedding: int = 0  # an embedding request: its number of inputs
    vectors: list[bytes] = field(default_factory=list)  # its answer, once read
    pending: asyncio.Future[Any] | None = None  # send or backoff in progress
    response: aiohttp.ClientResponse | None = None  # stream being read


async def abortable(call: Call, aw: Awaitable[_T], deadline: float) -> _T:
    """Await `aw` until `deadline` in a task that `abort()` can cancel; TimeoutError when late."""
    if call.aborted:
        if asyncio.iscoroutine(aw):
            aw.close()
        raise Aborted
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
        raise Aborted
    if not task.done():
        raise TimeoutError
    return task.result()


class UpstreamHTTP:
    """The upstream's session and headers, and the I/O of one attempt over them."""

    def __init__(self, config: OpenAIUpstreamConfig, session: aiohttp.ClientSession, headers: dict[str, str]) -> None:
        self.config = config
        self.session = session
        self.headers = headers

    async def attempt(
        self, call: Call, url: str, body: bytes, deadline: float
    ) -> AsyncGenerator[list[EngineOutput], None]:
        """One HTTP request: yields the deltas of each read (the consumer counts `call.streamed`
        as it releases them), records finish reasons and usage on `call`."""
        loop = asyncio.get_running_loop()
        call.finishes, call.usage = {}, None
        first_deadline = min(deadline, loop.time() + self.config.first_token_timeout_s)
        first_phase = "total" if first_deadline == deadline else "first_token"
        resp = await self._open(call, url, body, first_deadline, first_phase)
        events = EventSplitter()
        try:
            while True:
                if call.aborted:  # abort() ran while outputs were out
                    raise Aborted
                if call.streamed:
                    read_deadline = min(deadline, loop.time() + self.config.idle_timeout_s)
                    phase = "total" if read_deadline == deadline else "idle"
                else:
                    read_deadline, phase = first_deadline, first_phase
                ready = await self._next_events(call, resp, events, read_deadline, phase)
                if not ready:  # EOF: fine after a finish_reason, else cut short
                    if not call.finishes:
                        raise UpstreamError(
                            call.request_id,
                            "upstream closed the stream before it finished",
                            retryable=not call.streamed,
                        )
                    break
                outputs, done, error = self._outputs(call, ready)
                if outputs:
                    yield outputs
                    if call.aborted:
                        raise Aborted
                if error is not None:  # after the outputs before it went out
                    raise UpstreamError(call.request_id, error, retryable=not call.streamed)
                if done:
                    break
            resp.release()  # a clean end: the connection may be reused
        finally:
            call.response = None
            resp.close()

    async def attempt_embedding(
        self, call: Call, url: str, body: bytes, deadline: float
    ) -> AsyncGenerator[list[EngineOutput], None]:
        """One `/embeddings` request: reads the whole answer into `call` and yields nothing (the
        engine's final output carries the vectors), so every failure happens before a yield."""
        loop = asyncio.get_running_loop()
        call.usage, call.vectors = None, []
        answer_deadline = min(deadline, loop.time() + self.config.first_token_timeout_s)
        phase = "total" if answer_deadline == deadline else "first_token"
        resp = await self._open(call, url, body, answer_deadline, phase, json_answer=True)
        try:
            raw = await self._read_all(call, resp, answer_deadline, phase)
            try:
                answer = wire.decode_embeddings(raw)
                call.vectors = wire.embedding_vectors(answer, call.embedding)
            except (msgspec.DecodeError, wire.BadEmbeddings) as exc:
                raise UpstreamError(
                    call.request_id, f"upstream sent a malformed embedding answer: {exc}", retryable=True
                ) from None
            if answer.usage is not None:
                call.usage = wire.Usage(prompt_tokens=answer.usage.prompt_tokens)
            resp.release()
        finally:
            call.response = None
            resp.close()
        return
        yield  # an async generator, like `attempt`

    async def _read_all(self, call: Call, resp: aiohttp.ClientResponse, deadline: float, phase: str) -> bytes:
        async def read() -> bytes:
            parts, size = [], 0
            while part := await resp.content.readany():
                size += len(part)
                if size > _EMBEDDING_BODY_LIMIT:
                    raise UpstreamError(call.request_id, "upstream embedding answer is too large")
                parts.append(part)
            return b"".join(parts)

        try:
            return await abortable(call, read(), deadline)
        except TimeoutError:
            raise UpstreamTimeout(call.request_id, phase, retryable=phase != "total") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamError(
                call.request_id, f"upstream answer broken: {type(exc).__name__}", retryable=True
            ) from exc

    def _outputs(self, call: Call, payloads: list[bytes]) -> tuple[list[EngineOutput], bool, str | None]:
        """The outputs of these events in order: one per choice that carries anything (finish
        reasons are kept for the last one); whether `[DONE]` ended them; and the error that cut
        them short, if one did."""
        out: list[EngineOutput] = []
        decode, choice_output = wire.decode_chunk, wire.choice_output
        logprobs, confidence, finishes = call.logprobs, call.confidence, call.finishes
        for payload in payloads:
            if payload == b"[DONE]":
                return out, True, None
            try:
                chunk = decode(payload)
            except msgspec.DecodeError:
                return out, False, "upstream sent an undecodable chunk"
            if chunk.error is not None:
                return out, False, f"upstream error: {chunk.error.message[:300]}"
            if chunk.usage is not None:
                call.usage = chunk.usage
            for choice in chunk.choices:
                if choice.finish_reason:
                    finishes[choice.index] = choice.finish_reason
                output = choice_output(choice, logprobs=logprobs, confidence=confidence)
                if output is not None:
                    out.append(output)
        return out, False, None

    async def _next_events(
        self, call: Call, resp: aiohttp.ClientResponse, events: EventSplitter, deadline: float, phase: str
    ) -> list[bytes]:
        """The payloads of the next event(s) read; [] at the end of the stream."""
        retryable = not call.streamed  # nothing released yet: another attempt may
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    data = await resp.content.readany()
            except TimeoutError:
                raise UpstreamTimeout(call.request_id, phase, retryable=retryable and phase != "total") from None
            except (aiohttp.ClientError, OSError) as exc:
                if call.aborted:
                    raise Aborted from None
                raise UpstreamError(
                    call.request_id, f"upstream stream broken: {type(exc).__name__}", retryable=retryable
                ) from exc
            if call.aborted:
                raise Aborted
            if not data:
                tail = events.end()
                return [tail] if tail is not None else []
            try:
                payloads = events.feed(data)
            except EventTooLarge as exc:
                raise UpstreamError(call.request_id, f"upstream sent {exc}", retryable=retryable) from None
            if payloads:
                return payloads

    async def _open(
        self, call: Call, url: str, body: bytes, deadline: float, phase: str, *, json_answer: bool = False
    ) -> aiohttp.ClientResponse:
        """Send the request and return a 200 event stream (a 200 JSON answer when `json_answer`),
        or raise a classified error."""
        rid = call.request_id
        session, headers = self.session, {**self.headers, "X-Request-Id": rid}
        expected = "application/json" if json_answer else "text/event-stream"
        headers["Accept"] = expected

        async def post() -> aiohttp.ClientResponse:
            return await session.post(url, data=body, headers=headers, allow_redirects=False)

        try:
            resp = await abortable(call, post(), deadline)
        except TimeoutError as exc:
            if isinstance(exc, aiohttp.ServerTimeoutError):
                phase = "connect"
            raise UpstreamTimeout(rid, phase, retryable=phase != "total") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamError(rid, f"upstream connection failed: {type(exc).__name__}", retryable=True) from exc
        call.response = resp
        if resp.status == 200 and resp.content_type == expected:
            return resp
        try:
            status = resp.status
            if status == 200:
                raise UpstreamError(rid, f"upstream answered {resp.content_type}, not {expected}")
            if status == 429 or status >= 500:
                raise UpstreamError(
                    rid,
                    f"upstream returned HTTP {status}",
                    status=status,
                    retryable=True,
                    retry_after_s=_retry_after(resp),
                )
            if status in (400, 413, 422):
                param, message = await self._error_detail(call, resp, deadline)
                raise UpstreamRejected(rid, status, param, message)
            # 401/403/404...: our configuration, not the upstream's health. The body is not
            # echoed: an auth error may quote the key.
            raise UpstreamError(rid, f"upstream returned HTTP {status}", status=status)
        finally:
            call.response = None
            resp.close()

    async def _error_detail(self, call: Call, resp: aiohttp.ClientResponse, deadline: float) -> tuple[str, str]:
        async def read_limited() -> bytes:
            raw = b""
            while len(raw) < _ERROR_BODY_LIMIT and (part := await resp.content.read(_ERROR_BODY_LIMIT - len(raw))):
                raw += part
            return raw

        try:
            env = wire.decode_error(await abortable(call, read_limited(), deadline))
        except (TimeoutError, aiohttp.ClientError, msgspec.DecodeError):
            return "", f"upstream rejected the request (HTTP {resp.status})"
        body = env.error or wire.ErrorBody(message=env.message or "", param=env.param)
        message = body.message[:300] or f"upstream rejected the request (HTTP {resp.status})"
        return body.param or "", message


def _retry_after(resp: aiohttp.ClientResponse) -> float | None:
    try:
        return float(resp.headers.get("Retry-After", ""))
    except ValueError:
        return None  # absent, or an HTTP date: fall back to our own backoff


def _consume(task: asyncio.Future[Any]) -> None:
    # Retrieve the outcome of a task we may have stopped waiting for, so asyncio does not log it.
    if not task.cancelled():
        task.exception()
