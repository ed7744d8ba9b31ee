"""What one `POST /v1/responses` asked of the store, decided while parsing, and what is kept of
it once it has ended: its record, and its turn for its conversation."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from bridge.render.responses import ResponsesRenderer
from bridge.render.stored import kept_of
from bridge.responses.stored.items import decode_messages, to_items
from bridge.responses.translate import item_messages
from core.policy.stored import StoragePolicy
from core.policy.tenants import Tenant
from schemas import codec
from schemas.openai import Body, Message
from schemas.requests import GenerateRequest
from schemas.responses import ResponsesBody
from schemas.stored import StoredResponse


class Asked:
    """What one request asked of the store, decided while parsing."""

    __slots__ = ("body", "store", "policy", "history_len", "conversation", "tenant", "render", "before_end", "kept")

    def __init__(
        self,
        body: Body | ResponsesBody,  # Generations.parse's type; this endpoint's decode_responses reads the latter
        store: bool,
        policy: StoragePolicy,
        history_len: int,
        conversation: str | None,
        tenant: Tenant | None,
    ) -> None:
        assert isinstance(body, ResponsesBody)
        self.body = body
        self.store = store
        self.policy = policy
        self.history_len = history_len  # the messages previous_response_id or the conversation gave
        self.conversation = conversation
        self.tenant = tenant
        self.render: ResponsesRenderer | None = None
        self.before_end: Callable[[], Awaitable[None]] | None = None  # the renderer's, once made
        self.kept = False  # its record written, and its turn added to its conversation

    def renderer(self, generate: GenerateRequest) -> ResponsesRenderer:
        self.render = ResponsesRenderer(generate, self.body, store=self.store)
        self.render.before_end = self.before_end
        return self.render

    def ask_echo(self, generate: GenerateRequest) -> None:
        """Ask for the input back as the engine gets it (redacted): to store it, or add it to the
        conversation; and, to store them, the fields no engine reads, analysed by the gate."""
        generate.echo_input = self.store or self.conversation is not None
        generate.kept = kept_of(self.body) if self.store else b""


ASKED = web.RequestKey("responses_asked", Asked)


def engine_input(render: ResponsesRenderer, asked: Asked) -> list[Message]:
    """The messages the engine got (redacted), without the instructions (never carried over)."""
    echoed = decode_messages(render.input_messages) if render.input_messages else []
    if echoed and asked.body.instructions and echoed[0].role == "system":
        echoed = echoed[1:]
    return echoed


def record_of(render: ResponsesRenderer, generate: GenerateRequest, asked: Asked) -> StoredResponse:
    """What is kept of an ended response: the Response object, this request's input items and the
    conversation through its output, all from the input as the engine got it (redacted)."""
    final = render.final
    assert final is not None
    echoed = engine_input(render, asked)
    new_input = echoed[asked.history_len :]
    history = [*echoed, *item_messages(final["output"])] if echoed else []
    return StoredResponse(
        response=orjson.dumps(render.stored(final)),
        request_id=generate.request_id,
        input_items=orjson.dumps(to_items(new_input, generate.request_id)),
        history=codec.encode_json(history),
    )


def turn_of(render: ResponsesRenderer, asked: Asked) -> tuple[Tenant, str, list[Message], list[dict[str, Any]]] | None:
    """An ended response's turn for its conversation: None when it continues none."""
    assert render.final is not None  # called once the response has ended
    if asked.conversation is None or asked.tenant is None:
        return None
    return asked.tenant, asked.conversation, engine_input(render, asked)[asked.history_len :], render.final["output"]
