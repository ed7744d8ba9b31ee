"""Raw API keys, prompts and completions never reach logs or metrics (default log level)."""

from __future__ import annotations

import aiohttp
import pytest

from loadtest.processes import LanewayUp

pytestmark = pytest.mark.slow

KEY = "sk-SEEDED-SECRET-KEY-31415"
WRONG_KEY = "sk-WRONG-SECRET-KEY-92653"
PROMPT_MARK = "SEEDED-PROMPT-27182"
COMPLETION_PHRASE = "streams simulated tokens from"  # what the sim engine writes


async def test_secrets_never_reach_logs_or_metrics(tmp_path):
    data = tmp_path / "lw"
    async with LanewayUp(data, KEY, ["--sim-profile", "zero"]) as up:
        body = {
            "model": "laneway-sim",
            "max_tokens": 16,
            "messages": [{"role": "user", "content": f"my secret is {PROMPT_MARK}"}],
        }
        async with aiohttp.ClientSession(base_url=up.url) as http:
            auth = {"Authorization": f"Bearer {KEY}"}
            async with http.post("/v1/chat/completions", json={**body, "stream": True}, headers=auth) as r:
                assert r.status == 200 and (await r.text()).endswith("data: [DONE]\n\n")
            async with http.post("/v1/chat/completions", json=body, headers=auth) as r:
                completion = (await r.json())["choices"][0]["message"]["content"]
                assert COMPLETION_PHRASE in completion  # so its absence from the logs means something
            # Error paths log too: a wrong key, a malformed body, a timed-out request, a disconnect.
            async with http.post(
                "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {WRONG_KEY}"}
            ) as r:
                assert r.status == 401
            async with http.post("/v1/chat/completions", data=f'{{"messages": "{PROMPT_MARK}', headers=auth) as r:
                assert r.status == 400
            async with http.post(
                "/v1/chat/completions", json=body, headers={**auth, "x-laneway-timeout": "0.0001"}
            ) as r:
                assert r.status == 504
            async with http.post(
                "/v1/chat/completions", json={**body, "stream": True, "max_tokens": 5000}, headers=auth
            ) as r:
                await r.content.readline()
            async with http.get("/metrics") as r:
                metrics = await r.text()
    logs = {p: p.read_text(errors="replace") for p in data.rglob("*.log")}
    assert logs, "expected process logs under the data dir"
    for name, text in {**{str(p): t for p, t in logs.items()}, "/metrics": metrics}.items():
        for secret in (KEY, WRONG_KEY, PROMPT_MARK, COMPLETION_PHRASE):
            assert secret not in text, f"{secret!r} leaked into {name}"
