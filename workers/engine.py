"""The Engine contract every worker engine honours (sim, vllm, openai).

Lifecycle: `start()` (load + warm up; raises if the engine cannot serve) → any number of
concurrent `generate()` streams → `abort()` for cancels and deadlines → `cleanup()` (idempotent).

`generate()` is an async iterator of `EngineOutput` deltas; the last one has `finish_reason`
set. Closing the iterator early (the consumer is cancelled, or calls `aclose()`) must abort the
request in the engine and free its slot, as vLLM's `AsyncLLM.generate` does.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from schemas.requests import ChatMessage, SamplingParams


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


@dataclass(slots=True)
class EngineRequest:
    request_id: str
    messages: list[ChatMessage]
    prompt: str | None
    sampling: SamplingParams
    priority: int = 0               # lower runs sooner (vLLM's convention)
    klass: str = ""
    logprobs: bool = False          # report each generated token's log-probability (cascade)


@dataclass(slots=True)
class EngineOutput:
    text: str
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None   # set on the last output: "stop" | "length" | "abort"
    prompt_tokens: int = 0             # exact counts, reported with the last output
    completion_tokens: int = 0
    logprobs: list[float] = field(default_factory=list)   # per token, when asked for


@dataclass(slots=True)
class Capacity:
    """Room right now, from the engine's real state."""

    total_slots: int
    free_slots: int
    token_budget: int                  # KV-cache tokens free for new sequences
    running: dict[str, int] = field(default_factory=dict)   # slots held per class


class Engine(abc.ABC):
    name: str = "engine"
    model: str = ""                    # the real model served, reported in Usage
    supports_logprobs: bool = False    # can feed the cascade's confidence signal

    @abc.abstractmethod
    async def start(self) -> None: ...

    @abc.abstractmethod
    def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]: ...

    @abc.abstractmethod
    async def abort(self, request_id: str) -> None: ...

    @abc.abstractmethod
    def capacity(self) -> Capacity: ...

    @abc.abstractmethod
    async def cleanup(self) -> None: ...

    async def warmup(self) -> None:
        """One short generation before taking work, so the first real request pays no cold start."""
        request = EngineRequest(
            request_id="warmup",
            messages=[ChatMessage(role="user", content="Hello")],
            prompt=None,
            sampling=SamplingParams(max_tokens=4, temperature=0.0),
        )
        async for _ in self.generate(request):
            pass
