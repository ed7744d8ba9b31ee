"""Where a request carries text that a model, or the hosted API behind it, reads: the slots PII
analysis fills and redaction writes back (`edit.py`).

A slot is a path from the body (or from `extra`) to one string. The typed bodies are walked by
`FIELDS`, which says how each field reaches the engine; `NOT_TEXT` names the fields that carry no
text (numbers, flags, enums, the model name the engine replaces), and a unit test fails when a
body gains a field listed in neither. Free-form JSON (a tool's parameter schema, a JSON schema,
every member of `extra` and of `kept`) is walked whole: each string and each object key; a root whose very
bytes the gate found clean under this policy is skipped (an agent resends its tools every turn).
Content parts other than text (image_url, input_audio, file, ...) cannot be analysed: they come
back as `unreadable`, for the gate to refuse.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple

import msgspec

from schemas.codec import MAX_JSON_DEPTH
from schemas.openai import (
    ChatBody,
    CompletionBody,
    EmbeddingBody,
    FunctionCall,
    FunctionDef,
    JsonSchemaFormat,
    Message,
    NamedFunction,
    NamedToolChoice,
    ResponseFormat,
    Tool,
    ToolCall,
)
from schemas.openai_extra import NAMED

_encode = msgspec.json.Encoder().encode
EXTRA = "extra"  # the first element of a path into `extra` (no typed body has such a field)
KEPT = "kept"  # ... into `GenerateRequest.kept` (what the edge stores, and no engine reads)
# Content parts whose every string is text the model reads; any other type is not analysable.
TEXT_PARTS = frozenset({"text", "input_text", "output_text", "refusal"})


class How(Enum):
    TEXT = "text"  # a string, or a list whose strings are texts (stop, prompt, input)
    NAME = "name"  # an identifier: redacted name-safe (OpenAI's name patterns)
    NESTED = "nested"  # a typed struct, or a list of them
    SCHEMA = "schema"  # free-form JSON: every key and every string
    KEYS = "keys"  # a map whose keys are text (logit_bias: token ids, or so a client says)
    CONTENT = "content"  # a message's content: a string, or content parts


T, N, S, J, K, C = How.TEXT, How.NAME, How.NESTED, How.SCHEMA, How.KEYS, How.CONTENT
FIELDS: dict[type, dict[str, How]] = {
    ChatBody: {
        "messages": S,
        "tools": S,
        "tool_choice": S,
        "response_format": S,
        "stop": T,
        "user": T,
        "logit_bias": K,
    },
    Message: {"content": C, "name": N, "refusal": T, "tool_calls": S, "tool_call_id": N},
    ToolCall: {"id": N, "function": S},
    FunctionCall: {"name": N, "arguments": T},
    Tool: {"function": S},
    FunctionDef: {"name": N, "description": T, "parameters": J},
    NamedToolChoice: {"function": S},
    NamedFunction: {"name": N},
    ResponseFormat: {"json_schema": S},
    JsonSchemaFormat: {"name": N, "description": T, "schema": J},
    CompletionBody: {"prompt": T, "suffix": T, "stop": T, "user": T, "logit_bias": K},
    EmbeddingBody: {"input": T, "user": T},
}
_SAMPLING = {
    "model",
    "stream",
    "stream_options",
    "n",
    "temperature",
    "top_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
}
NOT_TEXT: dict[type, set[str]] = {
    ChatBody: _SAMPLING | {"max_tokens", "max_completion_tokens", "logprobs", "top_logprobs", "parallel_tool_calls"},
    Message: {"role"},
    ToolCall: {"type"},
    FunctionCall: set(),
    Tool: {"type"},
    FunctionDef: {"strict"},
    NamedToolChoice: {"type"},
    NamedFunction: set(),
    ResponseFormat: {"type"},
    JsonSchemaFormat: {"strict"},
    CompletionBody: _SAMPLING | {"max_tokens", "logprobs", "echo", "best_of"},
    EmbeddingBody: {"model", "encoding_format", "dimensions"},
}


class Slot(NamedTuple):  # a tuple: a tools-heavy request has hundreds of them
    path: tuple[str | int, ...]  # from the body; (EXTRA, member, ...) into `extra`, (KEPT, ...) `kept`
    root: int  # how much of the path names the field (free-form JSON below it)
    name: bool = False  # an identifier: replaced name-safe
    key: bool = False  # the text is the path's last element: an object's key

    @property
    def param(self) -> str:
        """The field as OpenAI names it: what errors and audits say. Below a free-form root
        (a schema, a member of `extra`) keys are the client's text: never named."""
        if self.path[0] in (EXTRA, KEPT):  # a name of ours names the member; any other is the client's
            return self.path[1] if self.path[1] in NAMED else self.path[0]
        return render(self.path[: self.root])

    @property
    def part(self) -> str:
        """The top-level request field."""
        return self.param.split(".", 1)[0].split("[", 1)[0]

    @property
    def first_index(self) -> int:
        """The first index on the path: the message's, the stop sequence's, the tool's."""
        return next((p for p in self.path if isinstance(p, int)), 0)


