"""A continuation on vLLM (`EngineRequest.continued`): the answer a lost worker already streamed
is prefilled as token ids after the prompt vLLM's own renderer made, so the engine computes what
the unbroken run computed (the same ids in the same order) and generates only what follows. The
rest is vLLM's serving layer as for any request: sampling, detokenizing (primed with the prompt's
last tokens, so the first new token's spacing is right), usage (`prompt_tokens` counts the
prefilled answer: `workers.serve` moves it back to the output for the client).

What it cannot continue, and why (`refusal`): a stream vLLM parses while it generates (tool
calls, a reasoning parser) or constrains from its first token (structured outputs), whose parser
or grammar would start again at the continuation; a stop string, which may span the break (and
whose possible start vLLM held back unsent); completions' echo and suffix, which the stream does
not carry as a plain answer; and (`broken_character`) an answer that broke inside a character.
What goes on differently from the unbroken run: a seeded sample draws fresh randomness, and
presence and frequency penalties count the new run's output only (every token once, still).

Imports vllm at its top: the engine and `workers.engines.vllm.serving` import it lazily.
"""

from __future__ import annotations

import json
from typing import Any

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.serve.engine.protocol import ErrorResponse
from vllm.renderers.online_renderer import OnlineRenderer

from schemas.openai import Body, ChatBody, CompletionBody
from schemas.openai_extra import VLLM_GUIDED
from workers.engine import Continued, EngineError, EngineRequest

# Extra fields that constrain an answer from its first token (vLLM's grammar-backed outputs;
# completions' response_format is one of their extra fields).
_CONSTRAINING = VLLM_GUIDED | {"structured_outputs", "response_format"}


def refusal(body: Body, extra: bytes, reasoning_parser: str | None) -> str | None:
    """Why vLLM cannot continue this request (None: it can), beyond the contract's own checks."""
    if isinstance(body, ChatBody):
        if body.tools and body.tool_choice != "none":
            return "its tool calls are parsed from the whole answer"
        if body.response_format is not None and body.response_format.type != "text":
            return "its response_format constrains the answer from its first token"
        if reasoning_parser:
            return "its reasoning is parsed from the whole answer"
    if isinstance(body, CompletionBody) and (body.echo or body.suffix):
        return "echo and suffix are not part of a continued answer"
    if body.stops:  # vLLM also holds back the text that may begin one: the lost worker never sent it
        return "a stop string may span the break, and vLLM matches it in the new run's text only"
    if _CONSTRAINING & _fields(extra).keys():
        return "its structured output constrains the answer from its first token"
    return None


def _fields(extra: bytes) -> dict[str, Any]:
    try:
        fields = json.loads(extra) if extra else {}
    except ValueError:
        return {}  # build_request refuses it, naming why
    return fields if isinstance(fields, dict) else {}


def broken_character(tokenizer: Any, continued: Continued) -> bool:
    """The answer broke inside a character (a byte-level tokenizer spends 2-3 tokens on a CJK
    character or an emoji): vLLM's detokenizer, primed with a prompt that ends in half a
    character, would stream the whole prompt back when the next token completes it."""
    return bool(tokenizer.decode(continued.token_ids[-4:]).endswith("\ufffd"))


def answer_end(stop_ids: set[int], request: EngineRequest, left: int) -> str | None:
    """The finish reason of a continued answer its lost worker had completed (it died before
    saying so), else None. `stop_ids`: the model's end-of-sequence ids; `left`: the tokens the
    answer may still have (`output_left`)."""
    assert request.continued is not None
    ids, fields = request.continued.token_ids, _fields(request.extra)
    if left <= 0:
        return "length"
    # A request's own stop_token_ids end it even with ignore_eos, as in vLLM's SamplingParams.
    asked = set(fields.get("stop_token_ids") or ())
    if ids[-1] in asked or (ids[-1] in stop_ids and not fields.get("ignore_eos")):
        return "stop"
    return None


def output_left(serving: Any, max_model_len: int, request: EngineRequest, prompt: int) -> int:
    """The tokens a continued answer may still have: what vLLM would allow the unbroken request
    (`get_max_tokens`: the client's limit or the model's default, the server's override, the
    context's room after the prompt), less what the lost worker generated."""
    assert request.continued is not None
    limit = request.body.output_limit
    caps = (
        limit if limit is not None else serving.default_sampling_params.get("max_tokens"),
        serving.override_max_tokens,
        max_model_len - prompt,
    )
    return min(cap for cap in caps if cap is not None) - len(request.continued.token_ids)


def end_of_sequence_ids(tokenizer: Any, generation_config: dict[str, Any]) -> set[int]:
    """Every id that ends an answer: the tokenizer's and the model's generation config's."""
    listed = generation_config.get("eos_token_id")
    ids = set(listed if isinstance(listed, list) else [listed] if listed is not None else [])
    return ids | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set())


async def prompt_length(renderer: OnlineRenderer, vreq: Any) -> int:
    """The tokens vLLM's renderer makes of this request's prompt."""
    if isinstance(vreq, ChatCompletionRequest):
        rendered = await renderer.render_chat(vreq)
        inputs = rendered if isinstance(rendered, ErrorResponse) else rendered[1]
    else:
        inputs = await renderer.render_completion(vreq)
    if isinstance(inputs, ErrorResponse):
        raise EngineError(vreq.request_id, inputs.error.message)
    return len(inputs[0]["prompt_token_ids"])


class ContinuingRenderer(OnlineRenderer):
    """vLLM's renderer, appending a continuation's token ids to the one prompt it renders for
    that request. Continuations are registered by vLLM request id while they run."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.continued: dict[str, list[int]] = {}

    async def render_chat(self, request: Any, **kwargs: Any) -> Any:
        result = await super().render_chat(request, **kwargs)
        if isinstance(result, ErrorResponse):
            return result
        conversation, inputs = result
        return conversation, self._extended(request.request_id, inputs)

    async def render_completion(self, request: Any, **kwargs: Any) -> Any:
        result = await super().render_completion(request, **kwargs)
        return result if isinstance(result, ErrorResponse) else self._extended(request.request_id, result)

    def _extended(self, request_id: str, inputs: list[Any]) -> list[Any]:
        ids = self.continued.get(request_id)
        if ids is None:
            return inputs
        (prompt,) = inputs  # one prompt: Laneway's bodies have one (CompletionBody.prompt)
        prompt["prompt_token_ids"] = [*prompt["prompt_token_ids"], *ids]
        # The prompt's text and offsets no longer describe its ids.
        prompt.pop("prompt", None)
        prompt.pop("prompt_token_offsets", None)
        return inputs
