"""The response cache on a real nats-server: hits replay the same text, and nothing leaks across
tenants, model versions or sampling settings."""

from __future__ import annotations

from itertools import count

import nats
import pytest

from core.cache import (
    CachedResponse,
    CacheScope,
    ResponseCache,
    ensure_cache_bucket,
    parse_scope,
    replay_entries,
)
from schemas.frames import Delta, Finished, ToolCallDelta
from schemas.openai import ChatBody, CompletionBody, Message
from schemas.subjects import Subjects
from tests.requests import chat
from tests.wait import eventually

_prefixes = count()
MESSAGES = [Message("system", "You are terse."), Message("user", "My SSN is <US_SSN>. Summarize.")]


def body(messages: list[Message] = MESSAGES, max_tokens: int = 64, temperature: float = 0.0, **fields) -> ChatBody:
    return chat(*messages, model="chat", max_tokens=max_tokens, temperature=temperature, **fields)


GREEDY = body()
ANSWER_TEXT = "You shared an identifier; I will not repeat it. Summary: none needed."


def deltas_of(text: str, chunk_chars: int = 16) -> list[Delta]:
    """The answer as an engine streamed it: pieces of about `chunk_chars`, ids to be re-stamped."""
    return [Delta("orig", 0, i, text[at : at + chunk_chars]) for i, at in enumerate(range(0, len(text), chunk_chars))]


ANSWER = CachedResponse(
    deltas_of(ANSWER_TEXT), prompt_tokens=17, completion_tokens=15, finish_reason="stop", served_model="llama-8b@r2"
)


@pytest.fixture(scope="module")
async def nc(nats_server):
    conn = await nats.connect(nats_server.url)
    yield conn
    await conn.close()


async def open_cache(nc, scope: CacheScope | None = None, ttl_s: float = 3600) -> ResponseCache:
    return await ResponseCache.open(nc.jetstream(), Subjects(f"c{next(_prefixes)}"), ttl_s, scope)


async def test_hit_replays_the_same_text(nc) -> None:
    cache = await open_cache(nc)
    key = cache.key("acme", "chat", "r2", GREEDY, b"")
    assert await cache.lookup(key) is None
    assert await cache.store(key, ANSWER)
    hit = await cache.lookup(cache.key("acme", "chat", "r2", body(list(MESSAGES)), b""))
    assert hit is not None and hit.text == ANSWER.text and hit.completion_tokens == 15
    entries = replay_entries(hit, "req-1", attempt=1)
    deltas = [e for e in entries if isinstance(e, Delta)]
    assert len(deltas) > 3 and "".join(d.text for d in deltas) == ANSWER.text
    assert [e.seq for e in entries] == list(range(len(entries)))
    finished = entries[-1]
    assert isinstance(finished, Finished) and finished.finish_reason == "stop"
    assert (finished.usage.prompt_tokens, finished.usage.completion_tokens) == (17, 15)
    assert finished.model == "llama-8b@r2" and {e.request_id for e in entries} == {"req-1"}


async def test_no_cross_tenant_hit(nc) -> None:
    cache = await open_cache(nc)
    await cache.store(cache.key("acme", "chat", "r2", GREEDY, b""), ANSWER)
    assert await cache.lookup(cache.key("globex", "chat", "r2", GREEDY, b"")) is None


async def test_changed_model_version_misses(nc) -> None:
    cache = await open_cache(nc)
    await cache.store(cache.key("acme", "chat", "r2", GREEDY, b""), ANSWER)
    assert await cache.lookup(cache.key("acme", "chat", "r3", GREEDY, b"")) is None
    assert await cache.lookup(cache.key("acme", "chat-large", "r2", GREEDY, b"")) is None


async def test_share_group_hits_only_when_configured(nc) -> None:
    scope = parse_scope({"acme": "corp", "acme-eu": "corp"})
    cache = await open_cache(nc, scope)
    await cache.store(cache.key("acme", "chat", "r2", GREEDY, b""), ANSWER)
    assert (await cache.lookup(cache.key("acme-eu", "chat", "r2", GREEDY, b""))).text == ANSWER.text
    assert await cache.lookup(cache.key("globex", "chat", "r2", GREEDY, b"")) is None
    # a tenant that happens to be named like the group is still not in it
    assert await cache.lookup(cache.key("corp", "chat", "r2", GREEDY, b"")) is None


