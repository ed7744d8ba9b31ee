"""A worker's room while one pull's batch fills it, and whether an item fits there. Pure, no I/O.

The lanes (broker/lanes.py) choose what goes next and list the rules; this module holds the
worker's side of them: its slots and KV budget, each class's slots and unstarted prompts, and
what each tenant of a class holds (for the tenants' headroom). `take` counts a chosen item in,
so the next choice of the same batch sees it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from core.policy.classes import ClassPolicy

# A worker's unstarted prompts of a class and those above it, at most (in engine steps' tokens):
# two steps keep a chunked prefill busy; a chat dispatched behind them starts within about that.
QUEUED_PREFILL_STEPS = 2


# The engine's priority (lower first; vLLM's and the sim's waiting queue and preemption order) of
# a dispatched request: its class's rank first, then how many slots its tenant holds of the class
# at the worker, so the engine serves its queue as the lanes share a class, not in arrival order.
TENANT_SPREAD = 10_000


def engine_priorities(
    items: Sequence[Wants], tenant_slots: dict[str, dict[str, int]], rank: Callable[[str], int]
) -> list[int]:
    """Each item's engine priority, counting the items before it in the batch as held."""
    held = {klass: dict(tenants) for klass, tenants in tenant_slots.items()}
    priorities = []
    for item in items:
        slots = held.setdefault(item.klass, {})
        priorities.append(rank(item.klass) * TENANT_SPREAD + min(slots.get(item.tenant, 0), TENANT_SPREAD - 1))
        slots[item.tenant] = slots.get(item.tenant, 0) + item.slots
    return priorities


class Wants(Protocol):
    """What a `Room` reads of an item (`broker.waiting.Item`)."""

    tenant: str
    klass: str
    cost: int
    slots: int
    prompt: int


def held_from(running: Mapping[str, int], policy: ClassPolicy, rank: Callable[[str], int | None]) -> int:
    """Slots held by `policy`'s class and the classes ranked after it (one `rank` does not know,
    too): what the class's slot share bounds. Each lower class under a share of its own left the
    classes above them nothing together: batch at 0.9 and standard at 0.95 of 32 slots held 28 + 4."""
    return sum(n for name, n in running.items() if (r := rank(name)) is None or r >= policy.rank)


def class_cap(policy: ClassPolicy, total_slots: int, reserve: int = 0, top_rank: int | None = None) -> int:
    """The most slots `policy`'s class, with those after it, may hold at a worker: its share, and
    for a class below the top one (`top_rank`), the slots less `reserve`, what the top class's
    recent bursts there ask to keep free (broker/headroom.py)."""
    cap = policy.slot_cap(total_slots)
    if reserve and top_rank is not None and policy.rank > top_rank:
        return max(1, min(cap, total_slots - reserve))
    return cap


def unranked(klass: str) -> int | None:
    """No class known: each counts as ranked after any other."""
    return None


