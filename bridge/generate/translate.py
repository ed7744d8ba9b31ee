"""An OpenAI body → `GenerateRequest`: the body travels whole. The edge checks only what the
types cannot (`schemas/checks.py`: the rules the broker checks again); engines honour or refuse
the rest."""

from __future__ import annotations

import re

from bridge.errors import EdgeError
from schemas import request_checks
from schemas.checks import Invalid, check_body
from schemas.openai import Body, ChatBody, CompletionBody, EmbeddingBody
from schemas.requests import GenerateRequest

_PATH = re.compile(r"at `\$\.?([^`]*)`")
_MISSING = re.compile(r"missing required field `([^`]*)`")


def param_of(validation_message: str) -> str | None:
    """msgspec names the failing field as `$.messages[0].role`; OpenAI's `param` is the path."""
    match = _PATH.search(validation_message)
    path = match.group(1) if match else ""
    missing = _MISSING.search(validation_message)
    if missing:  # the field that is missing, under the object that misses it
        path = f"{path}.{missing.group(1)}" if path else missing.group(1)
    return path or None


def edge_error(exc: Invalid) -> EdgeError:
    return EdgeError(exc.code, exc.message, exc.param)


def to_generate(
    body: Body,
    extra: bytes,
    *,
    request_id: str,
    tenant: str,
    klass: str,
    reply_to: str,
    edge: str,
    now: float,
    deadline: float,
) -> GenerateRequest:
    try:
        check_body(body)
    except Invalid as exc:
        raise edge_error(exc) from None
    chat = body if isinstance(body, ChatBody) else None
    completion = body if isinstance(body, CompletionBody) else None
    embedding = body if isinstance(body, EmbeddingBody) else None
    return GenerateRequest(
        request_id=request_id,
        tenant=tenant,
        klass=klass,
        model=body.model,
        reply_to=reply_to,
        edge=edge,
        created_at=now,
        deadline=deadline,
        chat=chat,
        completion=completion,
        embedding=embedding,
        extra=extra,
    )


def check_context(generate: GenerateRequest, max_context_tokens: int) -> None:
    """Refuse, before anything is stored, a prompt that leaves the model no room to answer."""
    try:
        request_checks.check_context(generate, max_context_tokens)
    except Invalid as exc:
        raise edge_error(exc) from None
