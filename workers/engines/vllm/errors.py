"""The one boundary from vLLM's errors to the engine contract's: an `ErrorResponse` (returned, or
streamed as an error event) or a raised exception becomes `EngineDead` (the engine core died),
`UnsupportedRequest` naming the body's field (vLLM's 4xx), or `EngineError` (anything else,
logged here whole). vllm is imported lazily."""

from __future__ import annotations

import logging
from typing import Any

from schemas.openai import ChatBody, EmbeddingBody
from workers.engine import EngineDead, EngineError, EngineRequest, UnsupportedRequest

log = logging.getLogger(__name__)

# vLLM names a prompt that does not fit by its token/char count; ours is the body's field.
_PROMPT_PARAMS = frozenset({"input_tokens", "input_text"})


def param_name(request: EngineRequest, param: str | None) -> str:
    body = request.body
    if param in _PROMPT_PARAMS:
        return "messages" if isinstance(body, ChatBody) else "input" if isinstance(body, EmbeddingBody) else "prompt"
    return param or ""


def refused(request: EngineRequest, info: Any, *, core_dead: bool) -> Exception:
    """vLLM's `ErrorResponse` (its `ErrorInfo`, or our `ErrorBody` of a streamed one) → ours."""
    rid = request.request_id
    if core_dead:
        return EngineDead(f"vllm engine core died during {rid}")
    if isinstance(info.code, int) and 400 <= info.code < 500:
        return UnsupportedRequest(rid, param_name(request, info.param), info.message)
    log.warning("vllm failed %s: %s %s", rid, info.type, info.message)
    return EngineError(rid, f"{info.type}: {info.message}")


def translate(request: EngineRequest, e: Exception) -> Exception:
    """vLLM's raised errors → ours."""
    from vllm.exceptions import VLLMClientError
    from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

    rid = request.request_id
    if isinstance(e, EngineDeadError):
        return EngineDead(f"vllm engine core died during {rid}")
    if isinstance(e, VLLMClientError):
        return UnsupportedRequest(rid, param_name(request, getattr(e, "parameter", None)), str(e))
    if isinstance(e, EngineGenerateError) and e.__cause__ is not None:
        e = e.__cause__
    # Anything else vLLM (or its engine-core process) raised: logged here, the one place
    # that sees it whole, then ended as this request's engine error.
    log.warning("vllm failed %s; ending it as an engine error", rid, exc_info=e)
    return EngineError(rid, f"{type(e).__name__}: {e}")
