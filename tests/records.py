"""Records as Laneway writes them, for tests that read them: fields a test does not name hold
ordinary values."""

from __future__ import annotations

from typing import Any

from schemas.usage import Usage


def usage_record(request_id: str = "r", **fields: Any) -> Usage:
    record: dict[str, Any] = dict(
        request_id=request_id,
        tenant="acme",
        klass="interactive",
        model="m",
        served_model="m",
        pool="sim",
        worker_id="w",
        prompt_tokens=3,
        completion_tokens=5,
        finish_reason="stop",
        queued_s=0.0,
        ttft_s=0.1,
        total_s=0.2,
        finished_at=1.0,
    )
    return Usage(**(record | fields))
