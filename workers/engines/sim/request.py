"""What the SIMULATED engine accepts of an OpenAI body, checked before anything is generated.

The contract: honour every field or raise `UnsupportedRequest` naming it. Sampling knobs of a
real sampler (top_k, min_p, penalties, logit_bias) have no distribution to shape in a simulation,
so they are accepted as no-ops; knobs that change what comes out (min_tokens, ignore_eos,
include_stop_str_in_output, stop_token_ids, truncate_prompt_tokens, echo) are honoured; anything
the sim cannot honour (images, reasoning effort, unknown fields) is refused.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from schemas.openai import ChatBody, CompletionBody
from workers.engine import EngineRequest, UnsupportedRequest

# vLLM's extra sampling parameters whose effect a simulation cannot show: accepted, type-checked.
_NOOP_EXTRAS: dict[str, type | tuple[type, ...]] = {
    "top_k": int,
    "min_p": (int, float),
    "repetition_penalty": (int, float),
    "length_penalty": (int, float),
    "skip_special_tokens": bool,
    "spaces_between_special_tokens": bool,
    "add_special_tokens": bool,
    "add_generation_prompt": bool,
    "chat_template_kwargs": dict,
    # OpenAI request metadata: it describes the request, it does not change the answer.
    "metadata": dict,
    "store": bool,
    "service_tier": str,
    "prompt_cache_key": str,
    "safety_identifier": str,
    "modalities": list,
}
# Extras the sim honours: they change what it generates.
_HONOURED: dict[str, type | tuple[type, ...]] = {
    "min_tokens": int,
    "ignore_eos": bool,
    "include_stop_str_in_output": bool,
    "stop_token_ids": list,
    "truncate_prompt_tokens": int,
}
_REFUSED = {
    "reasoning_effort": "the simulated model is not a reasoning model",
    "audio": "the simulated model produces text only",
}


@dataclass(slots=True, frozen=True)
class SimRequest:
    """A request the sim accepted: its counts and the extras that shape its answer."""

    prompt_tokens: int
    cap: int  # output tokens allowed per choice (limit or context left)
    limited: bool  # the cap is the client's limit, not the context's
    min_tokens: int = 0
    ignore_eos: bool = False
    include_stop: bool = False
    stop_token_ids: frozenset[int] = frozenset()
    echo: str = ""  # completions: the prompt, sent back before the answer


def accept(request: EngineRequest, max_model_len: int) -> SimRequest:
    """The request as the sim will serve it; `UnsupportedRequest` naming the field it cannot."""
    body, rid = request.body, request.request_id
    extra = _extras(request)
    if isinstance(body, ChatBody):
        _check_chat(rid, body)
        echo = ""
    else:
        assert isinstance(body, CompletionBody)  # the engine plans an embedding with accept_embedding
        echo = _check_completion(rid, body)
    prompt = max(1, math.ceil(sum(len(t) for t in body.texts()) / 4))  # ~4 characters a token
    if (truncate := extra.get("truncate_prompt_tokens")) is not None:
        if truncate < 1:
            raise UnsupportedRequest(rid, "truncate_prompt_tokens", "truncate_prompt_tokens must be at least 1")
        prompt = min(prompt, truncate)
    where = "messages" if isinstance(body, ChatBody) else "prompt"
    if prompt >= max_model_len:
        raise UnsupportedRequest(
            rid, where, f"this model's maximum context length is {max_model_len} tokens; the prompt has {prompt}"
        )
    limit = body.output_limit
    if limit is not None and prompt + limit > max_model_len:
        field = "max_completion_tokens" if getattr(body, "max_completion_tokens", None) else "max_tokens"
        raise UnsupportedRequest(
            rid,
            field,
            f"{field} is too large: {limit}; this model's maximum context "
            f"length is {max_model_len} and the prompt has {prompt} tokens",
        )
    cap = limit if limit is not None else max_model_len - prompt
    min_tokens = extra.get("min_tokens", 0)
    if not 0 <= min_tokens <= cap:
        raise UnsupportedRequest(rid, "min_tokens", f"min_tokens must be between 0 and {cap}")
    stop_ids = extra.get("stop_token_ids", [])
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in stop_ids):
        raise UnsupportedRequest(rid, "stop_token_ids", "stop_token_ids must be a list of integers")
    return SimRequest(
        prompt,
        cap,
        limit is not None,
        min_tokens,
        extra.get("ignore_eos", False),
        extra.get("include_stop_str_in_output", False),
        frozenset(stop_ids),
        echo,
    )


def _extras(request: EngineRequest) -> dict[str, Any]:
    extra = checked_extras(request, {**_NOOP_EXTRAS, **_HONOURED}, _REFUSED, "the simulated engine")
    if extra.get("modalities") not in (None, ["text"]):
        raise UnsupportedRequest(request.request_id, "modalities", "the simulated model produces text only")
    return extra


def checked_extras(
    request: EngineRequest, kinds: dict[str, type | tuple[type, ...]], refused: dict[str, str], who: str
) -> dict[str, Any]:
    """The request's extra fields that are set, each of a kind in `kinds`; any other field, or
    one of the wrong type, is refused by name."""
    rid = request.request_id
    if not request.extra:
        return {}
    try:
        extra = json.loads(request.extra)
    except ValueError:
        raise UnsupportedRequest(rid, "body", "the request's extra fields are not JSON") from None
    if not isinstance(extra, dict):
        raise UnsupportedRequest(rid, "body", "the request's extra fields are not a JSON object")
    for name, value in extra.items():
        if name in refused:
            raise UnsupportedRequest(rid, name, refused[name])
        kind = kinds.get(name)
        if kind is None:
            raise UnsupportedRequest(rid, name, f"{who} does not support {name!r}")
        if value is None:
            continue
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise UnsupportedRequest(rid, name, f"{name} has the wrong type")
    return {k: v for k, v in extra.items() if v is not None}


def _check_chat(rid: str, body: ChatBody) -> None:
    for i, message in enumerate(body.messages):
        if isinstance(message.content, list):
            for part in message.content:
                if part.get("type") not in ("text", "refusal"):
                    raise UnsupportedRequest(
                        rid,
                        f"messages[{i}].content",
                        f"the simulated model reads text only, not {part.get('type')!r} parts",
                    )
    choice, names = body.tool_choice, body.tool_names()
    if choice is not None and choice != "none" and choice != "auto" and not names:
        raise UnsupportedRequest(rid, "tool_choice", "tool_choice needs tools")
    if choice is not None and not isinstance(choice, str) and choice.function.name not in names:
        raise UnsupportedRequest(rid, "tool_choice", f"no tool named {choice.function.name!r}")


def _check_completion(rid: str, body: CompletionBody) -> str:
    if body.best_of is not None and body.best_of > body.choices:
        raise UnsupportedRequest(rid, "best_of", "best_of greater than n is not supported (as in vLLM V1)")
    if body.echo and body.logprobs is not None:
        raise UnsupportedRequest(rid, "echo", "echo with logprobs (prompt logprobs) is not supported")
    # `suffix` is accepted: any simulated text is as good an insertion before it as any other.
    return body.text if body.echo else ""
