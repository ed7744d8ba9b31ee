"""Resumable streams (`--resume-window-s`): a streamed chat cut off mid-answer comes back with
`Last-Event-ID` and gets every token exactly once, with one generation; through another bridge
replica too. Another tenant's key, a forged or malformed id get nothing of the stream. A client
that does not come back within the window has its generation cancelled and the events freed;
window 0 is the old behaviour (no ids, cancel at once).

Attack check, seen failing without its fix: with `Resumes.find` not comparing the tenant (the
one check a local resume and the relay's holder both make), another tenant's key resumed the
stream (200, text/event-stream, the tokens)."""

from __future__ import annotations

import json
from dataclasses import replace

import aiohttp
import pytest

from bridge.app import Bridge
from loadtest.stack import Stack, demo_settings
from tests.wait import eventually
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.roofline import PROFILES

pytestmark = pytest.mark.timeout(180)

KEY, OTHER_KEY = "sk-resume-demo", "sk-resume-other"
CHAT = "/v1/chat/completions"


def body(prompt: str, max_tokens: int = 60, **more) -> dict:
    return {
        "model": "laneway-sim",
        "stream": True,
        "max_tokens": max_tokens,
        "seed": 7,
        "temperature": 0.9,
        "messages": [{"role": "user", "content": prompt}],
        **more,
    }


