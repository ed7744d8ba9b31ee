"""SIMULATED embeddings for the sim engine: what an `EmbeddingBody` is answered with.

Nothing here is a model. Each input's vector is a deterministic function of the input alone: a
SHAKE-256 stream of its text (or token ids) read as numbers in [-1, 1) and scaled to unit length.
So the same input always gives the same vector (cosine 1), different inputs give different,
practically orthogonal vectors, and nothing about meaning is captured. The simulated model's
native size is `NATIVE_DIMENSIONS`; `dimensions` takes that many leading components and scales
them back to unit length, as Matryoshka models (OpenAI's text-embedding-3) do.

Its cost is a prefill: the engine runs it as one step of prefill tokens (no decode), holding one
slot and its prompt's KV tokens while that step runs.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from schemas.openai import EmbeddingBody
from workers.engine import EngineRequest, UnsupportedRequest
from workers.engines.sim.request import checked_extras

NATIVE_DIMENSIONS = 384  # the simulated model's vector size (a MiniLM-sized model)
_SCALE = 1.0 / 2**31

# vLLM's embedding extras: accepted because the sim honours them, or because they do not change
# a simulated vector.
_HONOURED = {"truncate_prompt_tokens": int}
_NOOP = {"add_special_tokens": bool, "use_activation": bool}


@dataclass(slots=True, frozen=True)
class SimEmbedding:
    """An embedding request the sim accepted."""

    prompt_tokens: int  # all inputs together: what usage reports
    vectors: list[bytes]  # float32 little-endian, one per input, in input order


def accept_embedding(request: EngineRequest, max_model_len: int) -> SimEmbedding:
    """The request's simulated answer, or `UnsupportedRequest` naming what the sim cannot honour."""
    body, rid = request.body, request.request_id
    assert isinstance(body, EmbeddingBody)
    truncate = _extras(request).get("truncate_prompt_tokens")
    assert truncate is None or isinstance(truncate, int)  # _extras checked its kind (_HONOURED)
    if problem := body.check():
        raise UnsupportedRequest(rid, "input", problem)
    dims = body.dimensions or NATIVE_DIMENSIONS
    if dims > NATIVE_DIMENSIONS:
        raise UnsupportedRequest(
            rid, "dimensions", f"this model's embeddings have at most {NATIVE_DIMENSIONS} dimensions; asked for {dims}"
        )
    if truncate is not None and truncate < 1:
        raise UnsupportedRequest(rid, "truncate_prompt_tokens", "truncate_prompt_tokens must be at least 1")
    total, vectors = 0, []
    inputs: Sequence[str | list[int]] = body.inputs  # enumerate() joins a union of lists to Sequence[object]
    for i, item in enumerate(inputs):
        tokens = len(item) if isinstance(item, list) else max(1, math.ceil(len(item) / 4))
        if truncate is not None and tokens > truncate:
            tokens = truncate
            item = item[-truncate:] if isinstance(item, list) else item[-truncate * 4 :]  # vLLM keeps the end
        if tokens > max_model_len:
            raise UnsupportedRequest(
                rid, "input", f"input {i} has {tokens} tokens; this model's maximum context length is {max_model_len}"
            )
        if isinstance(item, list) and not item:
            raise UnsupportedRequest(rid, "input", f"input {i} is empty")
        total += tokens
        vectors.append(vector(item, dims))
    return SimEmbedding(total, vectors)


def vector(item: str | list[int], dims: int = NATIVE_DIMENSIONS) -> bytes:
    """The SIMULATED embedding of one input: a unit float32 vector, little-endian bytes."""
    key = (b"t:" + item.encode()) if isinstance(item, str) else (b"i:" + json.dumps(item).encode())
    raw = array("I", hashlib.shake_256(key).digest(4 * NATIVE_DIMENSIONS))
    values = [x * _SCALE - 1.0 for x in raw[:dims]]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    out = array("f", [v / norm for v in values])
    if out.itemsize != 4:  # pragma: no cover - every CPython platform
        raise RuntimeError("array('f') is not float32 here")
    if sys.byteorder != "little":  # pragma: no cover - the wire is little-endian
        out.byteswap()
    return out.tobytes()


def _extras(request: EngineRequest) -> dict[str, object]:
    return checked_extras(request, {**_HONOURED, **_NOOP}, {}, "the simulated embedding model")
