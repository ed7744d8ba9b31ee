"""`/v1/responses` lines in a batch, where users meet them: `laneway up` with two tenants, the
official `openai` client, OpenAI's own `Response` schema checked on every output line. A line
keeps the endpoint's rules: `store` (default true) keeps it for its tenant alone, retrievable
and continued like any stored response; `previous_response_id` finds only its tenant's own;
`stream` and `background` are refused for that line, in the error file."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest
import pytest_asyncio

from loadtest.fleet import Fleet
from loadtest.scenarios import PoolSpec, TenantSpec
from tests.e2e.test_batches_api import check, client, finished, jsonl
from tests.nats_refusals import violations
from tests.openapi import validator
from tests.wait import eventually

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(300)]

MODEL = "laneway-sim"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fleet(tmp_path_factory):
    async with Fleet(
        tmp_path_factory.mktemp("rbatches") / "lw",
        [TenantSpec("acme"), TenantSpec("globex")],
        [PoolSpec(profile="zero")],
        up_flags=["--pii", "off"],
    ) as running:
        yield running


def response_line(custom_id: str, text: str, **more) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/responses",
        "body": {"model": MODEL, "input": text, "max_output_tokens": 8, **more},
    }


async def run_batch(c: openai.AsyncOpenAI, lines: list[dict]) -> tuple[object, dict[str, dict], dict[str, dict]]:
    """The finished batch, and its output and error lines by custom id."""
    file = await c.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    batch = await c.batches.create(input_file_id=file.id, endpoint="/v1/responses", completion_window="24h")
    check("Batch", batch)
    done = await finished(c, batch.id)
    check("Batch", done)
    assert done.status == "completed", done

    async def read(file_id: str | None) -> dict[str, dict]:
        if file_id is None:
            return {}
        found = [json.loads(raw) for raw in (await c.files.content(file_id)).content.splitlines()]
        return {line["custom_id"]: line for line in found}

    return done, await read(done.output_file_id), await read(done.error_file_id)


async def stored(c: openai.AsyncOpenAI, response_id: str):
    """The stored response, once its write (a task of its own after the answer) is done."""
    seen = []

    async def there() -> bool:
        try:
            seen.append(await c.responses.retrieve(response_id))
        except openai.NotFoundError:
            return False
        return True

    assert await eventually(there, timeout=30, interval=0.1), response_id
    return seen[-1]


async def test_responses_lines_answer_with_response_objects(fleet: Fleet) -> None:
    c = client(fleet)
    lines = [
        response_line("kept", "Summarize ticket 1", instructions="Be brief."),
        response_line("unkept", "Summarize ticket 2", store=False),
        response_line("streamed", "Summarize ticket 3", stream=True),
        response_line("detached", "Summarize ticket 4", background=True),
    ]
    done, out, errors = await run_batch(c, lines)
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (4, 2, 2)
    assert sorted(out) == ["kept", "unkept"] and sorted(errors) == ["detached", "streamed"]
    for line in out.values():
        assert line["error"] is None and line["response"]["status_code"] == 200
        body = line["response"]["body"]
        validator("Response").validate(body)
        assert body["object"] == "response" and body["output"]
        assert body["status"] in ("completed", "incomplete")  # max_output_tokens may cut it short
    kept, unkept = out["kept"]["response"]["body"], out["unkept"]["response"]["body"]
    assert kept["store"] is True and unkept["store"] is False and kept["instructions"] == "Be brief."
    # Metered by the Response's own usage (input_tokens, output_tokens).
    assert done.usage.input_tokens >= kept["usage"]["input_tokens"] + unkept["usage"]["input_tokens"] > 0
    assert done.usage.output_tokens > 0
    for custom_id, param in (("streamed", "stream"), ("detached", "background")):
        answer = errors[custom_id]["response"]
        assert answer["status_code"] == 400 and answer["body"]["error"]["param"] == param, answer
    # The stored line is a stored response like any other; the unstored one was never kept.
    got = await stored(c, kept["id"])
    assert got.status == kept["status"] and [item.id for item in got.output] == [item["id"] for item in kept["output"]]
    with pytest.raises(openai.NotFoundError):
        await c.responses.retrieve(unkept["id"])


async def test_a_stored_line_is_its_tenants_alone(fleet: Fleet) -> None:
    owner, other = client(fleet, "acme"), client(fleet, "globex")
    _, out, _ = await run_batch(owner, [response_line("secret", "The merger closes on Friday.")])
    response_id = out["secret"]["response"]["body"]["id"]
    await stored(owner, response_id)
    for attempt in (
        other.responses.retrieve(response_id),
        other.responses.input_items.list(response_id),
        other.responses.delete(response_id),
    ):
        with pytest.raises(openai.NotFoundError):
            await attempt
    assert (await owner.responses.retrieve(response_id)).id == response_id  # the delete did nothing


async def test_a_line_continues_only_its_own_tenants_responses(fleet: Fleet) -> None:
    owner, other = client(fleet, "acme"), client(fleet, "globex")
    first = await owner.responses.create(model=MODEL, input="My order is AB123456 and it is late.", max_output_tokens=8)
    await stored(owner, first.id)
    (_, out, _), (_, other_out, other_errors) = await asyncio.gather(
        run_batch(
            owner,
            [
                response_line("next", "Where is it?", previous_response_id=first.id),
                response_line("fresh", "Where is it?"),
            ],
        ),
        run_batch(other, [response_line("theirs", "Where is it?", previous_response_id=first.id)]),
    )
    continued, fresh = out["next"]["response"]["body"], out["fresh"]["response"]["body"]
    validator("Response").validate(continued)
    assert continued["previous_response_id"] == first.id
    # The earlier turn went to the engine with it: the same input costs more input tokens.
    assert continued["usage"]["input_tokens"] > fresh["usage"]["input_tokens"]
    assert other_out == {}
    answer = other_errors["theirs"]["response"]
    assert answer["status_code"] == 404 and answer["body"]["error"]["param"] == "previous_response_id", answer


async def test_the_services_ran_it_all_within_their_generated_permissions(fleet: Fleet) -> None:
    """Every line above, stored, continued and refused, under the generated users: the server
    logged no violation by a service."""
    assert violations(fleet.data_dir, "svc-") == []
