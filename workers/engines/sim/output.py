"""The SIMULATED model's answers: what each choice of a request will say, token by token.

Nothing here is a model. An answer is a deterministic function of the request (and, when the
request is not deterministic, of its arrival order): a natural length from a hash of the prompt,
text from a fixed self-describing sentence, tool calls whose arguments validate against the
tool's JSON schema, JSON that validates against `response_format`. The engine plans each choice
once, at admission, and streams one `Piece` (one token) per engine step.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import zlib
from dataclasses import dataclass
from typing import Any

from schemas.frames import TokenLogprob, TopLogprob
from schemas.openai import ChatBody, Tool
from workers.engines.sim.request import SimRequest
from workers.engines.sim.schema import SchemaUnsupported, instance

WORDS = (
    "Laneway ",
    "streams ",
    "simulated ",
    "tokens ",
    "from ",
    "a ",
    "modelled ",
    "GPU ",
    "engine ",
    "with ",
    "continuous ",
    "batching. ",
)
MIN_ANSWER, MAX_ANSWER = 16, 200  # a natural answer's length in tokens, when nothing caps it
_PIECE = re.compile(r"\s*(?:\w{1,8}|[^\w\s]{1,3})|\s+")  # JSON text in token-sized pieces


class Unfit(Exception):
    """The sim cannot produce the answer this request asks for; `param` names the field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(slots=True, frozen=True)
class Piece:
    """One generated token: content text, or a part of tool call `call`."""

    text: str  # content, or a fragment of the call's arguments
    token_id: int
    call: int = -1  # -1: message content
    name: str = ""  # a call's first piece: its function name and id
    id: str = ""


@dataclass(slots=True)
class Answer:
    pieces: list[Piece]
    finish: str  # at its natural end: "stop" or "tool_calls"


def token_id(text: str) -> int:
    return 1000 + zlib.crc32(text.encode()) % 50_000


_WORD_PIECES = [Piece(w, token_id(w)) for w in WORDS]


def choice_rng(request: bytes, choice: int, greedy: bool, order: int | None) -> random.Random:
    """A choice's randomness: a function of the request (its body, seed and extras), plus its
    arrival `order` when the request is not deterministic. Greedy choices all say the same."""
    h = hashlib.blake2b(request, digest_size=8)
    h.update(b"|%d" % (0 if greedy else choice))
    if order is not None:
        h.update(b"|order %d" % order)
    return random.Random(int.from_bytes(h.digest(), "big"))


def natural_length(prompt: str, choice: int, greedy: bool) -> int:
    """Where the SIMULATED model would emit EOS: a stable length per prompt (and choice)."""
    h = zlib.crc32(prompt.encode()) + (0 if greedy else 7919 * choice)
    return MIN_ANSWER + h % (MAX_ANSWER - MIN_ANSWER + 1)


def plan(body: Any, sim: SimRequest, rng: random.Random, length: int) -> Answer:
    """What one choice says at its natural end (before output limits and stop strings). A text
    answer under a client's limit runs past it (so it ends "length", as benchmarks expect of
    `max_tokens`: vLLM's own benchmark client sets ignore_eos for this); without a limit, and for
    JSON and tool calls, it ends where the simulated model would (`length` words, or the JSON's end)."""
    if isinstance(body, ChatBody):
        tools = _tools_to_call(body, rng)
        if tools:
            return _pad(_calls(tools, rng), sim, structured=True)
        fmt = body.response_format
        if fmt is not None and fmt.type == "json_object":
            words = "".join(_words(max(1, length - 6), rng.randrange(len(WORDS)))).strip()
            return _pad(Answer(_json_pieces(json.dumps({"answer": words})), "stop"), sim, structured=True)
        if fmt is not None and fmt.type == "json_schema":
            schema = fmt.json_schema.schema if fmt.json_schema and fmt.json_schema.schema is not None else {}
            try:
                value = instance(schema, rng)
            except SchemaUnsupported as e:
                raise Unfit("response_format.json_schema.schema", str(e)) from None
            return _pad(Answer(_json_pieces(json.dumps(value)), "stop"), sim, structured=True)
    count = sim.cap + 1 if sim.limited else length
    return _pad(Answer(_word_pieces(count, rng.randrange(len(WORDS))), "stop"), sim)


