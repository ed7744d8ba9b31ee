"""OpenAI chat request → `GenerateRequest`, refusing what Laneway cannot honour by name."""

from __future__ import annotations

import re

from broker.bridge.errors import EdgeError
from schemas.errors import ErrorCode
from schemas.openai import ChatCompletionRequest, EdgeMessage
from schemas.requests import ChatMessage, GenerateRequest, SamplingParams

DEFAULT_MAX_TOKENS = 256

_PATH = re.compile(r"at `\$\.?([^`]*)`")


def param_of(validation_message: str) -> str | None:
    """msgspec names the failing field as `$.messages[0].role`; OpenAI's `param` is the path."""
    match = _PATH.search(validation_message)
    return match.group(1) or None if match else None


def _content(index: int, message: EdgeMessage) -> str:
    if message.content is None:
        return ""
    if isinstance(message.content, str):
        return message.content
    texts = []
    for part in message.content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise EdgeError(ErrorCode.invalid_request, "only text content parts are supported",
                            f"messages[{index}].content")
        texts.append(part["text"])
    return "".join(texts)


def _refuse_unsupported(req: ChatCompletionRequest) -> None:
    if req.presence_penalty not in (None, 0, 0.0):
        raise EdgeError(ErrorCode.invalid_request, "presence_penalty is not supported", "presence_penalty")
    if req.frequency_penalty not in (None, 0, 0.0):
        raise EdgeError(ErrorCode.invalid_request, "frequency_penalty is not supported", "frequency_penalty")
    if req.logprobs:
        raise EdgeError(ErrorCode.invalid_request, "logprobs are not supported", "logprobs")
    if req.tools:
        raise EdgeError(ErrorCode.invalid_request, "tools are not supported", "tools")
    if req.response_format not in (None, {"type": "text"}):
        raise EdgeError(ErrorCode.invalid_request, "only the text response_format is supported",
                        "response_format")


def to_generate(req: ChatCompletionRequest, *, request_id: str, tenant: str, klass: str,
                reply_to: str, now: float, deadline: float) -> GenerateRequest:
    _refuse_unsupported(req)
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    sampling = SamplingParams(
        max_tokens=req.max_completion_tokens or req.max_tokens or DEFAULT_MAX_TOKENS,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        stop=stop,
        seed=req.seed,
    )
    messages = [ChatMessage(role=m.role, content=_content(i, m)) for i, m in enumerate(req.messages)]
    return GenerateRequest(request_id=request_id, tenant=tenant, klass=klass, model=req.model,
                           reply_to=reply_to, created_at=now, deadline=deadline,
                           messages=messages, sampling=sampling, stream=req.stream)


def check_context(generate: GenerateRequest, max_context_tokens: int) -> None:
    """Refuse, before anything is stored, a prompt that leaves the model no room to answer. The
    count is the estimate quotas use (~4 characters a token); engines check the exact count."""
    prompt = generate.estimated_prompt_tokens()
    if prompt >= max_context_tokens:
        raise EdgeError(ErrorCode.context_length_exceeded,
                        f"this model's context is {max_context_tokens} tokens; the messages are about "
                        f"{prompt} tokens", "messages")
