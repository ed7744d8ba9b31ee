"""What a client asks for: `GenerateRequest` on `lw.req.<class>.<tenant>`. Limits live in the types."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

# Hard ceilings the wire accepts at all; per-model limits (context length) are checked by engines.
MAX_OUTPUT_TOKENS = 32_768
MAX_STOP_SEQUENCES = 4

MaxTokens = Annotated[int, Meta(ge=1, le=MAX_OUTPUT_TOKENS)]
Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]
TopP = Annotated[float, Meta(gt=0.0, le=1.0)]
# msgpack carries at most a 64-bit integer, and engines seed a 64-bit generator.
Seed = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
Role = Annotated[str, Meta(pattern="^(system|user|assistant|tool|developer)$")]
RequestId = Annotated[str, Meta(pattern="^[A-Za-z0-9_-]{1,64}$")]
Token = Annotated[str, Meta(pattern="^[A-Za-z0-9_-]{1,64}$")]


class ChatMessage(msgspec.Struct, omit_defaults=True, gc=False):
    role: Role
    content: str


class SamplingParams(msgspec.Struct, omit_defaults=True, gc=False):
    max_tokens: MaxTokens = 256
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    stop: Annotated[list[str], Meta(max_length=MAX_STOP_SEQUENCES)] = []
    seed: Seed | None = None

    @property
    def deterministic(self) -> bool:
        return self.temperature == 0.0 or self.seed is not None


class GenerateRequest(msgspec.Struct, omit_defaults=True, kw_only=True, gc=False):
    """One generation. Exactly one of `messages` (chat) or `prompt` (completion) is set.

    `tenant` and `klass` repeat the subject's tokens; the broker trusts the subject (which NATS
    permissions guard) and refuses a payload that disagrees with it.
    """

    request_id: RequestId
    tenant: Token
    klass: Token = msgspec.field(name="class")
    model: Annotated[str, Meta(min_length=1, max_length=128)]
    reply_to: Annotated[str, Meta(min_length=1, max_length=256)]
    created_at: float                      # unix seconds, set by the edge
    deadline: float                        # unix seconds; expired requests are never started
    messages: list[ChatMessage] = []
    prompt: str | None = None
    sampling: SamplingParams = msgspec.field(default_factory=SamplingParams)
    stream: bool = True
    escalated: bool = False                # re-sent by the small pool's worker for the large pool (cascade)

    def validate_shape(self) -> None:
        """Cross-field rules msgspec types cannot express; raises ValueError naming the field."""
        if bool(self.messages) == (self.prompt is not None):
            raise ValueError("exactly one of 'messages' or 'prompt' must be set")

    @property
    def prompt_chars(self) -> int:
        if self.prompt is not None:
            return len(self.prompt)
        return sum(len(m.content) for m in self.messages)

    def estimated_prompt_tokens(self) -> int:
        # ~4 characters per token for English BPE vocabularies; the broker only needs a cost
        # estimate for fair queuing, engines count exactly.
        return max(1, self.prompt_chars // 4)

    def estimated_cost(self) -> int:
        """Tokens this request may occupy in an engine: the unit of fair share and KV budget."""
        return self.estimated_prompt_tokens() + self.sampling.max_tokens


class Cancel(msgspec.Struct, omit_defaults=True, gc=False):
    """On `lw.cancel.<tenant>.<request_id>`: dequeue if waiting, abort if running."""

    request_id: str
    tenant: str
    reason: str = "client_disconnected"
