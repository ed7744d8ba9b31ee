"""What Laneway stores is what the tenant's PII policy let through (issue 35).

On main, a plain `laneway up` (PII on) redacted the prompt before the engine, but `lw_responses`,
which `ops` may read, kept verbatim what a Response repeats of its request: `instructions`, tool
descriptions, `user`, `metadata`, `safety_identifier`, `prompt_cache_key`, in stored responses,
background ones and a streamed background one's events; conversations and batches kept their
metadata raw. Here every kind of stored object is made with an email, a phone number, a card
number and a name in every field the API takes, through the official client; then every stream
and bucket is read back, message by message, as each generated NATS user that may read it (the
rights `laneway/nats_permissions.py` grants: a message get or a direct get on the stream), and no
seeded value may be in any of them. Metadata no generation carries past the PII stage (a
conversation's, a batch's) is refused for this tenant, whose policy redacts.

The one store read past is the tenant's own files (`lw_file_data`, bridge-only): a file is kept
as uploaded, since `GET /v1/files/{id}/content` answers its bytes (a batch's input file, and the
output file that answers it).
"""

from __future__ import annotations

import json

import nats.js.errors
import openai
import pytest

from laneway.nats_permissions import service_permissions
from loadtest.processes import LanewayUp
from schemas.subjects import Subjects
from tests.wait import eventually

pytestmark = pytest.mark.timeout(600)

KEY = "sk-pii-stored-" + "s" * 16
NAME, EMAIL, PHONE, CARD = "Maria Garcia", "maria.garcia@example.com", "(415) 555-0132", "4111 1111 1111 1111"
SEEDS = (NAME, EMAIL, PHONE, CARD)
TEXT = f"Ticket from {NAME} ({EMAIL}), who called from {PHONE} about card {CARD}."
FILES = "OBJ_lw_file_data"  # the tenant's files, kept as uploaded (see the docstring)
READERS = ("ops", "bridge", "broker")  # the worker user reads no stream message by message
ENDED = ("completed", "incomplete", "failed", "cancelled")

TOOL = {
    "type": "function",
    "name": "lookup_customer",
    "description": f"Look up {TEXT}",
    "parameters": {"type": "object", "properties": {"who": {"type": "string", "description": TEXT}}},
}
FORMAT = {
    "type": "json_schema",
    "name": "ticket",
    "description": TEXT,
    "schema": {"type": "object", "properties": {"summary": {"type": "string", "description": TEXT}}},
}
# Every field of a Response request that holds text of the client's.
FIELDS = {
    "input": TEXT,
    "instructions": f"Answer for {TEXT}",
    "tools": [TOOL],
    "user": TEXT,
    "metadata": {"customer": TEXT, EMAIL: "contact"},
    "safety_identifier": TEXT,
    "prompt_cache_key": TEXT,
}


def readable_streams(role: str) -> list[str]:
    """The streams (and buckets) the role's generated user may read message by message."""
    allowed = service_permissions(Subjects())[role]["publish"]["allow"]
    streams = set()
    for subject in allowed:
        for api in ("$JS.API.STREAM.MSG.GET.", "$JS.API.DIRECT.GET."):
            if subject.startswith(api):
                streams.add(subject[len(api) :].removesuffix(".>"))
    return sorted(s for s in streams if "*" not in s and ">" not in s)


async def leaks_seen_by(up: LanewayUp, role: str) -> tuple[list[tuple[str, str, int]], int]:
    """(seed, stream, sequence) for each seeded value found, and how many messages were read."""
    nc = await up.connect_nats("ops" if role == "ops" else f"svc-{role}")
    js = nc.jetstream()
    found, read = [], 0
    try:
        for stream in readable_streams(role):
            if stream == FILES:
                continue
            try:
                state = (await js.stream_info(stream)).state
            except nats.js.errors.NotFoundError:
                continue  # never created on this run
            for seq in range(state.first_seq, state.last_seq + 1) if state.messages else ():
                try:
                    msg = await js.get_msg(stream, seq)
                except nats.js.errors.NotFoundError:
                    continue  # deleted or purged
                read += 1
                raw = (msg.data or b"") + json.dumps(msg.headers or {}).encode() + (msg.subject or "").encode()
                found += [(seed, stream, seq) for seed in SEEDS if seed.encode() in raw]
    finally:
        await nc.close()
    return found, read