@dataclass(slots=True)
class Room:
    free_slots: int
    token_budget: int  # KV tokens still free
    total_slots: int
    held: dict[str, int]  # slots per class
    pending: dict[str, int]  # prompt tokens accepted, not yet started, per class
    step_tokens: int = 0  # the engine's tokens per step; 0: unknown, no prefill caps
    kv_tokens: int = 0  # the whole KV cache; 0: unknown, no KV share for tenants
    tenant_slots: dict[str, dict[str, int]] = field(default_factory=dict)  # class → tenant → slots
    tenant_tokens: dict[str, dict[str, int]] = field(default_factory=dict)  # class → tenant → KV tokens
    tenant_prefill: dict[str, dict[str, int]] = field(default_factory=dict)  # class → tenant → prompts unstarted
    empty: bool = False  # it held nothing when the pull came: its first item always goes
    # The pool's balance (broker/balance.py): whether an item may join, the worker holding n with it.
    balanced: Callable[[ClassPolicy, Wants, int], bool] | None = None
    rank: Callable[[str], int | None] = unranked  # a class's rank (None: unknown, served last)
    reserve: int = 0  # slots the classes below the top one leave free here (broker/headroom.py)
    top_rank: int | None = None

    @classmethod
    def of(
        cls,
        *,
        free_slots: int,
        token_budget: int,
        total_slots: int,
        running: dict[str, int],
        step_tokens: int = 0,
        prefill: dict[str, int] | None = None,
        kv_tokens: int = 0,
        tenant_slots: dict[str, dict[str, int]] | None = None,
        tenant_tokens: dict[str, dict[str, int]] | None = None,
        tenant_prefill: dict[str, dict[str, int]] | None = None,
        balanced: Callable[[ClassPolicy, Wants, int], bool] | None = None,
        rank: Callable[[str], int | None] = unranked,
        reserve: int = 0,
        top_rank: int | None = None,
    ) -> Room:
        """From a credit's fields, copied: `take` changes the room, never the credit."""
        return cls(
            free_slots,
            token_budget,
            total_slots,
            dict(running),
            dict(prefill or {}),
            step_tokens,
            kv_tokens,
            {k: dict(v) for k, v in (tenant_slots or {}).items()},
            {k: dict(v) for k, v in (tenant_tokens or {}).items()},
            {k: dict(v) for k, v in (tenant_prefill or {}).items()},
            empty=sum(running.values()) == 0,
            balanced=balanced,
            rank=rank,
            reserve=reserve,
            top_rank=top_rank,
        )

    def fits(self, policy: ClassPolicy, item: Wants, ahead: int) -> bool:
        """The worker's room, the class's slot share (with the classes after it), the prefill caps
        and the pool's balance. `ahead`: the unstarted prompt tokens of the item's class and
        higher ones that it would queue behind."""
        room = min(self.free_slots, self.cap(policy) - held_from(self.held, policy, self.rank))
        step = self.step_tokens
        return (
            item.cost <= self.token_budget
            and item.slots <= room
            and self._prefill_fits(policy, item)
            and (step <= 0 or ahead == 0 or ahead + item.prompt <= QUEUED_PREFILL_STEPS * step)
            and (self.balanced is None or self.balanced(policy, item, sum(self.held.values())))
        )

    def cap(self, policy: ClassPolicy) -> int:
        """`class_cap` at this worker."""
        return class_cap(policy, self.total_slots, self.reserve, self.top_rank)

    def queued_ahead(self, policy: ClassPolicy, rank: Callable[[str], int | None]) -> int:
        """Unstarted prompt tokens here that an item of `policy`'s class would queue behind in the
        engine: those of its rank or a higher one (of a class `rank` does not know, too)."""
        total = 0
        for name, tokens in self.pending.items():
            other = rank(name)
            if other is None or other <= policy.rank:
                total += tokens
        return total

    def within_tenant_share(self, policy: ClassPolicy, item: Wants, slot_share: float, step_share: float) -> bool:
        """Whether the item's tenant, with it, stays within `slot_share` of the class's slots here,
        and within `step_share` of the KV cache and of the prompts a worker may hold unstarted
        (`QUEUED_PREFILL_STEPS`): a neighbour's burst of long prompts then fills no more of the
        steps another tenant's first token waits on than its share. A tenant holding nothing of
        the class here may always take one."""
        slots = self.tenant_slots.get(policy.name, {}).get(item.tenant, 0)
        if slots == 0:
            return True
        if slots + item.slots > policy.tenant_slot_cap(self.total_slots, slot_share):
            return False
        pending = self.tenant_prefill.get(policy.name, {}).get(item.tenant, 0)
        if (
            self.step_tokens > 0
            and pending > 0
            and pending + item.prompt > step_share * QUEUED_PREFILL_STEPS * self.step_tokens
        ):
            return False
        kv_cap = policy.tenant_kv_cap(self.kv_tokens, step_share)
        tokens = self.tenant_tokens.get(policy.name, {}).get(item.tenant, 0)
        return kv_cap is None or tokens + item.cost <= kv_cap

    def take(self, item: Wants) -> None:
        self.free_slots -= item.slots
        self.token_budget -= item.cost
        self.held[item.klass] = self.held.get(item.klass, 0) + item.slots
        self.pending[item.klass] = self.pending.get(item.klass, 0) + item.prompt
        slots = self.tenant_slots.setdefault(item.klass, {})
        slots[item.tenant] = slots.get(item.tenant, 0) + item.slots
        tokens = self.tenant_tokens.setdefault(item.klass, {})
        tokens[item.tenant] = tokens.get(item.tenant, 0) + item.cost
        prefill = self.tenant_prefill.setdefault(item.klass, {})
        prefill[item.tenant] = prefill.get(item.tenant, 0) + item.prompt

    def _prefill_fits(self, policy: ClassPolicy, item: Wants) -> bool:
        cap = policy.prefill_cap(self.step_tokens)
        queued = self.pending.get(policy.name, 0)
        return cap is None or queued == 0 or queued + item.prompt <= cap