def auth(key: str = KEY, last_event_id: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {key}", "x-laneway-resumable": "true"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    return headers


class Events:
    """SSE events as a client parses them: (id or None, data)."""

    def __init__(self) -> None:
        self.items: list[tuple[str | None, str]] = []

    @property
    def last_id(self) -> str:
        return next(i for i, _ in reversed(self.items) if i is not None)

    @property
    def done(self) -> bool:
        return bool(self.items) and self.items[-1][1] == "[DONE]"

    def tokens(self) -> list[str]:
        out = []
        for _, data in self.items:
            if data != "[DONE]":
                for choice in json.loads(data).get("choices", []):
                    if choice.get("delta", {}).get("content"):
                        out.append(choice["delta"]["content"])
        return out


async def read_events(resp: aiohttp.ClientResponse, events: Events, limit: int | None = None) -> Events:
    """Read events until `[DONE]`, the end, or `limit` data events (then stop reading)."""
    event_id, count = None, 0
    while limit is None or count < limit:
        line = await resp.content.readline()
        if not line:
            break
        line = line.decode().rstrip("\n")
        if line.startswith("id: "):
            event_id = line[4:]
        elif line.startswith("data: "):
            events.items.append((event_id, line[6:]))
            event_id, count = None, count + 1
            if line == "data: [DONE]":
                break
    return events


async def cut_after(http: aiohttp.ClientSession, url: str, payload: dict, n: int) -> Events:
    """A streamed request whose connection drops after `n` events."""
    resp = await http.post(url + CHAT, json=payload, headers=auth())
    assert resp.status == 200, await resp.text()
    events = await read_events(resp, Events(), n)
    resp.close()  # the connection, mid-stream
    return events


@pytest.fixture(scope="module")
async def stack(nats_server):
    settings = demo_settings(KEY, extra_tenants={"other": OTHER_KEY})
    async with Stack(nats_server.url, settings, engines=[SimEngine(PROFILES["llama-8b-h100"])]) as s:
        yield s


@pytest.fixture(scope="module")
async def second(stack):
    """Another replica of the bridge on the same NATS, as behind a load balancer."""
    async with Bridge(replace(stack.bridge.config, port=0), stack.settings) as bridge:
        await bridge.wait_ready()
        yield bridge


def generations(stack: Stack) -> float:
    registry = stack.workers[0].metrics.registry
    return sum(
        s.value
        for m in registry.collect()
        if m.name == "laneway_worker_finished"
        for s in m.samples
        if s.name.endswith("_total")
    )


def cancelled(stack: Stack) -> float:
    return (
        stack.workers[0].metrics.registry.get_sample_value(
            "laneway_worker_finished_total", {"pool": "sim", "reason": "cancelled"}
        )
        or 0.0
    )


def metric(bridge: Bridge, name: str, **labels: str) -> float:
    return bridge.metrics.registry.get_sample_value(name, labels) or 0.0


async def test_a_cut_stream_resumes_with_every_token_exactly_once(stack):
    url = stack.bridge.url
    before = generations(stack)
    async with aiohttp.ClientSession() as http:
        first = await cut_after(http, url, body("tell me about lanes"), 5)
        assert all(i is not None for i, _ in first.items), first.items
        async with http.post(url + CHAT, json={"ignored": True}, headers=auth(last_event_id=first.last_id)) as resp:
            assert resp.status == 200, await resp.text()
            rest = await read_events(resp, Events())
        assert rest.done
        assert await eventually(lambda: generations(stack) == before + 1)
        async with http.post(url + CHAT, json=body("tell me about lanes"), headers=auth()) as resp:
            whole = await read_events(resp, Events())
    assert first.tokens() + rest.tokens() == whole.tokens() and len(whole.tokens()) == 60
    assert metric(stack.bridge, "laneway_streams_resumed_total", via="local") >= 1


async def test_a_resume_through_another_bridge_gets_the_same_tokens_and_can_be_cut_again(stack, second):
    before = generations(stack)
    prompt = "a long story about replicas"
    async with aiohttp.ClientSession() as http:
        first = await cut_after(http, stack.bridge.url, body(prompt), 4)
        # Through the other replica, cut again after a few events ...
        resp = await http.post(second.url + CHAT, json={}, headers=auth(last_event_id=first.last_id))
        assert resp.status == 200, await resp.text()
        middle = await read_events(resp, Events(), 3)
        resp.close()
        # ... and back to the first one, from where the second left off.
        async with http.post(stack.bridge.url + CHAT, json={}, headers=auth(last_event_id=middle.last_id)) as resp:
            assert resp.status == 200, await resp.text()
            rest = await read_events(resp, Events())
        assert rest.done
        assert await eventually(lambda: generations(stack) == before + 1)
        async with http.post(stack.bridge.url + CHAT, json=body(prompt), headers=auth()) as resp:
            whole = await read_events(resp, Events())
    assert first.tokens() + middle.tokens() + rest.tokens() == whole.tokens() and len(whole.tokens()) == 60
    assert metric(stack.bridge, "laneway_streams_resumed_total", via="relay") >= 1


async def test_a_finished_stream_keeps_its_tail_for_the_window(stack, second):
    async with aiohttp.ClientSession() as http:
        async with http.post(stack.bridge.url + CHAT, json=body("short", max_tokens=8), headers=auth()) as resp:
            whole = await read_events(resp, Events())
        assert whole.done and whole.items[-1][0] is None  # [DONE] carries no id
        ids = [i for i, _ in whole.items if i is not None]
        for url in (stack.bridge.url, second.url):
            async with http.post(url + CHAT, json={}, headers=auth(last_event_id=ids[2])) as resp:
                assert resp.status == 200
                rest = await read_events(resp, Events())
            assert rest.items == whole.items[3:]
        async with http.post(second.url + CHAT, json={}, headers=auth(last_event_id=ids[-1])) as resp:
            assert (await read_events(resp, Events())).items == [(None, "[DONE]")]


async def _refused(http: aiohttp.ClientSession, url: str, key: str, event_id: str, path: str = CHAT) -> dict:
    async with http.post(url + path, json=body("x"), headers=auth(key, event_id)) as resp:
        raw = await resp.read()
        assert resp.content_type == "application/json", raw
        return {"status": resp.status, **(await resp.json())["error"]}


async def test_another_tenants_key_gets_404_and_no_byte_of_the_stream(stack, second):
    async with aiohttp.ClientSession() as http:
        first = await cut_after(http, stack.bridge.url, body("secret plans", max_tokens=400), 3)
        edge, _request_id, _ = first.last_id.split(".")
        unknown = await _refused(http, stack.bridge.url, KEY, f"{edge}.{'0' * 32}.1")
        assert unknown["status"] == 404 and unknown["code"] == "not_found", unknown
        for url in (stack.bridge.url, second.url):
            stolen = await _refused(http, url, OTHER_KEY, first.last_id)
            assert stolen == unknown, stolen  # indistinguishable from an unknown id
        # The right id on the other endpoint is not that stream either.
        assert (await _refused(http, stack.bridge.url, KEY, first.last_id, "/v1/completions")) == unknown
        # The owner still resumes it, whole.
        async with http.post(second.url + CHAT, json={}, headers=auth(last_event_id=first.last_id)) as resp:
            rest = await read_events(resp, Events())
        assert rest.done and len(first.tokens() + rest.tokens()) == 400


@pytest.mark.parametrize(
    "event_id",
    ["", "garbage", "a.b", "a.b.c", "e.r.-1", "e.r.01", "e r.x.1", "e.r.1.2", "x" * 65 + ".r.1", "e.r." + "9" * 10],
)
async def test_a_malformed_id_is_400(stack, event_id):
    async with aiohttp.ClientSession() as http:
        refused = await _refused(http, stack.bridge.url, KEY, event_id)
    assert refused["status"] == 400 and refused["param"] == "Last-Event-ID", refused


async def test_a_forged_id_is_404_on_any_bridge(stack, second):
    async with aiohttp.ClientSession() as http:
        for edge in (stack.bridge.edge_id, second.edge_id, "feedfacecafe"):
            refused = await _refused(http, stack.bridge.url, KEY, f"{edge}.{'ab' * 16}.3")
            assert refused["status"] == 404 and refused["code"] == "not_found", refused


class Replica:
    """One more bridge on the stack's NATS, with its own configuration."""

    def __init__(self, stack: Stack, **config) -> None:
        self.bridge = Bridge(replace(stack.bridge.config, port=0, **config), stack.settings)

    async def __aenter__(self) -> Bridge:
        await self.bridge.start()
        await self.bridge.wait_ready()
        return self.bridge

    async def __aexit__(self, *exc: object) -> None:
        await self.bridge.stop()


def holds_nothing(bridge: Bridge) -> bool:
    return len(bridge.resumes) == 0 and len(bridge.demux) == 0


async def test_a_stream_not_resumed_within_the_window_is_cancelled_and_freed(stack):
    async with Replica(stack, resume_window_s=0.5) as bridge, aiohttp.ClientSession() as http:
        before = cancelled(stack)
        first = await cut_after(http, bridge.url, body("go on and on", max_tokens=4000), 3)
        assert await eventually(lambda: cancelled(stack) == before + 1)
        assert await eventually(lambda: holds_nothing(bridge))
        assert metric(bridge, "laneway_streams_expired_total") == 1
        refused = await _refused(http, bridge.url, KEY, first.last_id)
        assert refused["status"] == 404, refused


async def test_a_tenants_abandoned_streams_are_bounded_in_bytes(stack):
    """A window of 10 minutes: only the byte bound can end these streams within the test."""
    async with (
        Replica(stack, resume_window_s=600, resume_tenant_bytes=20_000) as bridge,
        aiohttp.ClientSession() as http,
    ):
        before = cancelled(stack)
        for _ in range(2):
            await cut_after(http, bridge.url, body("fill the bridge", max_tokens=4000), 3)
        assert await eventually(lambda: cancelled(stack) == before + 2)
        assert await eventually(lambda: holds_nothing(bridge))
        assert metric(bridge, "laneway_streams_expired_total") == 2


async def test_an_abandoned_stream_still_counts_against_the_tenants_streams(stack):
    """Its generation runs on during the window: leaving and asking again must not get a tenant
    more generations than `--tenant-max-streams`."""
    async with Replica(stack, resume_window_s=600, tenant_max_streams=1) as bridge, aiohttp.ClientSession() as http:
        first = await cut_after(http, bridge.url, body("one at a time", max_tokens=200), 3)
        async with http.post(bridge.url + CHAT, json=body("another"), headers=auth()) as resp:
            assert resp.status == 429, await resp.text()
        async with http.post(bridge.url + CHAT, json={}, headers=auth(last_event_id=first.last_id)) as resp:
            assert resp.status == 200 and (await read_events(resp, Events())).done


async def test_window_zero_is_the_old_behaviour(stack):
    async with Replica(stack, resume_window_s=0) as bridge, aiohttp.ClientSession() as http:
        before_cancels, before = cancelled(stack), generations(stack)
        first = await cut_after(http, bridge.url, body("no resuming", max_tokens=4000), 3)
        assert [i for i, _ in first.items] == [None, None, None]  # no ids
        assert await eventually(lambda: cancelled(stack) == before_cancels + 1)
        assert await eventually(lambda: holds_nothing(bridge))
        # Last-Event-ID means nothing to it: the request is served anew.
        async with http.post(
            bridge.url + CHAT,
            json=body("anew", max_tokens=5),
            headers=auth(last_event_id=f"{bridge.edge_id}.{'ab' * 16}.2"),
        ) as resp:
            assert resp.status == 200 and (await read_events(resp, Events())).done
        assert await eventually(lambda: generations(stack) == before + 2)


async def test_a_text_completion_resumes_too(stack):
    payload = {
        "model": "laneway-sim",
        "prompt": "once upon",
        "stream": True,
        "max_tokens": 40,
        "seed": 3,
        "temperature": 0.9,
    }
    async with aiohttp.ClientSession() as http:
        resp = await http.post(stack.bridge.url + "/v1/completions", json=payload, headers=auth())
        first = await read_events(resp, Events(), 4)
        resp.close()
        async with http.post(
            stack.bridge.url + "/v1/completions", json={}, headers=auth(last_event_id=first.last_id)
        ) as resp:
            rest = await read_events(resp, Events())
        async with http.post(stack.bridge.url + "/v1/completions", json=payload, headers=auth()) as resp:
            whole = await read_events(resp, Events())

    def texts(events: Events) -> list[str]:
        return [json.loads(d)["choices"][0]["text"] for _, d in events.items if d != "[DONE]"]

    assert rest.done and texts(first) + texts(rest) == texts(whole)


async def test_without_the_header_a_stream_has_no_ids_and_its_leaving_client_cancels_it_at_once(stack):
    """Resuming is asked for: a plain stream is byte for byte what it was (clients that read SSE
    line by line break on `id:`), and its generation stops when its client leaves, not a window
    (600 s here) later. Fails with ids on every stream (the first version of this feature)."""
    async with Replica(stack, resume_window_s=600) as bridge, aiohttp.ClientSession() as http:
        before = cancelled(stack)
        resp = await http.post(
            bridge.url + CHAT, json=body("go on and on", max_tokens=4000), headers={"Authorization": f"Bearer {KEY}"}
        )
        assert resp.status == 200
        lines = [(await resp.content.readline()).decode() for _ in range(6)]
        resp.close()
        assert any(line.startswith("data: ") for line in lines)
        assert not any(line.startswith("id:") for line in lines)
        assert await eventually(lambda: cancelled(stack) == before + 1)
        assert await eventually(lambda: holds_nothing(bridge))
