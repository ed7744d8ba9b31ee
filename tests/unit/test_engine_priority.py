"""The engine's priority of a dispatched request: class rank first, then how much of the class
its tenant holds at the worker, so an engine's waiting queue (vLLM's and the sim's, served by
priority, then arrival) shares a class between tenants as the lanes do, not by arrival."""

from __future__ import annotations

from dataclasses import dataclass

from broker.room import TENANT_SPREAD, engine_priorities

RANKS = {"interactive": 0, "batch": 2}


@dataclass
class Item:
    tenant: str
    klass: str
    slots: int = 1
    cost: int = 0
    prompt: int = 0


def test_a_tenant_holding_less_of_the_class_comes_first_and_a_class_above_before_all():
    held = {"interactive": {"globex": 230}}
    batch = [
        Item("globex", "interactive"),
        Item("acme", "interactive"),
        Item("acme", "interactive"),
        Item("acme", "batch"),
    ]
    assert engine_priorities(batch, held, RANKS.__getitem__) == [230, 0, 1, 2 * TENANT_SPREAD]
    assert held == {"interactive": {"globex": 230}}, "the credit's counts are left as they were"


def test_a_tenant_holding_more_than_the_spread_still_stays_in_its_class():
    held = {"interactive": {"globex": 3 * TENANT_SPREAD}}
    [flood] = engine_priorities([Item("globex", "interactive")], held, RANKS.__getitem__)
    [nightly] = engine_priorities([Item("acme", "batch")], {}, RANKS.__getitem__)
    assert flood < nightly
