"""The Engine contract every worker engine honours (sim, vllm, openai).

Lifecycle: `start()` (load + warm up; raises if the engine cannot serve) → any number of
concurrent `generate()` streams → `abort()` for cancels and deadlines → `cleanup()` (idempotent).

An embedding request (`EmbeddingBody`) yields one output: `vectors` (one float32 little-endian
vector per input), `prompt_tokens` and finish_reason "stop".

Engines speak OpenAI: `EngineRequest.body` is the client's chat or completion body (typed) and
`extra` its other fields verbatim. An engine honours every field it is given or raises
`UnsupportedRequest` naming it before generating; it never drops one silently.

A request is known by its `RequestKey`, (tenant, request_id), in every engine table and in
`abort()`: request ids are the client's to choose, so two tenants may run the same one at once,
and a cancel from one must never reach the other's request.

`generate()` is an async iterator of `EngineOutput` deltas; the last one has `finish_reason`
set (with `finish_reasons` per choice when `n` > 1). Closing the iterator early (the consumer
is cancelled, or calls `aclose()`) must abort the request in the engine and free its slot, as
vLLM's `AsyncLLM.generate` does.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import NamedTuple

from schemas.frames import TokenLogprob, ToolCallDelta
from schemas.openai import Body, ChatBody, Message


class EngineError(Exception):
    """A request failed inside the engine; the engine itself is still healthy."""

    def __init__(self, request_id: str, message: str) -> None:
        super().__init__(f"{request_id}: {message}")
        self.request_id = request_id
        self.message = message


class UnsupportedRequest(EngineError):
    """The engine cannot serve this request as asked; `param` names the field (→ HTTP 400)."""

    def __init__(self, request_id: str, param: str, message: str) -> None:
        super().__init__(request_id, message)
        self.param = param


class EngineDead(Exception):
    """The engine cannot serve any more requests. The worker stops pulling and exits non-zero
    without acking, so JetStream redelivers its requests to other workers."""


class RequestKey(NamedTuple):
    """A request on a worker and in its engine. `abort()` takes this, not the `EngineRequest`: a
    cancel arrives as a subject naming (tenant, request_id), with no request in hand. A tuple, so
    the subject's parsed pair looks it up as it is."""

    tenant: str
    request_id: str

    def scoped(self) -> str:
        """One string for an engine that takes a single id (vLLM's). Unambiguous: neither part,
        a subject token, can hold a ':' (schemas/subjects.py)."""
        return f"{self.tenant}:{self.request_id}"


@dataclass(slots=True)
class EngineRequest:
    request_id: str
    body: Body                      # the client's OpenAI body, after the gate (redacted, routed)
    extra: bytes = b""              # its other top-level fields: a JSON object, verbatim
    priority: int = 0               # lower runs sooner (vLLM's convention)
    klass: str = ""
    confidence: bool = False        # report each sampled token's logprob (the cascade's signal)
    cache_salt: str = ""            # prefix-cache isolation: set by Laneway per tenant scope
    # The engine's own requests (warm-up, benchmarks) have none: "" is no tenant's name (a
    # subject token has 1-64 characters), so they never share a key with a tenant's.
    tenant: str = ""
    adapter: str = ""               # a LoRA adapter's path: serve `body.model` with it on the base model

    @property
    def key(self) -> RequestKey:
        return RequestKey(self.tenant, self.request_id)


@dataclass(slots=True)
class EngineOutput:
    text: str
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None   # set on the last output: "stop" | "length" | "tool_calls" | "abort"
    prompt_tokens: int = 0             # exact counts, reported with the last output
    completion_tokens: int = 0
    cached_tokens: int = 0             # of prompt_tokens, from the prefix cache (last output)
    index: int = 0                     # the choice this delta belongs to (n > 1)
    tool_calls: list[ToolCallDelta] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)   # when the client asked for them
    confidence: list[float] = field(default_factory=list)       # sampled logprobs, for the cascade
    refusal: str = ""
    reasoning: str = ""
    finish_reasons: list[str] = field(default_factory=list)     # per choice, on the last output
    vectors: list[bytes] = field(default_factory=list)          # embeddings: float32 LE, per input


@dataclass(slots=True)
class Capacity:
    """Room right now, from the engine's real state."""

    total_slots: int
    free_slots: int
    token_budget: int                  # KV-cache tokens free for new sequences
    running: dict[str, int] = field(default_factory=dict)   # slots held per class
    step_tokens: int = 0               # tokens one engine step computes at most; 0 = not known
    kv_tokens: int = 0                 # the whole KV cache: what its prefix cache can hold; 0 = none
    adapters: tuple[str, ...] = ()     # LoRA adapters loaded now (their logical model names)


class Engine(abc.ABC):
    name: str = "engine"
    model: str = ""                    # the real model served, reported in Usage
    supports_logprobs: bool = False    # can feed the cascade's confidence signal
    # Its prefix cache is shared by every tenant (a hosted upstream, salted by no one): its hits
    # are metered and priced, never told to the client, whose exact count of another tenant's
    # prefix would confirm a guess of it.
    shared_prefix_cache: bool = False

    @abc.abstractmethod
    async def start(self) -> None: ...

    @abc.abstractmethod
    def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]: ...

    @abc.abstractmethod
    async def abort(self, key: RequestKey) -> None: ...

    @abc.abstractmethod
    def capacity(self) -> Capacity: ...

    @abc.abstractmethod
    async def cleanup(self) -> None: ...

    async def warmup(self) -> None:
        """One short generation before taking work, so the first real request pays no cold start."""
        body = ChatBody(model=self.model or "warmup", messages=[Message(role="user", content="Hello")],
                        max_tokens=4, temperature=0.0)
        request = EngineRequest(request_id="warmup", body=body)
        async for _ in self.generate(request):
            pass
