"""Stage 5: which pool serves this logical model."""

from __future__ import annotations

from collections.abc import Mapping

from broker.config import LogicalModel
from broker.gate import Refusal
from schemas.errors import ErrorCode
from schemas.requests import GenerateRequest


def route(request: GenerateRequest, models: Mapping[str, LogicalModel]) -> str:
    model = models.get(request.model)
    if model is None:
        raise Refusal(ErrorCode.unknown_model, f"the model {request.model!r} does not exist", "model")
    return model.pool
