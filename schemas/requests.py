"""What a client asks for: `GenerateRequest` on `lw.req.<class>.<tenant>`.

The client's OpenAI body travels whole: `chat` or `completion` holds the fields Laneway reads,
typed; `extra` holds every other top-level field of the body as the client sent it (a JSON
object's bytes, e.g. vLLM's `top_k`, `min_p`, `repetition_penalty`), for the engine to honour or
refuse by name. Schema evolution follows msgspec's rules: new fields go last, with defaults.
"""

from __future__ import annotations

from typing import Annotated, Any, cast

import msgspec
from msgspec import Meta

from schemas.checks import Invalid, check_body
from schemas.openai import Body, ChatBody, CompletionBody, EmbeddingBody, ResponseFormat, Tool, ToolChoice

_encode_json = msgspec.json.Encoder().encode
MAX_ECHO_BYTES = 512 * 1024  # half of NATS's default max_payload: a Finished entry must fit in a frame

RequestId = Annotated[str, Meta(pattern=r"^[A-Za-z0-9_-]{1,64}\Z")]
Token = Annotated[str, Meta(pattern=r"^[A-Za-z0-9_-]{1,64}\Z")]

# The output length the broker assumes for cost and KV reservation when the client sets no
# limit (the engine then generates up to the model's context): the reference shape's 400 out.
EXPECTED_OUTPUT_TOKENS = 400


class Echoed(msgspec.Struct, omit_defaults=True, gc=False):
    """A chat's texts besides its messages, as the engine's side holds them (`Finished.fields`)."""

    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    response_format: ResponseFormat | None = None
    user: str | None = None
    kept: dict[str, Any] | None = None  # `GenerateRequest.kept` (encoded from its bytes, as they are)


class GenerateRequest(msgspec.Struct, omit_defaults=True, kw_only=True, gc=False):
    """One generation (or embedding). Exactly one of `chat`, `completion`, `embedding` is set.

    `tenant` and `klass` repeat the subject's tokens; the broker trusts the subject (which NATS
    permissions guard) and refuses a payload that disagrees with it. `model` is the model asked
    for (the body's own, until routing names the one that serves it).
    """

    request_id: RequestId
    tenant: Token
    klass: Token = msgspec.field(name="class")
    model: Annotated[str, Meta(min_length=1, max_length=128)]
    reply_to: Annotated[str, Meta(min_length=1, max_length=256)]
    created_at: float  # unix seconds, set by the edge
    deadline: float  # unix seconds; expired requests are never started
    escalated: bool = False  # re-sent by the small pool's worker for the large pool (cascade)
    chat: ChatBody | None = None
    completion: CompletionBody | None = None
    extra: bytes = b""  # the body's other fields: a JSON object, verbatim
    embedding: EmbeddingBody | None = None
    traceparent: str = ""  # W3C trace context of the edge's span, when tracing is on
    # Send the chat messages back on `Finished.messages` as the engine got them (redacted where the
    # tenant's PII policy says): a stored response keeps that input, never the raw one.
    echo_input: bool = False
    # The body's fields that the edge stores beside the answer and that no engine reads (a JSON
    # object: a Response's `metadata`, `safety_identifier`, `prompt_cache_key`). The gate
    # analyses them like `extra`; `Finished.fields` brings them back as the tenant's policy left
    # them, so that what is stored is never the raw value.
    kept: bytes = b""
    # The bridge awaiting the frames (its edge id): the worker cancels the work once that bridge is
    # gone (workers/orphans.py). Empty for a tenant's own client, whose liveness nobody watches.
    edge: Annotated[str, Meta(pattern=r"^[A-Za-z0-9_-]{0,64}\Z")] = ""

    def echoed_input(self) -> bytes:
        """What `Finished.messages` carries for this request: its chat messages as JSON, when asked
        and when they leave the frame room under NATS's payload limit (else nothing: the response
        is stored without its input, never with the raw one)."""
        if not self.echo_input or self.chat is None:
            return b""
        echoed = _encode_json(self.chat.messages)
        return echoed if len(echoed) <= MAX_ECHO_BYTES else b""

    def echoed(self) -> tuple[bytes, bytes]:
        """What `Finished.messages` and `Finished.fields` carry: `echoed_input()`, and the chat's
        other texts a stored response repeats (tools, tool_choice, response_format, user) with
        `kept`, as the engine's side holds them (redacted), when they fit beside the messages
        under MAX_ECHO_BYTES (else nothing: the store withholds them)."""
        messages = self.echoed_input()
        if not self.echo_input or self.chat is None:
            return messages, b""
        chat = self.chat
        fields = _encode_json(
            Echoed(
                chat.tools,
                chat.tool_choice,
                chat.response_format,
                chat.user,
                # as it is: Raw writes the JSON object's bytes where the dict goes
                cast(dict[str, Any], msgspec.Raw(self.kept)) if self.kept else None,
            )
        )
        return messages, fields if len(messages) + len(fields) <= MAX_ECHO_BYTES else b""

    def validate_shape(self) -> None:
        """Cross-field rules msgspec types cannot express; raises `checks.Invalid` naming the field."""
        if sum(b is not None for b in (self.chat, self.completion, self.embedding)) != 1:
            raise Invalid("exactly one of 'chat', 'completion' or 'embedding' must be set", "messages")
        check_body(self.body)

    @property
    def body(self) -> Body:
        body = self.chat or self.completion or self.embedding
        assert body is not None, "validate_shape() first"
        return body

    @property
    def stream(self) -> bool:
        return bool(self.body.stream)  # null is "not set": no stream

    @property
    def choices(self) -> int:
        return self.body.choices

    def texts(self) -> list[str]:
        """The text the model is given: what PII analysis, routing and estimates read."""
        return self.body.texts()

    @property
    def prompt_chars(self) -> int:
        return sum(len(t) for t in self.texts())

    def estimated_prompt_tokens(self) -> int:
        # ~4 characters per token for English BPE vocabularies; the broker only needs a cost
        # estimate for fair queuing, engines count exactly.
        given = self.embedding.token_count() if self.embedding is not None else 0
        return max(1, self.prompt_chars // 4 + given)

    def expected_output_tokens(self) -> int:
        if self.embedding is not None:
            return 0
        return self.body.output_limit or EXPECTED_OUTPUT_TOKENS

    def estimated_cost(self) -> int:
        """Tokens this request may occupy in an engine: the unit of fair share and KV budget.
        Each of `n` choices is a sequence of its own."""
        return self.estimated_prompt_tokens() + self.expected_output_tokens() * self.choices


class Cancel(msgspec.Struct, omit_defaults=True, gc=False):
    """On `lw.cancel.<tenant>.<request_id>`: dequeue if waiting, abort if running."""

    request_id: str
    tenant: str
    reason: str = "client_disconnected"