@dataclass(slots=True)
class Found:
    # Whether the gate knows these bytes of a free-form root (a schema, a member of `extra`) to
    # hold nothing under this policy: an agent resends the same tools every turn.
    clean: Callable[[bytes], bool] = lambda digest: False
    texts: list[str] = field(default_factory=list)
    slots: list[Slot] = field(default_factory=list)
    # What cannot be analysed: its slot, what it is (for the refusal), what replaces it in a copy.
    unreadable: list[tuple[Slot, str, Any]] = field(default_factory=list)
    roots: list[tuple[bytes, int, int]] = field(default_factory=list)  # digest, its slots [from, to)

    def add(self, text: str, path: tuple[str | int, ...], root: int, name: bool = False, key: bool = False) -> None:
        self.texts.append(text)
        self.slots.append(Slot(path, root, name, key))


def collect(
    body: ChatBody | CompletionBody | EmbeddingBody,
    extra: dict[str, Any],
    clean: Callable[[bytes], bool] | None = None,
    kept: dict[str, Any] | None = None,
) -> Found:
    """Every text of `body`, of `extra` and of `kept` (their members, decoded) with its slot, and
    the parts no analyser reads; free-form roots `clean` knows are skipped."""
    found = Found(clean) if clean is not None else Found()
    _struct(found, body, ())
    for head, members in ((EXTRA, extra), (KEPT, kept or {})):
        for member, value in members.items():
            if member not in NAMED:  # a name of ours is no client text; any other one is
                found.add(member, (head, member), 2, key=True)
            _root(found, value, (head, member), 2)
    return found


def render(path: tuple[str | int, ...]) -> str:
    """('messages', 2, 'name') → 'messages[2].name'."""
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out


def _struct(found: Found, node: msgspec.Struct, path: tuple[str | int, ...]) -> None:
    for name, how in FIELDS[type(node)].items():
        value = getattr(node, name)
        if value is not None:
            _field(found, value, how, (*path, name))


def _field(found: Found, value: Any, how: How, path: tuple[str | int, ...]) -> None:
    root = len(path)
    if how is How.NESTED:
        for i, item in enumerate(value) if isinstance(value, list) else ((None, value),):
            if isinstance(item, msgspec.Struct):  # tool_choice "auto" is no struct
                _struct(found, item, path if i is None else (*path, i))
    elif how is How.TEXT:
        if isinstance(value, str):
            found.add(value, path, root)
        else:  # a list: stop sequences, a prompt, the inputs to embed (token ids skipped)
            for i, item in enumerate(value):
                if isinstance(item, str):
                    found.add(item, (*path, i), root + 1)
    elif how is How.NAME:
        found.add(value, path, root, True)
    elif how is How.SCHEMA:
        _root(found, value, path, root)
    elif how is How.KEYS:
        for k in value:
            found.add(k, (*path, k), root, key=True)
    elif isinstance(value, str):  # How.CONTENT
        found.add(value, path, root)
    else:
        for j, part in enumerate(value):
            _part(found, part, (*path, j))


def _part(found: Found, part: dict[str, Any], path: tuple[str | int, ...]) -> None:
    kind = part.get("type")
    # vLLM reads a part without a type by its keys: only a bare {"text": ...} is text then.
    if kind in TEXT_PARTS or (kind is None and part.keys() <= {"text"}):
        for k, v in part.items():
            if k != "type":
                _json(found, v, (*path, k), len(path), keys=False)
    else:
        what = f"{kind!r} content" if kind else "an untyped content part"
        found.unreadable.append((Slot(path, len(path)), what, {"type": kind} if kind else {}))


def _root(found: Found, value: Any, path: tuple[str | int, ...], root: int) -> None:
    digest = hashlib.blake2b(_encode(value), digest_size=16).digest()
    if found.clean(digest):
        return
    texts, unreadable = len(found.texts), len(found.unreadable)
    _json(found, value, path, root, keys=True)
    if len(found.unreadable) == unreadable:  # one that cannot be read is never clean
        found.roots.append((digest, texts, len(found.texts)))


def _json(found: Found, node: Any, path: tuple[str | int, ...], root: int, *, keys: bool, depth: int = 0) -> None:
    if isinstance(node, str):
        found.add(node, path, root)
    elif depth > MAX_JSON_DEPTH:  # a direct publisher's; the edge refuses such bodies outright
        found.unreadable.append((Slot(path, root), f"JSON nested deeper than {MAX_JSON_DEPTH} levels", None))
    elif isinstance(node, list):
        for i, item in enumerate(node):
            _json(found, item, (*path, i), root, keys=keys, depth=depth + 1)
    elif isinstance(node, dict):
        for k, v in node.items():
            if keys and isinstance(k, str):
                found.add(k, (*path, k), root, key=True)
            _json(found, v, (*path, k), root, keys=keys, depth=depth + 1)
