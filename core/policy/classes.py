"""Priority classes: the typed policy a class carries, its defaults, and validation.

Stored as JSON documents in the `lw_classes` KV bucket (one key per class) so operators can
change them live; `ClassPolicy.decode` is the one place a document becomes a policy.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from schemas.requests import Token


class ClassPolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: Token
    rank: Annotated[int, Meta(ge=0, le=100)]                 # 0 is served first
    max_queue_wait_s: Annotated[float, Meta(gt=0)]           # waited longer → expired, never started
    max_tenant_depth: Annotated[int, Meta(ge=1)]             # waiting + running per tenant (JetStream subject cap)
    max_slot_share: Annotated[float, Meta(gt=0, le=1)]       # of a worker's slots; keeps headroom for higher ranks
    starve_after_s: Annotated[float, Meta(gt=0)]             # a head waiting this long is served ahead of rank
    # Of an engine step's token budget: the class's prompts not yet prefilled at a worker stay
    # under it, so its prefill cannot fill the steps that higher ranks' first tokens wait on.
    max_prefill_share: Annotated[float, Meta(gt=0, le=1)] = 1.0

    def slot_cap(self, total_slots: int) -> int:
        return max(1, int(self.max_slot_share * total_slots))

    def prefill_cap(self, step_tokens: int) -> int | None:
        """Prompt tokens the class may have waiting for prefill at one worker; None: no cap."""
        if self.max_prefill_share >= 1.0 or step_tokens <= 0:
            return None
        return max(1, int(self.max_prefill_share * step_tokens))


DEFAULT_CLASSES: tuple[ClassPolicy, ...] = (
    ClassPolicy("interactive", rank=0, max_queue_wait_s=30, max_tenant_depth=512,
                max_slot_share=1.0, starve_after_s=60),
    ClassPolicy("standard", rank=1, max_queue_wait_s=300, max_tenant_depth=2048,
                max_slot_share=0.95, starve_after_s=10),
    # Batch may hold 90% of slots: the rest is headroom an arriving chat finds at once; and
    # 40% of a step's tokens in prompts awaiting prefill (two 6 KB prompts on an 8,192 budget).
    ClassPolicy("batch", rank=2, max_queue_wait_s=3600, max_tenant_depth=20000,
                max_slot_share=0.9, starve_after_s=30, max_prefill_share=0.4),
)

_decode = msgspec.json.Decoder(ClassPolicy).decode
encode = msgspec.json.Encoder().encode


class BadClassPolicy(ValueError):
    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"class {name!r}: {reason}")
        self.name = name
        self.reason = reason


def decode(name: str, document: bytes) -> ClassPolicy:
    try:
        policy = _decode(document)
    except msgspec.DecodeError as exc:  # ValidationError included: it names the field
        raise BadClassPolicy(name, str(exc)) from None
    if policy.name != name:
        raise BadClassPolicy(name, f"document names class {policy.name!r}")
    return policy