async def test_non_deterministic_requests_are_never_cached(nc) -> None:
    cache = await open_cache(nc)
    sampled = body(temperature=0.7)
    key = cache.key("acme", "chat", "r2", sampled, b"")
    assert key is None
    assert not await cache.store(key, ANSWER) and await cache.lookup(key) is None
    seeded = body(temperature=0.7, seed=42)
    await cache.store(cache.key("acme", "chat", "r2", seeded, b""), ANSWER)
    assert await cache.lookup(cache.key("acme", "chat", "r2", seeded, b"")) is not None
    other_seed = body(temperature=0.7, seed=43)
    assert await cache.lookup(cache.key("acme", "chat", "r2", other_seed, b"")) is None


@pytest.mark.parametrize(
    "changed",
    [
        body(max_tokens=65),
        body(stop=["\n"]),
        body([Message("user", "My SSN is <US_SSN>. Summarize."), Message("system", "You are terse.")]),
        body([Message("system", "You are terse."), Message("assistant", "My SSN is <US_SSN>. Summarize.")]),
        CompletionBody(
            model="chat", prompt="You are terse.My SSN is <US_SSN>. Summarize.", max_tokens=64, temperature=0.0
        ),
    ],
)
async def test_any_input_change_misses(nc, changed) -> None:
    cache = await open_cache(nc)
    await cache.store(cache.key("acme", "chat", "r2", GREEDY, b""), ANSWER)
    assert await cache.lookup(cache.key("acme", "chat", "r2", changed, b"")) is None


async def test_unfinished_answers_are_not_stored(nc) -> None:
    cache = await open_cache(nc)
    key = cache.key("acme", "chat", "r2", GREEDY, b"")
    cut = CachedResponse(deltas_of("partial"), 17, 2, "cancelled")
    assert not await cache.store(key, cut) and await cache.lookup(key) is None


async def test_entries_expire_with_the_bucket_ttl(nc) -> None:
    s = Subjects(f"c{next(_prefixes)}")
    # Long enough that the lookup right after the store sees the entry even after a stall.
    cache = ResponseCache(await ensure_cache_bucket(nc.jetstream(), s, ttl_s=3.0))
    key = cache.key("acme", "chat", "r2", GREEDY, b"")
    await cache.store(key, ANSWER)
    assert await cache.lookup(key) is not None

    async def expired() -> bool:
        return await cache.lookup(key) is None

    assert await eventually(expired, interval=0.1), "the entry never expired"
    # a changed TTL is applied to the existing bucket
    await ensure_cache_bucket(nc.jetstream(), s, ttl_s=120.0)
    info = await nc.jetstream().stream_info(f"KV_{s.bucket('cache')}")
    assert info.config.max_age == pytest.approx(120.0)


def test_replay_round_trips_the_deltas() -> None:
    call = ToolCallDelta(0, id="call_1", name="lookup", arguments="{}")
    stored = [
        Delta("orig", 3, 7, "a b "),
        Delta("orig", 3, 8, "c", choice=1),
        Delta("orig", 3, 9, "", tool_calls=[call]),
    ]
    cached = CachedResponse(stored, 5, 3, "tool_calls", finish_reasons=["stop", "tool_calls"])
    for text in ("", "one", "a b c d e f g " * 20, "x" * 100, " leading and trailing "):
        assert CachedResponse(deltas_of(text, 8), 1, 1, "stop").text == text
    entries = replay_entries(cached, "req-2", attempt=2)
    assert [e.seq for e in entries] == [0, 1, 2, 3] and {e.request_id for e in entries} == {"req-2"}
    assert {e.attempt for e in entries} == {2}
    assert [(d.text, d.choice, d.tool_calls) for d in entries[:-1]] == [
        (d.text, d.choice, d.tool_calls) for d in stored
    ]
    assert entries[-1].finish_reasons == ["stop", "tool_calls"]


def test_bad_share_group_config_is_refused() -> None:
    with pytest.raises(ValueError, match="groups"):
        parse_scope({"acme": "not a token!"})
