"""One streamed chat completion over HTTP, timed: TTFT, inter-token gaps, end to end.

Parses SSE itself (no SDK) so the load generator spends as little CPU per token as possible.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import aiohttp
import orjson


@dataclass(slots=True)
class Result:
    ttft: float | None = None
    e2e: float = 0.0
    tokens: int = 0  # content chunks, then the usage chunk's count when asked for
    gaps: list[float] = field(default_factory=list)  # inter-token latencies
    status: int = 0
    error: str | None = None  # OpenAI error code or exception name
    started_at: float = 0.0  # time.time() when sent
    klass: str = ""
    tenant: str = ""
    flow: str = ""  # the load generator's traffic label
    completion_tokens: int | None = None  # from the usage chunk, when asked for
    cut: bool = False  # stopped by the load generator, not an error
    last_at: float = 0.0  # perf_counter of the latest content chunk
    request_id: str = ""  # Laneway's (x-request-id): usage records name it
    finish_reason: str | None = None  # the last choice chunk's, once the stream ends
    retry_after: float | None = None  # a refusal's Retry-After, seconds
    retries: int = 0  # attempts refused (429/503) before this one

    @property
    def ok(self) -> bool:
        return self.error is None and self.status == 200

    def content_arrived(self, sent_at: float) -> None:
        """A chunk with text arrived now; `sent_at` is the request's perf_counter start."""
        now = time.perf_counter()
        if self.ttft is None:
            self.ttft = now - sent_at
        else:
            self.gaps.append(now - self.last_at)
        self.last_at = now
        self.tokens += 1


async def stream_chat(
    session: aiohttp.ClientSession,
    url: str,
    api_key: str,
    body: dict,
    headers: dict[str, str] | None = None,
    result: Result | None = None,
    since: float | None = None,
) -> Result:
    """Fills `result` (a new one if None) as the stream goes, so a caller that cancels this
    coroutine still holds what arrived so far. `since`: the perf_counter the user started waiting
    (a retry's first attempt); TTFT and e2e count from it."""
    if result is None:
        result = Result()
    if since is None:
        result.started_at = time.time()
    h = {"Authorization": f"Bearer {api_key}", **(headers or {})}
    start = time.perf_counter() if since is None else since
    try:
        async with session.post(f"{url}/v1/chat/completions", json=body, headers=h) as resp:
            result.status = resp.status
            result.request_id = resp.headers.get("x-request-id", "")
            if resp.status != 200:
                result.retry_after = retry_after(resp.headers.get("Retry-After"))
                payload = await resp.json(content_type=None)
                result.error = (payload.get("error") or {}).get("code") or str(resp.status)
                if why := resp.headers.get("x-laneway-overload"):  # which limit refused it
                    result.error = f"{result.error}:{why}"
                return result
            async for raw in resp.content:
                if not raw.startswith(b"data: "):
                    continue
                data = raw[6:].strip()
                if data == b"[DONE]":
                    break
                chunk = orjson.loads(data)
                if "error" in chunk:
                    result.error = chunk["error"].get("code") or "error"
                    continue
                choices = chunk.get("choices")
                if not choices:
                    usage = chunk.get("usage")
                    if usage:
                        result.completion_tokens = usage.get("completion_tokens")
                    continue
                result.finish_reason = choices[0].get("finish_reason") or result.finish_reason
                delta = choices[0]["delta"]
                if delta.get("content") or delta.get("tool_calls"):
                    result.content_arrived(start)
        if result.completion_tokens is not None:
            result.tokens = result.completion_tokens  # a chunk may carry several tokens
    except (aiohttp.ClientError, TimeoutError) as exc:
        result.error = type(exc).__name__
    finally:
        result.e2e = time.perf_counter() - start
    return result


RETRIED = (408, 409, 429, 500, 502, 503, 504)  # what the OpenAI SDK retries


def sdk_backoff(attempt: int, retry_after_s: float | None, rng: random.Random) -> float:
    """The OpenAI SDK's wait before retry `attempt` (1, 2, ...): the server's Retry-After when it
    gives one (up to 60 s), else 0.5 s doubling to at most 8 s, less up to a quarter of jitter."""
    if retry_after_s is not None:
        return retry_after_s
    return min(0.5 * 2 ** (attempt - 1), 8.0) * (1 - 0.25 * rng.random())


def retry_after(value: str | None) -> float | None:
    """A Retry-After in seconds, as the OpenAI SDK takes it: a number in (0, 60], else None."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 < seconds <= 60 else None
