"""The checks that read a whole `GenerateRequest`: its model's context and its deadline. Apart
from the body rules (`checks.py`) because `requests.py` runs those: neither file imports the other."""

from __future__ import annotations

from schemas.checks import MAX_TIMEOUT_S, Invalid
from schemas.errors import ErrorCode
from schemas.requests import GenerateRequest


def check_context(request: GenerateRequest, max_context_tokens: int) -> None:
    """A prompt that leaves the model no room to answer. The count is the estimate quotas use
    (~4 characters a token); engines check the exact count."""
    prompt = request.estimated_prompt_tokens()
    field = "messages" if request.chat is not None else "input" if request.embedding else "prompt"
    if prompt >= max_context_tokens:
        raise Invalid(
            f"this model's context is {max_context_tokens} tokens; the {field} are about {prompt} tokens",
            field,
            ErrorCode.context_length_exceeded,
        )


def check_deadline(request: GenerateRequest, now: float) -> None:
    """A deadline no further off than a client may ask for: a grant, a lane slot and a dedup
    entry are held until it passes."""
    if request.deadline > now + MAX_TIMEOUT_S or request.deadline < request.created_at:
        raise Invalid(f"the deadline must lie between created_at and {MAX_TIMEOUT_S:.0f} s from now", "deadline")
