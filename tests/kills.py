"""A worker process killed under `laneway up`: the streams its clients read over HTTP, which
worker to kill (the one streaming the most now), and the usage records that say how each request was
metered. Shared by the tests that kill workers mid-stream (sim and vLLM)."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import time
from dataclasses import dataclass, field

import aiohttp
import orjson

from core.promtext import parse
from loadtest.processes import LanewayUp, metrics_port
from schemas import codec
from schemas.subjects import Subjects
from tests.wait import eventually
from workers.engines.sim.output import natural_length

HANG_S = 120  # a bound on a hang, not a window


def up_flags(sim_speed: float = 0.1) -> list[str]:
    """`laneway up --workers 2` for killing workers under: the sim deterministic at temperature 0
    and slowed (`sim_speed`) so a stream outlives the kill, no response cache (a second run would
    be replayed from it), NATS without auth (a test reads usage records and dead letters as they
    are published), beats every 0.5 s. Every stream accepted: on a loaded machine the bridge's
    measured stream limit and delivery-lag door turned some away with a 503 (their own tests);
    these are about what was accepted when a worker died."""
    return [
        "--workers",
        "2",
        "--pii",
        "off",
        "--metrics",
        "--no-nats-auth",
        "--cache-ttl",
        "0",
        "--sim-profile",
        "llama-8b-h100",
        "--sim-speed",
        str(sim_speed),
        "--heartbeat-interval",
        "0.5",
        "--initial-stream-limit",
        "0",
        "--max-delivery-lag",
        "0",
    ]


def sim_chats(n: int) -> list[dict]:
    """`n` streamed chats of distinct prompts whose SIMULATED answers run 60 tokens or more (the
    sim's natural length is a hash of the prompt): half end at their own stop, half are capped
    by max_tokens."""
    texts = (f"question number {i}: tell me about lanes" for i in itertools.count())
    chats = []
    for i, prompt in enumerate(itertools.islice((t for t in texts if natural_length(t, 0, True) >= 60), n)):
        chat = {
            "model": "laneway-sim",
            "stream": True,
            "temperature": 0.0,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": prompt}],
        }
        if i % 2:
            chat["max_tokens"] = 50 + 2 * i
        chats.append(chat)
    return chats


@dataclass
class Stream:
    text: str = ""
    chunks: int = 0
    finish_reason: str | None = None
    usage: dict | None = None
    error: dict | None = None
    request_id: str = ""
    status: int = 0
    done: bool = False
    last_id: str = ""  # the last SSE event id (resumable streams)
    pieces: list[str] = field(default_factory=list)
    arrived: list[float] = field(default_factory=list)  # monotonic time of each content chunk

    def stall(self) -> float:
        """The longest wait between two content chunks."""
        return max((b - a for a, b in itertools.pairwise(self.arrived)), default=0.0)


async def read(
    http: aiohttp.ClientSession,
    up: LanewayUp,
    body: dict,
    into: Stream,
    *,
    url: str | None = None,
    headers: dict[str, str] | None = None,
    cut_after: int | None = None,
) -> Stream:
    """One streamed chat completion, read into `into` as it arrives (at `url`, a bridge of `up`'s
    by default, with `headers` added). With `cut_after`, the client drops the connection once
    `into` holds that many content chunks, and the stream is not done: it may be resumed from
    `into.last_id` (a resumable stream's events carry ids) into the same `into`."""
    headers = {"Authorization": f"Bearer {up.api_key}", **(headers or {})}
    cut = False
    try:
        async with http.post(f"{url or up.url}/v1/chat/completions", json=body, headers=headers) as resp:
            into.status = resp.status
            into.request_id = into.request_id or resp.headers.get("x-request-id", "")
            async for raw in resp.content:
                if raw.startswith(b"id: "):
                    into.last_id = raw[4:].strip().decode()
                if not raw.startswith(b"data: ") or raw.strip() == b"data: [DONE]":
                    continue
                chunk = orjson.loads(raw[6:])
                if "error" in chunk:
                    into.error = chunk["error"]
                    continue
                if chunk.get("usage"):
                    into.usage = chunk["usage"]
                for choice in chunk.get("choices") or ():
                    if content := choice["delta"].get("content"):
                        into.pieces.append(content)
                        into.arrived.append(time.monotonic())
                        into.text += content
                        into.chunks += 1
                    into.finish_reason = choice.get("finish_reason") or into.finish_reason
                if cut_after is not None and into.chunks >= cut_after:
                    cut = True
                    resp.close()  # the connection, mid-stream
                    break
    finally:
        into.done = not cut
    return into


# Stream entries (tokens, ends) a worker published. Not its frames: a frame carries all the
# entries for one bridge's streams in one flush, so a worker streaming 1 stream and one streaming
# 15 to the same bridge publish about as many frames.
ENTRIES = "laneway_worker_entries_per_frame_sum"
WATCH_ENTRIES = 12  # published while `streaming_worker` watches: enough to tell the carriers apart


async def worker_metric(http: aiohttp.ClientSession, up: LanewayUp, metric: str = ENTRIES) -> dict[int, float]:
    """A metric of each live worker (pid → value): by default the stream entries it published."""
    counts = {}
    for pid in up.role_pids("worker"):
        if (port := metrics_port(pid)) is not None:
            try:
                async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
                    counts[pid] = parse(await resp.text()).total(metric)
            except aiohttp.ClientError:
                continue
    return counts


async def streaming_worker(http: aiohttp.ClientSession, up: LanewayUp) -> int:
    """The worker carrying the most streams now: the one that publishes the most stream entries
    while WATCH_ENTRIES are published. Not the most since an earlier reading (it may have
    finished its streams since), nor the first seen publishing (it may carry one), nor read off
    the slots gauge (that is as old as a worker's last pull)."""
    start = await worker_metric(http, up)
    found = 0

    async def watched() -> bool:
        nonlocal found
        now = await worker_metric(http, up)
        moved = {pid: n - start.get(pid, n) for pid, n in now.items()}
        if sum(moved.values()) < WATCH_ENTRIES:
            return False
        found = max(moved, key=lambda pid: moved[pid])
        return True

    assert await eventually(watched, timeout=HANG_S), f"no worker publishes stream entries: {start}"
    return found


async def first_streaming(http: aiohttp.ClientSession, up: LanewayUp, since: dict[int, float]) -> int:
    """Of the workers publishing stream entries at the first look, the one that published the
    most since `since`: a kill at once, before a few fast streams (vLLM's) end."""
    last = await worker_metric(http, up)
    found = 0

    async def moved() -> bool:
        nonlocal last, found
        now = await worker_metric(http, up)
        moving = [pid for pid, n in now.items() if n > last.get(pid, n)]
        found = max(moving, key=lambda pid: now[pid] - since.get(pid, 0.0), default=0)
        last = now
        return found != 0

    assert await eventually(moved, timeout=HANG_S), f"no worker publishes stream entries: {since} then {last}"
    return found


async def usage_records(nc) -> dict[str, list]:
    """Every usage record published from now on, by request id (filled as they come)."""
    records: dict[str, list] = {}

    async def on_usage(msg) -> None:
        usage = codec.decode_usage(msg.data)
        records.setdefault(usage.request_id, []).append(usage)

    await nc.subscribe(Subjects().usage_all, cb=on_usage)
    return records


async def run_streams(
    up: LanewayUp,
    http: aiohttp.ClientSession,
    bodies: list[dict],
    kill: signal.Signals | None,
    along: tuple[int, ...] = (),
) -> tuple[list[Stream], int]:
    """Streams `bodies` at once; with `kill`, once each has tokens on the wire, signals the worker
    streaming now that sent the most of them (SIGSTOP: until they went on elsewhere, then
    SIGCONT), and the processes `along` just before it, in the same moment. Returns the
    streams, ended, and the worker's pid."""
    streams = [Stream() for _ in bodies]
    before = await worker_metric(http, up) if kill is not None else {}
    tasks = [asyncio.create_task(read(http, up, b, s)) for b, s in zip(bodies, streams, strict=True)]
    victim = 0
    if kill is not None:
        # Mid-stream: every stream has tokens on the wire.
        assert await eventually(lambda: all(s.chunks >= 3 for s in streams), timeout=HANG_S)
        victim = await first_streaming(http, up, since=before)
        for pid in (*along, victim):
            os.kill(pid, kill)
        if kill is signal.SIGSTOP:
            # Silent past the loss bound: its streams go on elsewhere while it sleeps; then it wakes.
            seen = [s.chunks for s in streams]
            try:
                assert await eventually(
                    lambda: all(s.done or s.chunks > c + 2 for s, c in zip(streams, seen, strict=True)),
                    timeout=HANG_S,
                ), "the stopped worker's streams did not go on elsewhere"
            finally:
                os.kill(victim, signal.SIGCONT)
    _, hung = await asyncio.wait(tasks, timeout=HANG_S)
    assert not hung, f"{len(hung)} streams hung"
    return streams, victim


def left_in_group(leader: int) -> list[int]:
    """Live processes in the process group `leader` led (`laneway up` starts each child in a
    session of its own): what a killed worker left behind, such as vLLM's engine core."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                state, _ppid, pgid = stat.read().rsplit(")", 1)[1].split()[:3]
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(pgid) == leader and state != "Z":
            members.append(int(entry))
    return members


async def same_as_unbroken(unbroken: list[Stream], broken: list[Stream], records: dict[str, list], nc) -> list[int]:
    """Each broken stream is its unbroken run's (text, finish_reason, usage), with no error and
    one usage record of the same counts; returns each record's `continued_tokens`."""
    assert [s.error for s in broken] == [None] * len(broken), [s.error for s in broken if s.error]
    for i, (a, b) in enumerate(zip(unbroken, broken, strict=True)):
        # Piece by piece: a token missing or repeated shows as a word off (the sim's are words).
        assert b.text.split() == a.text.split(), (i, a.text, b.text)
        assert b.text == a.text, i
        assert b.finish_reason == a.finish_reason, i
        assert b.usage == a.usage, i
    assert await eventually(lambda: all(s.request_id in records for s in broken)), "usage records missing"
    await nc.flush()
    for a, b in zip(unbroken, broken, strict=True):
        assert len(records[b.request_id]) == 1, records[b.request_id]
        mine, theirs = records[b.request_id][0], records[a.request_id][0]
        assert (mine.prompt_tokens, mine.completion_tokens) == (theirs.prompt_tokens, theirs.completion_tokens)
        # Which delivery of which message each is: a continuation's voids a fenced worker's late record.
        assert (theirs.attempt, theirs.takes_over) == (1, False) and theirs.message > 0, theirs
        assert mine.takes_over == (mine.attempt > 1) == bool(mine.continued_tokens) and mine.message > 0, mine
    continued = [records[s.request_id][0].continued_tokens for s in broken]
    assert any(continued), "no stream was continued: the killed worker served none"
    return continued
