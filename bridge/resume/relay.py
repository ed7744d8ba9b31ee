"""Resuming at another replica: bridges sit behind a load balancer, so a client's resume may
reach a bridge that does not hold its stream. The event id names the holder's edge id; the
asking bridge (`RelayClient`) asks it on `lw.resume.<edge_id>` and the holder (`RelayServer`)
relays the events to the asker's `lw.resume.<asker>.<nonce>`, in order, each chunk saying which
position it continues from: a lost chunk ends the relayed response without `[DONE]`, and the
client resumes again. The holder checks the tenant as a local resume does. Bridges only: these
subjects are the bridge role's (laneway/nats_permissions.py), no tenant account reaches them.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

import nats.errors
from aiohttp import web
from nats.aio.client import Client
from nats.aio.msg import Msg

from bridge.metrics import BridgeMetrics
from bridge.render.respond import Writer, serve_sse
from bridge.resume.replay import UNKNOWN, EventId, follow, resume_error
from bridge.resume.window import Resumes
from schemas import codec
from schemas.resume import Relayed, ResumeAsk, ResumeRelease
from schemas.subjects import Subjects

log = logging.getLogger("laneway.bridge")

ASK_TIMEOUT_S = 2.0  # no answer by then: no bridge holds the stream (its holder is gone)
IDLE_TIMEOUT_S = 60.0  # a relayed stream silent this long: end it (the client may resume again)


class RelayToken:
    """The owner token of a relayed resume: released by the asker's `ResumeRelease`."""

    __slots__ = ("reply",)

    def __init__(self, reply: str) -> None:
        self.reply = reply


class RelayServer:
    """The holder's side: answers asks for the streams it holds."""

    def __init__(self, nc: Client, s: Subjects, resumes: Resumes) -> None:
        self._nc = nc
        self._s = s
        self._resumes = resumes
        self._chunk_bytes = max(1024, nc.max_payload // 2)
        self._tasks: set[asyncio.Task[None]] = set()

    async def on_control(self, msg: Msg) -> None:
        try:
            control = codec.decode_resume_control(msg.data)
        except codec.DecodeError:
            return
        if not control.reply.startswith(f"{self._s.prefix}.resume."):
            return  # relays only ever go to a bridge's resume subject
        if isinstance(control, ResumeRelease):
            replay = self._resumes.get(control.request_id)
            if replay is not None and isinstance(replay.owner, RelayToken) and replay.owner.reply == control.reply:
                self._resumes.let_go(replay, replay.owner)
            return
        await self._ask(control)

    async def _ask(self, ask: ResumeAsk) -> None:
        replay = self._resumes.find(ask.tenant, ask.request_id, ask.path)
        if replay is None:
            return await self._send(ask.reply, Relayed(ask.after, ask.after, code=UNKNOWN))
        if (problem := replay.problem(ask.after)) is not None:
            return await self._send(ask.reply, Relayed(ask.after, ask.after, code=problem[0], message=problem[1]))
        token = RelayToken(ask.reply)
        self._resumes.take(replay, token, None, "relay")
        await self._send(ask.reply, Relayed(ask.after, ask.after))  # accepted: the events follow
        task = asyncio.create_task(self._relay(replay, token, ask), name=f"relay-{ask.request_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _relay(self, replay, token: RelayToken, ask: ResumeAsk) -> None:
        completed = False

        async def sink(events: list[bytes], upto: int) -> None:
            chunk: list[bytes] = []
            position, size = upto - len(events), 0
            for event in events:
                if chunk and size + len(event) > self._chunk_bytes:
                    await self._send(ask.reply, Relayed(position, position + len(chunk), b"".join(chunk)))
                    position, chunk, size = position + len(chunk), [], 0
                chunk.append(event)
                size += len(event)
            await self._send(ask.reply, Relayed(position, upto, b"".join(chunk)))

        try:
            completed = await follow(replay, token, sink, ask.after)
            if completed:
                await self._send(ask.reply, Relayed(replay.count - 1, replay.count - 1, done=True))
        except nats.errors.Error as exc:
            log.warning("relaying %s stopped: %s", ask.request_id, type(exc).__name__)
            completed = False
        finally:
            await self._resumes.release(replay, token, completed)

    async def _send(self, reply: str, relayed: Relayed) -> None:
        await self._nc.publish(reply, codec.encode(relayed))

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class RelayClient:
    """The asker's side: a resume whose event id names another bridge."""

    def __init__(self, nc: Client, s: Subjects, edge_id: str, metrics: BridgeMetrics, write_timeout_s: float) -> None:
        self._nc = nc
        self._s = s
        self._edge_id = edge_id
        self._metrics = metrics
        self._write_timeout_s = write_timeout_s

    async def resume(
        self, request: web.Request, tenant: str, event: EventId, headers: dict[str, str]
    ) -> web.StreamResponse:
        reply = self._s.resume_reply(self._edge_id, uuid.uuid4().hex)
        sub = await self._nc.subscribe(reply, pending_msgs_limit=100_000, pending_bytes_limit=256 << 20)
        done = False
        try:
            ask = ResumeAsk(tenant, event.request_id, event.n, request.path, reply)
            await self._nc.publish(self._s.resume(event.edge_id), codec.encode(ask))
            try:
                answer = codec.decode_relayed((await sub.next_msg(timeout=ASK_TIMEOUT_S)).data)
            except (nats.errors.TimeoutError, codec.DecodeError):
                raise resume_error(UNKNOWN) from None
            if answer.code:
                raise resume_error(answer.code, answer.message)

            async def write(writer: Writer) -> None:
                nonlocal done
                expected = event.n
                while True:
                    try:
                        chunk = codec.decode_relayed((await sub.next_msg(timeout=IDLE_TIMEOUT_S)).data)
                    except (nats.errors.TimeoutError, codec.DecodeError):
                        return
                    if chunk.since != expected:
                        log.warning(
                            "relayed stream %s lost events (at %d, got %d)", event.request_id, expected, chunk.since
                        )
                        return
                    if chunk.events:
                        await writer.write(chunk.events)
                    expected = chunk.upto
                    if chunk.done:
                        done = True
                        await writer.write(b"", eof=True)
                        return

            return await serve_sse(request, headers, event.request_id, self._metrics, self._write_timeout_s, write)
        finally:
            try:
                if not done:  # the client left (or the relay broke): the holder keeps the stream
                    await self._nc.publish(
                        self._s.resume(event.edge_id), codec.encode(ResumeRelease(event.request_id, reply))
                    )
                await sub.unsubscribe()
            except nats.errors.Error as exc:  # the connection is closing: the holder's window ends it
                log.debug("resume of %s not released: %s", event.request_id, type(exc).__name__)
