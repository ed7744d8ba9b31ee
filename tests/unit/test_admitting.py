"""Admissions side by side (`broker/admitting.py`): tenants never wait for each other, a tenant's
admissions are bounded and start in arrival order, and one request id is admitted once at a time."""

from __future__ import annotations

import asyncio

from broker.admitting import Admitting
from tests.wait import eventually


class Gates:
    """Admissions that run until the test opens their gate, recording when each started."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.gates: dict[str, asyncio.Event] = {}

    def admit(self, name: str):
        gate = self.gates.setdefault(name, asyncio.Event())

        async def run() -> None:
            self.started.append(name)
            await gate.wait()

        return run


async def test_a_tenant_stuck_in_the_gate_holds_up_no_other_tenant() -> None:
    admitting, g = Admitting(per_tenant=2), Gates()
    for i in range(10):
        admitting.submit("acme", f"a{i}", 0, g.admit(f"a{i}"))
    admitting.submit("globex", "g0", 0, g.admit("g0"))
    assert await eventually(lambda: "g0" in g.started)
    assert g.started[:2] == ["a0", "a1"] and "a2" not in g.started  # acme: two at once
    assert len(admitting) == 11
    for name in [f"a{i}" for i in range(10)] + ["g0"]:
        g.gates[name].set()
    await admitting.wait_idle()
    assert [n for n in g.started if n.startswith("a")] == [f"a{i}" for i in range(10)]  # in arrival order
    assert len(admitting) == 0


async def test_one_request_id_is_admitted_once_at_a_time() -> None:
    admitting, g = Admitting(per_tenant=8), Gates()
    admitting.submit("acme", "same", 0, g.admit("first"))
    admitting.submit("acme", "same", 0, g.admit("copy"))
    admitting.submit("acme", "other", 0, g.admit("other"))
    assert await eventually(lambda: "other" in g.started)
    assert "copy" not in g.started  # behind the first, whatever the room
    g.gates["first"].set()
    assert await eventually(lambda: "copy" in g.started)
    g.gates["copy"].set()
    g.gates["other"].set()
    await admitting.wait_idle()


async def test_a_failed_admission_is_logged_and_frees_its_place(caplog) -> None:
    admitting, g = Admitting(per_tenant=1), Gates()

    async def broken() -> None:
        raise RuntimeError("the gate broke")

    admitting.submit("acme", "a0", 0, broken)
    admitting.submit("acme", "a1", 0, g.admit("a1"))
    assert await eventually(lambda: "a1" in g.started)
    assert "admitting a request of acme failed" in caplog.text
    g.gates["a1"].set()
    await admitting.wait_idle()


async def test_a_tenants_chat_behind_its_own_batch_flood_is_admitted_next() -> None:
    """The door's order is the lanes': a lower rank number first, arrival order within a rank."""
    admitting, g = Admitting(per_tenant=2), Gates()
    for i in range(50):
        admitting.submit("acme", f"batch{i}", 2, g.admit(f"batch{i}"))
    admitting.submit("acme", "standard", 1, g.admit("standard"))
    admitting.submit("acme", "chat", 0, g.admit("chat"))
    assert await eventually(lambda: g.started == ["batch0", "batch1"])
    g.gates["batch0"].set()
    assert await eventually(lambda: len(g.started) == 3)
    assert g.started[2] == "chat"  # not batch2: the chat arrived 52nd
    g.gates["batch1"].set()
    assert await eventually(lambda: len(g.started) == 4)
    assert g.started[3] == "standard"
    for gate in g.gates.values():
        gate.set()
    await admitting.wait_idle()
    assert g.started[4:] == [f"batch{i}" for i in range(2, 50)]