async def ended(client: openai.AsyncOpenAI, response_id: str) -> bool:
    try:
        return (await client.responses.retrieve(response_id)).status in ENDED
    except openai.NotFoundError:
        return False  # not written yet: a stored response is kept after its answer


async def test_nothing_stored_holds_a_raw_value(tmp_path):
    async with LanewayUp(tmp_path / "lw", KEY, ["--sim-profile", "zero"]) as up:
        assert "PII         on (Presidio" in up.banner
        client = openai.AsyncOpenAI(base_url=f"{up.url}/v1", api_key=KEY, max_retries=0)
        stored = [
            await client.responses.create(model="laneway-sim", max_output_tokens=8, **FIELDS),
            await client.responses.create(
                model="laneway-sim",
                max_output_tokens=8,
                text={"format": FORMAT},
                tool_choice={"type": "function", "name": "lookup_customer"},
                **FIELDS,
            ),
        ]
        async with await client.responses.create(
            model="laneway-sim", max_output_tokens=8, stream=True, **FIELDS
        ) as events:
            stored += [e.response async for e in events if e.type == "response.completed"]
        stored.append(
            await client.responses.create(model="laneway-sim", max_output_tokens=8, background=True, **FIELDS)
        )
        async with await client.responses.create(
            model="laneway-sim", max_output_tokens=8, background=True, stream=True, **FIELDS
        ) as events:
            stored += [e.response async for e in events if e.type == "response.created"]

        with pytest.raises(openai.BadRequestError, match="metadata"):
            await client.conversations.create(metadata={"customer": TEXT})
        conversation = await client.conversations.create()
        with pytest.raises(openai.BadRequestError, match="metadata"):
            await client.conversations.update(conversation.id, metadata={"customer": TEXT})
        stored.append(
            await client.responses.create(
                model="laneway-sim", max_output_tokens=8, conversation=conversation.id, **FIELDS
            )
        )

        line = {
            "custom_id": "l0",
            "method": "POST",
            "url": "/v1/responses",
            "body": {"model": "laneway-sim", "max_output_tokens": 8, **FIELDS},
        }
        upload = await client.files.create(file=("lines.jsonl", json.dumps(line).encode() + b"\n"), purpose="batch")
        ask = {"input_file_id": upload.id, "endpoint": "/v1/responses", "completion_window": "24h"}
        with pytest.raises(openai.BadRequestError, match="metadata"):
            await client.batches.create(**ask, metadata={"customer": TEXT})
        batch = await client.batches.create(**ask)
        await client.chat.completions.create(
            model="laneway-sim",
            max_tokens=8,
            user=TEXT,
            metadata={"c": TEXT},
            messages=[{"role": "user", "content": TEXT}],
        )

        for response in stored:
            assert await eventually(lambda rid=response.id: ended(client, rid), timeout=60), response.id
        assert await eventually(lambda: _batch_done(client, batch.id), timeout=120)
        assert await eventually(lambda: _appended(client, conversation.id)), "the turn was appended"
        # The stored copy is the redacted one, as the engine got it.
        kept = await client.responses.retrieve(stored[0].id)
        assert "<EMAIL_ADDRESS>" in kept.instructions and kept.metadata["customer"].count("<") >= 4

        assert "KV_lw_responses" in readable_streams("ops") and "KV_lw_batches" in readable_streams("bridge")
        for role in READERS:
            leaks, read = await leaks_seen_by(up, role)
            assert leaks == [], role
            assert read, role


async def _appended(client: openai.AsyncOpenAI, conversation_id: str) -> bool:
    return bool((await client.conversations.items.list(conversation_id)).data)


async def _batch_done(client: openai.AsyncOpenAI, batch_id: str) -> bool:
    batch = await client.batches.retrieve(batch_id)
    assert batch.status not in ("failed", "expired", "cancelled"), batch
    return batch.status == "completed"
