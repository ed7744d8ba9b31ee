"""An embedding request's answer: OpenAI's `list` of `embedding` objects, floats or base64."""

from __future__ import annotations

import base64
from array import array

import orjson

from schemas.frames import Delta, Finished
from schemas.requests import GenerateRequest


def floats(vector: bytes) -> list[float]:
    """float32 little-endian bytes → Python floats (array reads native order: this is x86/ARM LE)."""
    return array("f", vector).tolist()


class EmbeddingRenderer:
    def __init__(self, generate: GenerateRequest) -> None:
        body = generate.embedding
        assert body is not None
        self.model = generate.model
        self.base64 = body.encoding_format == "base64"

    def add(self, delta: Delta) -> None:
        pass  # an embedding arrives whole, in its Finished entry

    def body(self, finished: Finished) -> bytes:
        data = [
            {"object": "embedding", "index": i, "embedding": base64.b64encode(v).decode() if self.base64 else floats(v)}
            for i, v in enumerate(finished.vectors)
        ]
        tokens = finished.usage.prompt_tokens
        return orjson.dumps(
            {
                "object": "list",
                "data": data,
                "model": self.model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )
