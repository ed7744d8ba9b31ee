"""A batch line's last moments: what its endpoint says near the end of the completion window
decides whether the line expires (not executed in time) or failed (the endpoint's answer)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import msgspec
import pytest

from bridge.batch import lines as jsonl
from bridge.batch.run import BatchRun
from bridge.errors import EdgeError
from core.policy.tenants import Tenant
from schemas.batches import Batch, BatchState, RequestCounts
from schemas.errors import ErrorCode

pytestmark = pytest.mark.asyncio

ENDPOINT = "/v1/chat/completions"


class Refusing:
    """An endpoint that refuses every try with one code, counting the tries."""

    def __init__(self, code: ErrorCode) -> None:
        self.code = code
        self.tries = 0

    async def complete(self, tenant, body, request_id, klass, deadline) -> bytes:
        self.tries += 1
        raise EdgeError(self.code, "refused")


class Recorded:
    def __init__(self) -> None:
        self.lines: list = []

    async def record_line(self, tenant, batch_id, result) -> None:
        self.lines.append(result)


def run_of(endpoint: Refusing, window_s: float) -> tuple[BatchRun, Recorded]:
    store = Recorded()
    runner = SimpleNamespace(
        store=store,
        endpoints={ENDPOINT: endpoint},
        catalogue=SimpleNamespace(tenants={"acme": Tenant("acme")}),
        edge_id="edge-1",
        klass="batch",
    )
    batch = Batch(
        "batch_1", ENDPOINT, "file-1", "24h", "in_progress", 0, time.time() + window_s, RequestCounts(total=1)
    )
    # expires_at is whole seconds on the wire; a float here puts the window's end inside the test.
    return BatchRun(runner, BatchState("acme", batch), None), store  # type: ignore[arg-type]


def a_line() -> jsonl.InputLine:
    return jsonl.InputLine("line-0", "POST", ENDPOINT, msgspec.Raw(b'{"model": "m", "messages": []}'))


@pytest.mark.parametrize("code", [ErrorCode.deadline_exceeded, ErrorCode.overloaded])
async def test_a_line_refused_for_now_at_the_windows_end_expires_rather_than_fails(code: ErrorCode) -> None:
    # The window ends 0.3 s from now: sooner than the first backoff (0.5 s). Before, an overloaded
    # line failed with its 503 here, and a deadline its class's queue or another process's timer
    # called a moment before this clock read the window's end failed with a 504: both are lines
    # the window ended, and belong in the error file as `batch_expired`.
    endpoint = Refusing(code)
    run, store = run_of(endpoint, window_s=0.3)
    await asyncio.wait_for(run._line(0, a_line()), timeout=5)
    assert store.lines == [] and run.done == {}
    assert endpoint.tries >= 2  # tried again while the window was open


async def test_a_line_the_endpoint_refuses_for_good_fails_with_its_answer() -> None:
    endpoint = Refusing(ErrorCode.invalid_request)
    run, store = run_of(endpoint, window_s=60)
    await run._line(0, a_line())
    (result,) = store.lines
    out = msgspec.json.decode(result.output)
    assert result.failed and endpoint.tries == 1
    assert out["error"] is None and out["response"]["status_code"] == 400
