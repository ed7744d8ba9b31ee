"""The Files and Batch APIs where users meet them: `laneway up` with two tenants under their
generated NATS accounts, the official `openai` client, OpenAI's own schemas checked on every
object. A batch's lines run through the gate in the `batch` class and come back in OpenAI's
output format; what one tenant stores, another cannot reach over HTTP or over NATS."""

from __future__ import annotations

import json

import openai
import pytest
import pytest_asyncio

from loadtest.fleet import Fleet
from loadtest.scenarios import PoolSpec, TenantSpec
from tests.nats_refusals import assert_refused, violations
from tests.openapi import validator
from tests.wait import eventually

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(300)]

MODEL = "laneway-sim"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fleet(tmp_path_factory):
    async with Fleet(
        tmp_path_factory.mktemp("batches") / "lw",
        [TenantSpec("acme", pii=False), TenantSpec("globex")],
        [PoolSpec(profile="zero")],
        up_flags=["--pii", "off"],
    ) as running:
        yield running


def client(fleet: Fleet, tenant: str = "acme") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{fleet.url}/v1", api_key=fleet.keys[tenant], max_retries=0)


def chat_line(custom_id: str, content: str, model: str = MODEL, **more) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": content}], **more},
    }


def jsonl(lines: list[dict]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


async def finished(c: openai.AsyncOpenAI, batch_id: str, until=("completed", "failed", "expired", "cancelled")):
    seen = []

    async def done() -> bool:
        seen.append(await c.batches.retrieve(batch_id))
        return seen[-1].status in until

    assert await eventually(done, timeout=120, interval=0.2), seen[-1]
    return seen[-1]


def check(schema: str, obj) -> dict:
    body = obj.model_dump(exclude_unset=True) if hasattr(obj, "model_dump") else obj
    validator(schema).validate(body)
    return body


async def test_a_file_round_trips_and_is_deleted(fleet: Fleet) -> None:
    c = client(fleet)
    content = jsonl([chat_line("a", "hello")])
    file = await c.files.create(file=("in.jsonl", content), purpose="batch")
    check("OpenAIFile", file)
    assert file.bytes == len(content) and file.filename == "in.jsonl" and file.purpose == "batch"
    assert (await c.files.retrieve(file.id)).id == file.id
    assert (await c.files.content(file.id)).content == content
    assert file.id in [f.id async for f in c.files.list()]
    check("ListFilesResponse", await c.files.list())
    deleted = await c.files.delete(file.id)
    check("DeleteFileResponse", deleted)
    with pytest.raises(openai.NotFoundError):
        await c.files.retrieve(file.id)
    with pytest.raises(openai.NotFoundError):
        await c.files.content(file.id)


async def test_a_batch_answers_every_line_in_openai_format(fleet: Fleet) -> None:
    c = client(fleet)
    lines = [chat_line(f"ticket-{i}", f"Summarize ticket {i}", seed=i) for i in range(5)]
    lines.append(chat_line("unknown", "hi", model="no-such-model"))
    file = await c.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    batch = await c.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"job": "nightly"}
    )
    check("Batch", batch)
    assert batch.status == "validating"
    with pytest.raises(openai.BadRequestError) as err:  # globex's policy redacts: no raw metadata kept
        await client(fleet, "globex").batches.create(
            input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"job": "nightly"}
        )
    assert err.value.body["param"] == "metadata"
    done = await finished(c, batch.id)
    check("Batch", done)
    assert done.status == "completed", done
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (6, 5, 1)
    assert done.usage.input_tokens > 0 and done.usage.output_tokens > 0 and done.metadata == {"job": "nightly"}
    out = [json.loads(line) for line in (await c.files.content(done.output_file_id)).content.splitlines()]
    assert sorted(o["custom_id"] for o in out) == [f"ticket-{i}" for i in range(5)]
    for o in out:
        assert o["error"] is None and o["response"]["status_code"] == 200
        validator("CreateChatCompletionResponse").validate(o["response"]["body"])
    errors = [json.loads(line) for line in (await c.files.content(done.error_file_id)).content.splitlines()]
    assert [(e["custom_id"], e["response"]["status_code"]) for e in errors] == [("unknown", 404)]
    assert errors[0]["response"]["body"]["error"]["code"] == "model_not_found"
    output_file = await c.files.retrieve(done.output_file_id)
    assert output_file.purpose == "batch_output"
    assert batch.id in [b.id async for b in c.batches.list()]


async def test_a_bad_input_file_fails_the_batch_naming_its_lines(fleet: Fleet) -> None:
    c = client(fleet)
    content = jsonl([chat_line("same", "a"), chat_line("same", "b")]) + b"not json\n"
    file = await c.files.create(file=("bad.jsonl", content), purpose="batch")
    batch = await c.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")
    done = await finished(c, batch.id)
    check("Batch", done)
    assert done.status == "failed"
    assert [(e.code, e.line) for e in done.errors.data] == [("duplicate_custom_id", 2), ("invalid_json_line", 3)]


async def test_another_tenant_reaches_nothing_over_http(fleet: Fleet) -> None:
    owner, other = client(fleet, "acme"), client(fleet, "globex")
    file = await owner.files.create(file=("in.jsonl", jsonl([chat_line("x", "secret plan")])), purpose="batch")
    batch = await owner.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")
    for attempt in (
        other.files.retrieve(file.id),
        other.files.content(file.id),
        other.files.delete(file.id),
        other.batches.retrieve(batch.id),
        other.batches.cancel(batch.id),
        other.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"),
    ):
        with pytest.raises(openai.NotFoundError):
            await attempt
    assert [f.id async for f in other.files.list()] == [] and [b.id async for b in other.batches.list()] == []
    assert (await owner.files.retrieve(file.id)).id == file.id  # still there: the delete did nothing
    assert (await finished(owner, batch.id)).status == "completed"


async def test_a_tenant_nats_user_reaches_no_file_or_batch(fleet: Fleet) -> None:
    """The tenant's own generated credentials: its account has no JetStream, and imports none of
    the buckets' or the results stream's subjects."""
    await assert_refused(
        fleet.up,
        "tenant-globex",
        (
            "$JS.API.STREAM.INFO.OBJ_lw_file_data",
            "$JS.API.STREAM.INFO.KV_lw_batches",
            "$JS.API.DIRECT.GET.KV_lw_files.$KV.lw_files.acme.x",
            "$JS.API.STREAM.INFO.LW_BATCH",
            "$O.lw_file_data.M.x",
            "lw.batch.done.acme.x",
        ),
        "$KV.lw_files.>",
    )


async def test_the_services_ran_it_all_within_their_generated_permissions(fleet: Fleet) -> None:
    """Every feature above ran under the generated users: the server logged no violation by a
    service (the tenant's attempts above are the tenant's own)."""
    assert violations(fleet.data_dir, "svc-") == []
