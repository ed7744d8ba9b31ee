"""Resumable streams attacked under `laneway up`, with the users it generates: globex holding
acme's event id (a leaked log line, a shared proxy) gets the same 404 as for a made-up id and no
byte of the stream, over HTTP; globex's own NATS user cannot ask a bridge for the stream on the
resume subject, nor listen to what bridges relay there (the server refuses both).

Seen failing without each fix: with the tenant left out of `Resumes.find`, the HTTP attack got
200 and acme's tokens; with the resume subject imported into the tenant accounts and allowed to
their users, no permissions error came (tests/integration/test_nats_isolation.py, the same way).
"""

from __future__ import annotations

import aiohttp
import nats
import pytest

from schemas import codec
from schemas.resume import ResumeAsk
from schemas.subjects import Subjects
from tests.security.conftest import KEYS
from tests.wait import eventually

pytestmark = pytest.mark.timeout(300)

S = Subjects("lw")
CHAT = "/v1/chat/completions"


def auth(tenant: str, event_id: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {KEYS[tenant]}", "x-laneway-resumable": "true"}
    if event_id is not None:
        headers["Last-Event-ID"] = event_id
    return headers


async def acmes_stream_cut(http: aiohttp.ClientSession, url: str) -> tuple[str, bytes]:
    """acme streams, reads a few events and drops the connection: its last id and what it read."""
    body = {
        "model": "laneway-sim",
        "stream": True,
        "max_tokens": 300,
        "messages": [{"role": "user", "content": "the merger terms"}],
    }
    resp = await http.post(url + CHAT, json=body, headers=auth("acme"))
    assert resp.status == 200
    seen, last_id = b"", ""
    while seen.count(b"data: ") < 3:
        line = await resp.content.readline()
        seen += line
        if line.startswith(b"id: "):
            last_id = line[4:].strip().decode()
    resp.close()
    return last_id, seen


async def test_another_tenants_key_with_a_valid_id_gets_404_and_no_byte(up):
    async with aiohttp.ClientSession() as http:
        last_id, _ = await acmes_stream_cut(http, up.url)
        edge, _, n = last_id.split(".")
        async with http.post(up.url + CHAT, json={}, headers=auth("globex", f"{edge}.{'0' * 32}.{n}")) as resp:
            unknown = (resp.status, await resp.json())
        async with http.post(up.url + CHAT, json={}, headers=auth("globex", last_id)) as resp:
            raw = await resp.read()
            stolen = (resp.status, await resp.json())
        assert unknown[0] == 404 and stolen == unknown, (stolen, unknown)
        assert b"data:" not in raw and b"choices" not in raw
        # acme, its owner, still gets the rest of it.
        async with http.post(up.url + CHAT, json={}, headers=auth("acme", last_id)) as resp:
            assert resp.status == 200 and (await resp.read()).endswith(b"data: [DONE]\n\n")


async def test_a_tenants_nats_user_cannot_reach_the_resume_subject(up):
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc).lower())

    async with aiohttp.ClientSession() as http:
        last_id, _ = await acmes_stream_cut(http, up.url)
    edge, request_id, n = last_id.split(".")
    globex = await up.connect_nats("tenant-globex", error_cb=on_error)
    relayed: list[nats.aio.msg.Msg] = []
    try:

        async def got(msg) -> None:
            relayed.append(msg)

        await globex.subscribe(S.resume_all, cb=got)
        ask = ResumeAsk("acme", request_id, int(n), CHAT, S.resume_reply(edge, "stolen"))
        await globex.publish(S.resume(edge), codec.encode(ask))
        await globex.flush()
        assert await eventually(
            lambda: sum("permissions violation" in e and "lw.resume" in e for e in errors) >= 2, timeout=20
        ), errors
    finally:
        await globex.close()
    assert relayed == []
