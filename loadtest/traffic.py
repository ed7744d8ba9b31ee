"""Drive traffic: open-loop (Poisson arrivals) and closed-loop (users with think time) flows,
over HTTP (the bridge, SSE) or straight over NATS (`bridge/client.py`).

Every request is a `Result` registered with the `Recorder` before it is sent and filled as
tokens arrive, so a request still running when a phase ends (and is cut) keeps what it got.
The recorder also samples, at a fixed interval, how many requests each flow has in flight and
how many of those still wait for their first token (the client-side view of queue depth).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import aiohttp

from loadtest.http_client import RETRIED, Result, sdk_backoff, stream_chat
from loadtest.scenarios import Flow, RequestShape

if TYPE_CHECKING:  # imported where used: `--help` needs neither
    from nats.aio.client import Client

    from bridge.client import LanewayClient


@dataclass(frozen=True, slots=True)
class Call:
    flow: str
    tenant: str
    klass: str
    model: str
    prompt: str
    max_tokens: int
    retries: int = 0  # 429/503 retried as the OpenAI SDK does (Flow.retries)


class Target(Protocol):
    name: str

    async def send(self, call: Call, result: Result) -> None: ...


class HttpTarget:
    """The OpenAI-compatible bridge. One session, no connection limit."""

    name = "http"

    def __init__(self, url: str, keys: dict[str, str]) -> None:
        self.url = url
        self.keys = keys
        self._session: aiohttp.ClientSession | None = None
        self._rng = random.Random(0)  # the retries' jitter

    async def __aenter__(self) -> HttpTarget:
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=None, sock_connect=30)
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def send(self, call: Call, result: Result) -> None:
        assert self._session is not None
        body = {
            "model": call.model,
            "stream": True,
            "max_tokens": call.max_tokens,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": call.prompt}],
        }
        result.started_at, since = time.time(), time.perf_counter()
        for attempt in range(call.retries + 1):
            if attempt:
                await asyncio.sleep(sdk_backoff(attempt, result.retry_after, self._rng))
                result.status, result.error, result.retry_after = 0, None, None
                result.retries = attempt
            await stream_chat(
                self._session,
                self.url,
                self.keys[call.tenant],
                body,
                {"x-laneway-class": call.klass},
                result=result,
                since=since,
            )
            if result.status not in RETRIED:
                return


class NatsTarget:
    """Straight onto the subjects with `LanewayClient`: one connection, one inbox per tenant."""

    name = "nats"

    def __init__(self, nats_url: str, prefix: str = "lw", credentials: tuple[str, str] | None = None) -> None:
        self.nats_url = nats_url
        self.prefix = prefix
        # As one trusted upstream service publishing for every tenant (the bridge's NATS user
        # on a `laneway up`); a tenant's own user could publish only as that tenant.
        self.credentials = credentials
        self._nc: Client | None = None
        self._clients: dict[str, LanewayClient] = {}
        self._lock = asyncio.Lock()

    async def __aenter__(self) -> NatsTarget:
        import nats

        from schemas.subjects import service_inbox

        user, password = self.credentials or (None, None)
        self._nc = await nats.connect(
            self.nats_url,
            user=user,
            password=password,
            inbox_prefix=service_inbox(user),  # the user's own replies
            pending_size=64 * 1024 * 1024,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        for client in self._clients.values():
            await client.__aexit__(None, None, None)
        if self._nc is not None:
            await self._nc.close()

    async def _client(self, tenant: str) -> LanewayClient:
        from bridge.client import LanewayClient

        assert self._nc is not None  # entered
        client = self._clients.get(tenant)
        if client is None:
            async with self._lock:
                client = self._clients.get(tenant)
                if client is None:
                    client = await LanewayClient(self._nc, tenant, self.prefix).__aenter__()
                    self._clients[tenant] = client
        return client

    async def send(self, call: Call, result: Result) -> None:
        from bridge.client import LanewayError
        from schemas.openai import ChatBody, Message

        client = await self._client(call.tenant)
        result.started_at = time.time()
        start = time.perf_counter()
        try:
            body = ChatBody(model=call.model, messages=[Message("user", call.prompt)], max_tokens=call.max_tokens)
            async for text in client.generate(body, klass=call.klass):
                if text:
                    result.content_arrived(start)
            result.status = 200
        except LanewayError as exc:
            result.error = exc.code
        finally:
            result.e2e = time.perf_counter() - start


@dataclass
class Sample:
    t: float  # unix time
    inflight: dict[str, int] = field(default_factory=dict)  # per flow
    waiting: dict[str, int] = field(default_factory=dict)  # per flow: no first token yet
    open_streams: float | None = None  # the bridge's laneway_open_streams


class Sampled(Protocol):
    """What `sampler` and `Progress` read: a `Recorder`, or a swarm's `Tally` of its children's."""

    @property
    def sent(self) -> int: ...
    @property
    def errors(self) -> int: ...
    def tokens(self) -> int: ...
    def sample(self, open_streams: float | None = None) -> Sample: ...


class Recorder:
    def __init__(self) -> None:
        self.results: list[Result] = []
        self.active: dict[int, Result] = {}  # by id(): Results are unhashable
        self.samples: list[Sample] = []
        self.sent = 0
        self.errors = 0
        self.started_at = time.time()

    def begin(self, call: Call) -> Result:
        result = Result(klass=call.klass, tenant=call.tenant, flow=call.flow, started_at=time.time())
        self.results.append(result)
        self.active[id(result)] = result
        self.sent += 1
        return result

    def end(self, result: Result) -> None:
        self.active.pop(id(result), None)
        if result.error is not None or (result.status != 200 and not result.cut):
            self.errors += 1

    def tokens(self) -> int:
        return sum(r.tokens for r in self.results)

    def sample(self, open_streams: float | None = None) -> Sample:
        s = Sample(time.time(), open_streams=open_streams)
        for r in self.active.values():
            s.inflight[r.flow] = s.inflight.get(r.flow, 0) + 1
            if r.ttft is None:
                s.waiting[r.flow] = s.waiting.get(r.flow, 0) + 1
        self.samples.append(s)
        return s


async def _one(target: Target, rec: Recorder, call: Call) -> Result:
    result = rec.begin(call)
    try:
        await target.send(call, result)
    except asyncio.CancelledError:
        result.cut = True
        raise
    except Exception as exc:  # a client-side failure is a result, not a crash of the run
        result.error = type(exc).__name__
    finally:
        rec.end(result)
    return result


def _call(flow: Flow, shape: RequestShape, rng: random.Random) -> Call:
    tokens = flow.max_tokens
    if flow.max_tokens_spread:
        lo = max(1, round(tokens * (1 - flow.max_tokens_spread)))
        tokens = rng.randint(lo, max(lo, round(tokens * (1 + flow.max_tokens_spread))))
    prompt = shape.prompt(flow.prompt_tokens)
    if flow.distinct:  # the tag replaces as many characters: the length (the token count) holds
        tag = f"{rng.getrandbits(64):016x} "
        prompt = tag + prompt[len(tag) :]
    return Call(flow.name, flow.tenant, flow.klass, flow.model, prompt, tokens, flow.retries)


async def open_loop(
    target: Target,
    rec: Recorder,
    flow: Flow,
    until: float,
    rng: random.Random,
    shape: RequestShape,
    tasks: set[asyncio.Task],
) -> None:
    """Poisson arrivals until `until` (monotonic); requests run on as tasks in `tasks`."""
    loop = asyncio.get_running_loop()
    next_at = loop.time()
    while True:
        next_at += rng.expovariate(flow.rate)
        if next_at >= until:
            return
        await asyncio.sleep(max(0.0, next_at - loop.time()))
        task = asyncio.create_task(_one(target, rec, _call(flow, shape, rng)))
        tasks.add(task)
        task.add_done_callback(tasks.discard)


async def closed_loop(
    target: Target, rec: Recorder, flow: Flow, until: float, rng: random.Random, shape: RequestShape
) -> None:
    """`flow.users` users: send, read the whole reply, think (exponential), repeat until `until`."""
    loop = asyncio.get_running_loop()

    async def user(delay: float) -> None:
        await asyncio.sleep(delay)
        while loop.time() < until:
            result = await _one(target, rec, _call(flow, shape, rng))
            if flow.think_s > 0:
                await asyncio.sleep(rng.expovariate(1.0 / flow.think_s))
            elif result.error is not None:
                # A failed request can fail without ever suspending: back off as the OpenAI SDK
                # does (the server's Retry-After when it gives one, jittered here so that users
                # refused together do not come back together), or a few thousand users spin.
                wait = result.retry_after or 1.0
                await asyncio.sleep(wait * rng.uniform(1.0, 1.5))
            else:
                await asyncio.sleep(0)

    await asyncio.gather(*(user(rng.uniform(0, flow.ramp_s) if flow.ramp_s else 0.0) for _ in range(flow.users)))


async def run_flows(
    target: Target,
    rec: Recorder,
    flows: list[Flow] | tuple[Flow, ...],
    duration_s: float,
    *,
    seed: int = 1,
    drain_s: float = 0.0,
    drained: Callable[[], bool] | None = None,
) -> None:
    """Run every flow for `duration_s`; then let requests in flight finish for up to `drain_s`
    (or until `drained()` is true) and cut the rest (cut requests are not errors). Closed-loop
    users stop sending at the end."""
    loop = asyncio.get_running_loop()
    until = loop.time() + duration_s
    rng = random.Random(seed)
    shape = RequestShape()
    spawned: set[asyncio.Task] = set()
    drivers = []
    for i, flow in enumerate(flows):
        frng = random.Random(rng.random() + i)
        if flow.open_loop:
            drivers.append(asyncio.create_task(open_loop(target, rec, flow, until, frng, shape, spawned)))
        else:
            drivers.append(asyncio.create_task(closed_loop(target, rec, flow, until, frng, shape)))
    try:
        await asyncio.sleep(max(0.0, until - loop.time()))
        # Closed-loop users are mid-request: give everyone the same drain.
        pending = [t for t in drivers if not t.done()] + list(spawned)
        if drained is not None:
            end = loop.time() + drain_s
            while not drained() and loop.time() < end:
                await asyncio.sleep(0.05)
        elif pending and drain_s > 0:
            await asyncio.wait(pending, timeout=drain_s)
    finally:
        for task in drivers + list(spawned):
            task.cancel()
        await asyncio.gather(*drivers, *spawned, return_exceptions=True)


async def sampler(
    rec: Sampled,
    interval_s: float,
    open_streams: Callable[[], Awaitable[float]] | None = None,
    on_sample: Callable[[Sample], None] | None = None,
) -> None:
    """Sample in-flight counts (and the bridge's open streams) until cancelled."""
    while True:
        value = None
        if open_streams is not None:
            try:
                value = await open_streams()
            except (TimeoutError, aiohttp.ClientError):
                value = None
        s = rec.sample(value)
        if on_sample is not None:
            on_sample(s)
        await asyncio.sleep(interval_s)
