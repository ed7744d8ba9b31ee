"""The response cache on a real nats-server: hits replay the same text, and nothing leaks across
tenants, model versions or sampling settings."""

from __future__ import annotations

from itertools import count

import nats
import pytest

from broker.gate.cache import (
    CachedResponse, CacheScope, ResponseCache, chunk_text, ensure_cache_bucket, parse_scope, replay_entries,
)
from schemas.frames import Delta, Finished
from schemas.requests import ChatMessage, SamplingParams
from schemas.subjects import Subjects
from tests.wait import eventually

_prefixes = count()
GREEDY = SamplingParams(max_tokens=64, temperature=0.0)
MESSAGES = [ChatMessage("system", "You are terse."), ChatMessage("user", "My SSN is <US_SSN>. Summarize.")]
ANSWER = CachedResponse("You shared an identifier; I will not repeat it. Summary: none needed.",
                        prompt_tokens=17, completion_tokens=15, finish_reason="stop", served_model="llama-8b@r2")


@pytest.fixture(scope="module")
async def nc(nats_server):
    conn = await nats.connect(nats_server.url)
    yield conn
    await conn.close()


async def open_cache(nc, scope: CacheScope | None = None, ttl_s: float = 3600) -> ResponseCache:
    return await ResponseCache.open(nc.jetstream(), Subjects(f"c{next(_prefixes)}"), ttl_s, scope)


async def test_hit_replays_the_same_text(nc) -> None:
    cache = await open_cache(nc)
    key = cache.key("acme", "chat", "r2", MESSAGES, None, GREEDY)
    assert await cache.lookup(key) is None
    assert await cache.store(key, ANSWER)
    hit = await cache.lookup(cache.key("acme", "chat", "r2", list(MESSAGES), None, GREEDY))
    assert hit is not None and hit.text == ANSWER.text and hit.completion_tokens == 15
    entries = replay_entries(hit, "req-1", attempt=1, chunk_chars=16)
    deltas = [e for e in entries if isinstance(e, Delta)]
    assert len(deltas) > 3 and "".join(d.text for d in deltas) == ANSWER.text
    assert [e.seq for e in entries] == list(range(len(entries)))
    finished = entries[-1]
    assert isinstance(finished, Finished) and finished.finish_reason == "stop"
    assert (finished.usage.prompt_tokens, finished.usage.completion_tokens) == (17, 15)
    assert finished.model == "llama-8b@r2" and {e.request_id for e in entries} == {"req-1"}


async def test_no_cross_tenant_hit(nc) -> None:
    cache = await open_cache(nc)
    await cache.store(cache.key("acme", "chat", "r2", MESSAGES, None, GREEDY), ANSWER)
    assert await cache.lookup(cache.key("globex", "chat", "r2", MESSAGES, None, GREEDY)) is None


async def test_changed_model_version_misses(nc) -> None:
    cache = await open_cache(nc)
    await cache.store(cache.key("acme", "chat", "r2", MESSAGES, None, GREEDY), ANSWER)
    assert await cache.lookup(cache.key("acme", "chat", "r3", MESSAGES, None, GREEDY)) is None
    assert await cache.lookup(cache.key("acme", "chat-large", "r2", MESSAGES, None, GREEDY)) is None


async def test_share_group_hits_only_when_configured(nc) -> None:
    scope = parse_scope({"acme": "corp", "acme-eu": "corp"})
    cache = await open_cache(nc, scope)
    await cache.store(cache.key("acme", "chat", "r2", MESSAGES, None, GREEDY), ANSWER)
    assert (await cache.lookup(cache.key("acme-eu", "chat", "r2", MESSAGES, None, GREEDY))).text == ANSWER.text
    assert await cache.lookup(cache.key("globex", "chat", "r2", MESSAGES, None, GREEDY)) is None
    # a tenant that happens to be named like the group is still not in it
    assert await cache.lookup(cache.key("corp", "chat", "r2", MESSAGES, None, GREEDY)) is None


async def test_non_deterministic_requests_are_never_cached(nc) -> None:
    cache = await open_cache(nc)
    sampled = SamplingParams(max_tokens=64, temperature=0.7)
    key = cache.key("acme", "chat", "r2", MESSAGES, None, sampled)
    assert key is None
    assert not await cache.store(key, ANSWER) and await cache.lookup(key) is None
    seeded = SamplingParams(max_tokens=64, temperature=0.7, seed=42)
    await cache.store(cache.key("acme", "chat", "r2", MESSAGES, None, seeded), ANSWER)
    assert await cache.lookup(cache.key("acme", "chat", "r2", MESSAGES, None, seeded)) is not None
    other_seed = SamplingParams(max_tokens=64, temperature=0.7, seed=43)
    assert await cache.lookup(cache.key("acme", "chat", "r2", MESSAGES, None, other_seed)) is None


@pytest.mark.parametrize("change", [
    {"sampling": SamplingParams(max_tokens=65, temperature=0.0)},
    {"sampling": SamplingParams(max_tokens=64, temperature=0.0, stop=["\n"])},
    {"messages": [ChatMessage("user", "My SSN is <US_SSN>. Summarize."), ChatMessage("system", "You are terse.")]},
    {"messages": [ChatMessage("system", "You are terse."), ChatMessage("assistant", "My SSN is <US_SSN>. Summarize.")]},
    {"messages": [], "prompt": "You are terse.My SSN is <US_SSN>. Summarize."},
])
async def test_any_input_change_misses(nc, change) -> None:
    cache = await open_cache(nc)
    await cache.store(cache.key("acme", "chat", "r2", MESSAGES, None, GREEDY), ANSWER)
    args = {"messages": MESSAGES, "prompt": None, "sampling": GREEDY} | change
    assert await cache.lookup(cache.key("acme", "chat", "r2", args["messages"], args["prompt"],
                                        args["sampling"])) is None


async def test_unfinished_answers_are_not_stored(nc) -> None:
    cache = await open_cache(nc)
    key = cache.key("acme", "chat", "r2", MESSAGES, None, GREEDY)
    cut = CachedResponse("partial", 17, 2, "cancelled")
    assert not await cache.store(key, cut) and await cache.lookup(key) is None


async def test_entries_expire_with_the_bucket_ttl(nc) -> None:
    s = Subjects(f"c{next(_prefixes)}")
    cache = ResponseCache(await ensure_cache_bucket(nc.jetstream(), s, ttl_s=1.0))
    key = cache.key("acme", "chat", "r2", MESSAGES, None, GREEDY)
    await cache.store(key, ANSWER)
    assert await cache.lookup(key) is not None
    async def expired() -> bool:
        return await cache.lookup(key) is None
    assert await eventually(expired, interval=0.1), "the entry never expired"
    # a changed TTL is applied to the existing bucket
    await ensure_cache_bucket(nc.jetstream(), s, ttl_s=120.0)
    info = await nc.jetstream().stream_info(f"KV_{s.bucket('cache')}")
    assert info.config.max_age == pytest.approx(120.0)


def test_chunking_round_trips() -> None:
    for text in ("", "one", "a b c d e f g " * 20, "x" * 100, " leading and trailing "):
        pieces = chunk_text(text, 8)
        assert "".join(pieces) == text and all(pieces)


def test_bad_share_group_config_is_refused() -> None:
    with pytest.raises(ValueError, match="groups"):
        parse_scope({"acme": "not a token!"})
