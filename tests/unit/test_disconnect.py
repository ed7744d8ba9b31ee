"""A service's last step never raises: a server that went first leaves a reset socket behind,
and `Broker.stop` / `Bridge.stop` / `Worker.stop` go on to the end (issue 38)."""

from __future__ import annotations

import nats.errors
import pytest

from core.connect import disconnect


class Conn:
    def __init__(self, connected: bool, fails: BaseException | None) -> None:
        self.is_connected = connected
        self.fails = fails
        self.calls: list[str] = []

    async def drain(self) -> None:
        self.calls.append("drain")
        if self.fails:
            raise self.fails

    async def close(self) -> None:
        self.calls.append("close")
        if self.fails:
            raise self.fails


@pytest.mark.parametrize("fails", [None, ConnectionResetError(104, "reset"), nats.errors.ConnectionClosedError()])
async def test_disconnect_drains_a_live_connection_closes_a_dead_one_and_never_raises(fails) -> None:
    live, dead, told = Conn(True, fails), Conn(False, fails), Conn(True, fails)
    await disconnect(live)
    await disconnect(dead)
    await disconnect(told, drain=False)
    assert (live.calls, dead.calls, told.calls) == (["drain"], ["close"], ["close"])


async def test_anything_else_still_raises() -> None:
    with pytest.raises(ValueError):
        await disconnect(Conn(True, ValueError("a bug")))
