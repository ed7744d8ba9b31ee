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
    rank: Annotated[int, Meta(ge=0, le=100)]  # 0 is served first
    max_queue_wait_s: Annotated[float, Meta(gt=0)]  # waited longer → expired, never started
    max_tenant_depth: Annotated[int, Meta(ge=1)]  # waiting + running per tenant (JetStream subject cap)
    # Of a worker's slots, with the classes ranked after it (broker/room.py `held_from`): keeps
    # headroom for the classes above it.
    max_slot_share: Annotated[float, Meta(gt=0, le=1)]
    starve_after_s: Annotated[float, Meta(gt=0)]  # a head waiting this long is served ahead of rank
    # Of an engine step's token budget: the class's prompts not yet prefilled at a worker stay
    # under it, so its prefill cannot fill the steps that higher ranks' first tokens wait on.
    max_prefill_share: Annotated[float, Meta(gt=0, le=1)] = 1.0
    # Of the class's slots at a worker: what one tenant may hold there while another is active in
    # the class, so the other's next request starts at once, not when one of the first's ends.
    # 0.9 costs a lone flood nothing (no cap while it is alone), a flood beside others at most
    # 10 %, and leaves 26 of 256 slots (4 of 32). 1.0: no headroom. A tenant whose weight is a
    # larger part of the active tenants' weights holds that part instead (broker/lanes.py).
    max_tenant_share: Annotated[float, Meta(gt=0, le=1)] = 0.9
    # Of the worker's KV cache and of the prompts it may hold unstarted: what one tenant's
    # requests may add to each engine step (the KV it reads, the prefill chunks it computes) while
    # another is active in the class, so the other's first token does not wait on steps the first
    # one made long. None: `max_tenant_share` (0.9 leaves 43k of an 8B model's 427k KV tokens on
    # an H100, ~80 chats of 512 tokens).
    max_tenant_step_share: Annotated[float, Meta(gt=0, le=1)] | None = None

    def slot_cap(self, total_slots: int) -> int:
        return max(1, int(self.max_slot_share * total_slots))

    @property
    def tenant_step_share(self) -> float:
        return self.max_tenant_share if self.max_tenant_step_share is None else self.max_tenant_step_share

    def tenant_slot_cap(self, total_slots: int, share: float | None = None) -> int:
        """Slots one tenant may hold at a worker while another is active in the class: `share`
        of the class's (its `max_tenant_share` unless the lanes give a tenant a larger one)."""
        return max(1, int((self.max_tenant_share if share is None else share) * self.slot_cap(total_slots)))

    def tenant_kv_cap(self, kv_tokens: int, share: float | None = None) -> int | None:
        """KV tokens one tenant's requests of the class may hold at a worker while another is
        active in it (`share`: its step share unless the lanes give a tenant a larger one);
        None: no cap (the share is 1.0, or the worker reports no cache size)."""
        share = self.tenant_step_share if share is None else share
        if share >= 1.0 or kv_tokens <= 0:
            return None
        return max(1, int(share * kv_tokens))

    def prefill_cap(self, step_tokens: int) -> int | None:
        """Prompt tokens the class may have waiting for prefill at one worker; None: no cap."""
        if self.max_prefill_share >= 1.0 or step_tokens <= 0:
            return None
        return max(1, int(self.max_prefill_share * step_tokens))


DEFAULT_CLASSES: tuple[ClassPolicy, ...] = (
    # Half of each engine step per tenant while another is active (weighted tenants take their
    # weight's part): at 256 slots a flood past half the KV cache made every step longer for the
    # neighbour's chat and bought itself no tokens, its steps being compute-bound by then
    # (`loadtest.noisy --cases other-flood`). Its slots stay at 0.9: at 32 slots the steps are
    # short and the flood's sequences are its throughput (half of them cost it a third).
    ClassPolicy(
        "interactive",
        rank=0,
        max_queue_wait_s=30,
        max_tenant_depth=512,
        max_slot_share=1.0,
        starve_after_s=60,
        max_tenant_step_share=0.5,
    ),
    ClassPolicy(
        "standard", rank=1, max_queue_wait_s=300, max_tenant_depth=2048, max_slot_share=0.95, starve_after_s=10
    ),
    # Batch may hold 90% of slots: the rest is headroom an arriving chat finds at once; and
    # 40% of a step's tokens in prompts awaiting prefill (two 6 KB prompts on an 8,192 budget).
    ClassPolicy(
        "batch",
        rank=2,
        max_queue_wait_s=3600,
        max_tenant_depth=20000,
        max_slot_share=0.9,
        starve_after_s=30,
        max_prefill_share=0.4,
    ),
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
