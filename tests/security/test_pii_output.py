"""Model output is redacted by the tenant's PII policy, on `laneway up` with its defaults (PII on).

Before, the gate redacted only what reached the model: PII the model produced itself (recalled
from training data, made up, or put together from the parts of a redacted prompt) streamed to the
client, into the response cache, and to a tenant's own NATS client, raw. The simulated model
writes such PII on cue: a JSON schema's `"format": "email"` or `"ipv4"` makes it write
`sim@example.com` or `192.0.2.7`, and no PII is in the request itself.

acme has the default policy (output redacted); globex turned it off (`pii = { output = false }`),
which shows the same request does produce the raw values, so a test here can fail.
"""

from __future__ import annotations

import hashlib
import json

import msgspec
import openai
import pytest

from loadtest.processes import LanewayUp
from schemas.frames import Delta
from schemas.openai import JsonSchemaFormat, ResponseFormat
from tests.requests import chat
from tests.security.conftest import KEYS
from tests.security.publisher import Publisher
from tests.wait import eventually

pytestmark = pytest.mark.timeout(600)

EMAIL, IP = "sim@example.com", "192.0.2.7"  # what the sim writes for those formats
SCHEMA = {
    "type": "object",
    "properties": {"contact": {"type": "string", "format": "email"}},
    "required": ["contact"],
    "additionalProperties": False,
}
TOOL = {
    "type": "function",
    "function": {
        "name": "block_address",
        "description": "Block a client address at the firewall.",
        "parameters": {
            "type": "object",
            "properties": {"address": {"type": "string", "format": "ipv4"}},
            "required": ["address"],
        },
    },
}
SETTINGS = f"""
[tenants.acme]
api_key_sha256 = ["{hashlib.sha256(KEYS["acme"].encode()).hexdigest()}"]

[tenants.globex]
api_key_sha256 = ["{hashlib.sha256(KEYS["globex"].encode()).hexdigest()}"]
pii = {{ output = false }}

[models.laneway-sim]
pool = "sim"
"""


@pytest.fixture(scope="module")
async def up(tmp_path_factory):
    root = tmp_path_factory.mktemp("pii-output")
    (root / "settings.toml").write_text(SETTINGS)
    async with LanewayUp(root / "lw", KEYS["acme"], ["--settings", str(root / "settings.toml")]) as stack:
        assert "PII         on (Presidio" in stack.banner
        yield stack


def client(up: LanewayUp, tenant: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{up.url}/v1", api_key=KEYS[tenant], max_retries=0)


def json_answer() -> dict:
    return {
        "model": "laneway-sim",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "Who should the customer write to?"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "contact", "schema": SCHEMA}},
    }


async def streamed_text(up: LanewayUp, tenant: str) -> str:
    stream = await client(up, tenant).chat.completions.create(stream=True, **json_answer())
    return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])


async def test_an_email_the_model_writes_is_redacted_in_the_stream(up):
    text = await streamed_text(up, "acme")
    assert EMAIL not in text and "<EMAIL_ADDRESS>" in text
    assert json.loads(text) == {"contact": "<EMAIL_ADDRESS>"}  # still the JSON the schema asked for
    assert EMAIL in await streamed_text(up, "globex")  # the control: its policy lets it through


async def test_tool_call_arguments_are_redacted_in_a_whole_answer(up):
    async def arguments(tenant: str) -> str:
        answer = await client(up, tenant).chat.completions.create(
            model="laneway-sim",
            max_tokens=64,
            tools=[TOOL],
            tool_choice="required",
            messages=[{"role": "user", "content": "Block the address that attacked us."}],
        )
        return answer.choices[0].message.tool_calls[0].function.arguments

    acme = await arguments("acme")
    assert IP not in acme and json.loads(acme) == {"address": "<IP_ADDRESS>"}
    assert json.loads(await arguments("globex")) == {"address": IP}


async def test_logprobs_are_refused_where_they_would_spell_the_answer(up):
    with pytest.raises(openai.BadRequestError) as refused:
        await client(up, "acme").chat.completions.create(logprobs=True, **json_answer())
    assert refused.value.body["param"] == "logprobs"
    answer = await client(up, "globex").chat.completions.create(logprobs=True, **json_answer())
    assert answer.choices[0].logprobs is not None


async def test_a_tenants_own_nats_client_reads_no_raw_output_nor_token_ids(up):
    nc = await up.connect_nats("tenant-acme")
    try:
        acme = await Publisher(nc, "acme").start()
        body = chat(
            "Who should the customer write to?",
            max_tokens=64,
            response_format=ResponseFormat("json_schema", JsonSchemaFormat("contact", SCHEMA)),
        )
        request = msgspec.structs.replace(acme.request(klass="interactive"), chat=body)
        await acme.publish(request)
        deltas, end = await acme.rest(request.request_id)
    finally:
        await nc.close()
    assert type(end).__name__ == "Finished", end
    text = "".join(d.text for d in deltas if isinstance(d, Delta))
    assert EMAIL not in text and json.loads(text) == {"contact": "<EMAIL_ADDRESS>"}
    assert all(not d.token_ids for d in deltas)


async def test_a_cached_raw_answer_is_not_replayed_once_the_policy_redacts_output(up):
    """globex caches a raw answer (temperature 0: the response cache keeps it), then its operator
    turns output redaction on: the same request must not replay the raw answer from the cache."""
    body = {**json_answer(), "temperature": 0}
    raw = (await client(up, "globex").chat.completions.create(**body)).choices[0].message.content
    assert EMAIL in raw
    ops = await up.connect_nats("ops")
    try:
        tenants = await ops.jetstream().key_value("lw_tenants")
        doc = json.loads((await tenants.get("globex")).value)
        doc["pii"]["output"] = True
        await tenants.put("globex", json.dumps(doc).encode())
    finally:
        await ops.close()

    async def redacted() -> bool:
        answer = await client(up, "globex").chat.completions.create(**body)
        return "<EMAIL_ADDRESS>" in answer.choices[0].message.content

    assert await eventually(redacted, timeout=60, interval=0.5), "the cached raw answer kept coming back"
