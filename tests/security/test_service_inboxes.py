"""A service user reads only its own replies, not every other service's.

Before issue 20 every service user (and ops) could subscribe to `_INBOX.>`: one worker read the
answers to every other process's requests — the broker's JetStream fetches (every tenant's
queued prompts), the bridge's and ops's KV reads, other workers' batches. Now each process
replies on `_INBOX_<its user>` and its generated permissions allow that prefix alone. Tried with
the generated `svc-worker` login under `laneway up`, while a tenant's request is served.
"""

from __future__ import annotations

import aiohttp
import pytest

from schemas.subjects import service_inbox
from tests.security.conftest import KEYS
from tests.wait import eventually

pytestmark = pytest.mark.timeout(300)

OTHERS = ["_INBOX.>", *(f"{service_inbox(user)}.>" for user in ("svc-broker", "svc-bridge", "ops"))]


async def test_a_worker_cannot_read_the_other_services_replies(up):
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    spy = await up.connect_nats("svc-worker", inbox_prefix="_INBOX", error_cb=on_error)
    heard = []
    try:
        for subject in OTHERS:

            async def overheard(msg, subject=subject) -> None:
                heard.append(subject)

            await spy.subscribe(subject, cb=overheard)
        async with aiohttp.ClientSession(base_url=up.url) as http:
            body = {"model": "laneway-sim", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
            async with http.post(
                "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEYS['acme']}"}
            ) as resp:
                assert resp.status == 200, await resp.text()

        def refused(subject: str) -> bool:
            return any("permissions violation" in e.lower() and subject.lower() in e.lower() for e in errors)

        assert await eventually(lambda: all(refused(s) for s in OTHERS)), errors
        await spy.flush()
        assert heard == []
    finally:
        await spy.close()


async def test_a_service_still_gets_its_own_replies(up):
    worker = await up.connect_nats("svc-worker")  # its own prefix, as `laneway worker` uses
    try:
        info = await worker.jetstream().stream_info("KV_lw_routing")  # a request and its reply
        assert info.config.name == "KV_lw_routing"
    finally:
        await worker.close()
