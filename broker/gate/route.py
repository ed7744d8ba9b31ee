"""Stage 5: which pool serves this request.

A logical model named by the live rule set (`lw_routing/rules`) is routed by its rules against
live pool health (spilling to the hosted pool when self-hosted ones are down or saturated);
any other model maps to its pool through the settings' `models` table.
"""

from __future__ import annotations

from collections.abc import Mapping

from core.policy.refusal import Refusal
from core.routing import classifier
from core.routing.rules import Decision, PoolHealth, Reason, RuleSet, decide_request, escalated_decision
from core.settings import LogicalModel
from schemas.errors import ErrorCode
from schemas.requests import GenerateRequest


def adapter_of(request: GenerateRequest, models: Mapping[str, LogicalModel], rules: RuleSet | None = None) -> str:
    """The LoRA adapter of a models-table model ("" for none, and for a rule-routed model)."""
    if rules is not None and rules.serves(request.model):
        return ""
    model = models.get(request.model)
    return model.adapter if model is not None else ""


def route(
    request: GenerateRequest,
    models: Mapping[str, LogicalModel],
    rules: RuleSet | None = None,
    health: Mapping[str, PoolHealth] | None = None,
) -> Decision:
    if rules is not None and rules.serves(request.model):
        decide = escalated_decision if request.escalated else decide_request
        return decide(request, rules, health or {}, classifier.intent_of)
    model = models.get(request.model)
    if model is None or not model.serves(request.tenant):  # a direct publisher meets the bridge's rule here
        raise Refusal(ErrorCode.unknown_model, f"the model {request.model!r} does not exist", "model")
    return Decision(model.pool, "models", Reason.WEIGHTED)
