"""The Responses API's output items as the renderer builds them: a message's content parts
(output_text, refusal), a reasoning item's text, a function call's arguments; each turns into its
JSON as the API shows it."""

from __future__ import annotations

from typing import Any

from schemas.frames import TokenLogprob


def logprob_json(lp: TokenLogprob) -> dict[str, Any]:
    return {
        "token": lp.token,
        "logprob": lp.logprob,
        "bytes": lp.bytes if lp.bytes is not None else list(lp.token.encode()),
        "top_logprobs": [
            {
                "token": t.token,
                "logprob": t.logprob,
                "bytes": t.bytes if t.bytes is not None else list(t.token.encode()),
            }
            for t in lp.top
        ],
    }


class Part:
    """One content part of a message (output_text, refusal) or of a reasoning item."""

    __slots__ = ("kind", "pieces", "logprobs")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.pieces: list[str] = []
        self.logprobs: list[dict[str, Any]] = []

    def json(self) -> dict[str, Any]:
        text = "".join(self.pieces)
        if self.kind == "output_text":
            return {"type": "output_text", "text": text, "annotations": [], "logprobs": self.logprobs}
        if self.kind == "refusal":
            return {"type": "refusal", "refusal": text}
        return {"type": "reasoning_text", "text": text}


class OutputItem:
    __slots__ = ("kind", "id", "index", "parts", "call_id", "name", "arguments", "done")

    def __init__(self, kind: str, item_id: str, index: int) -> None:
        self.kind = kind  # "message" | "function_call" | "reasoning"
        self.id = item_id
        self.index = index
        self.parts: list[Part] = []
        self.call_id = self.name = ""
        self.arguments: list[str] = []
        self.done = False

    def json(self, status: str) -> dict[str, Any]:
        if self.kind == "function_call":
            return {
                "id": self.id,
                "type": "function_call",
                "status": status,
                "call_id": self.call_id,
                "name": self.name,
                "arguments": "".join(self.arguments),
            }
        if self.kind == "reasoning":
            return {
                "id": self.id,
                "type": "reasoning",
                "status": status,
                "summary": [],
                "content": [p.json() for p in self.parts],
            }
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "status": status,
            "content": [p.json() for p in self.parts],
        }