def _word_pieces(count: int, first: int) -> list[Piece]:
    """Text tokens: shared immutable pieces, so planning an answer costs a list, not a hash a token."""
    n = len(_WORD_PIECES)
    return [_WORD_PIECES[(first + i) % n] for i in range(count)]


def _words(count: int, first: int) -> list[str]:
    return [WORDS[(first + i) % len(WORDS)] for i in range(count)]


def _pad(answer: Answer, sim: SimRequest, structured: bool = False) -> Answer:
    """min_tokens and ignore_eos: the model may not stop yet, so it goes on: more words of text,
    or whitespace after the JSON (still valid JSON, as a grammar-guided engine would emit)."""
    missing = (sim.cap if sim.ignore_eos else sim.min_tokens) - len(answer.pieces)
    if missing > 0 and structured:
        last = answer.pieces[-1].call if answer.pieces else -1
        answer.pieces += [Piece(" ", token_id(" "), call=last)] * missing
    elif missing > 0:
        start = WORDS.index(answer.pieces[-1].text) + 1 if answer.pieces else 0
        answer.pieces += _word_pieces(missing, start)
    return answer


def _tools_to_call(body: ChatBody, rng: random.Random) -> list[Tool]:
    """tool_choice: none → text; required / named → calls; auto (the default with tools) → a call
    unless the last message is a tool's result, so an agent loop ends with an answer."""
    tools, choice = body.tools or [], body.tool_choice
    if not tools or choice == "none":
        return []
    if choice is not None and not isinstance(choice, str):
        return [next(t for t in tools if t.function.name == choice.function.name)]
    if choice in (None, "auto") and body.messages[-1].role == "tool":
        return []
    first = rng.randrange(len(tools))
    picked = [tools[first]]
    if body.parallel_tool_calls is not False and len(tools) > 1 and rng.random() < 0.5:
        picked.append(tools[(first + 1 + rng.randrange(len(tools) - 1)) % len(tools)])
    return picked


def _calls(tools: list[Tool], rng: random.Random) -> Answer:
    pieces: list[Piece] = []
    for i, tool in enumerate(tools):
        name = tool.function.name
        params = tool.function.parameters if tool.function.parameters is not None else {"type": "object"}
        try:
            args = json.dumps(instance(params, rng), separators=(",", ":"))
        except SchemaUnsupported as e:
            raise Unfit("tools", f"tool {name!r} parameters: {e}") from None
        pieces.append(Piece("", token_id(name), call=i, name=name, id=f"call_{rng.getrandbits(96):024x}"))
        pieces += [Piece(p, token_id(p), call=i) for p in _PIECE.findall(args)]
    return Answer(pieces, "tool_calls")


def _json_pieces(text: str) -> list[Piece]:
    return [Piece(p, token_id(p)) for p in _PIECE.findall(text)]


def logprob_of(mean: float, piece: Piece, top: int, rng: random.Random) -> TokenLogprob:
    """A plausible logprob for a SIMULATED sampled token, around the request's mean, with `top`
    alternatives sharing the rest of the probability mass (so they sum to at most 1)."""
    lp = -(abs(mean) * (0.5 + rng.random()) + 1e-3)
    sampled = TopLogprob(piece.text, lp, list(piece.text.encode()))
    alts: list[TopLogprob] = []
    rest = math.log1p(-math.exp(lp))
    for j, w in enumerate(w for w in WORDS if w != piece.text):
        if len(alts) >= top - 1:
            break
        alts.append(TopLogprob(w, rest - (j + 1) * math.log(2), list(w.encode())))
    tops = sorted([sampled, *alts], key=lambda t: -t.logprob) if top > 0 else []
    return TokenLogprob(piece.text, lp, list(piece.text.encode()), tops)
