"""No process outlives its parent: a SIGKILLed broker takes its Presidio pool with it, and a
SIGKILLed `laneway up` takes nats-server, broker, worker and bridge with it."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from loadtest.processes import LanewayUp, parents, stat_fields
from tests.wait import eventually

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG and /proc are Linux's"),
]


def children_of(pid: int) -> set[int]:
    return {child for child, parent in parents().items() if parent == pid}


def alive(pids: set[int]) -> set[int]:
    found = set()
    for pid in pids:
        try:
            if stat_fields(pid)[0] != "Z":
                found.add(pid)
        except OSError:
            pass
    return found


async def test_killed_parents_leave_no_orphans(tmp_path):
    pytest.importorskip("presidio_analyzer")
    up = LanewayUp(tmp_path / "lw", "sk-orphans", ["--pii", "regex"])
    await up.__aenter__()
    try:
        [broker] = up.role_pids("broker")
        # The broker's PII stage runs in a process pool: its processes are the broker's children.
        assert await eventually(lambda: len(children_of(broker)) >= 1, timeout=120)
        pool = children_of(broker)
        os.kill(broker, signal.SIGKILL)
        assert await eventually(lambda: not alive(pool), timeout=60), f"pool left behind: {alive(pool)}"

        stack = set(up.pids()) | {up.proc.pid}
        assert await eventually(lambda: up.role_pids("broker") not in ([], [broker]), timeout=60)
        assert await eventually(lambda: len(children_of(up.role_pids("broker")[0])) >= 1, timeout=120)
        stack |= set(up.pids()) | children_of(up.role_pids("broker")[0])
        up.proc.kill()  # SIGKILL: `up` cannot stop anything itself
        await up.proc.wait()
        assert await eventually(lambda: not alive(stack), timeout=60), f"left behind: {alive(stack)}"
    finally:
        if up.proc.returncode is None:
            await up.__aexit__(None, None, None)
