"""A continuous pull on one durable consumer: messages arrive the moment they are stored.

nats-py's `fetch()` waits for a whole batch (or its timeout) once a long poll has begun, which
would add up to the timeout to a lone request's latency. Instead we keep ONE pull request open
with a batch of up to `batch` messages and server idle heartbeats; each message is handed to
`on_message` as it lands, and a new pull is issued when the current one is used up or expires.
Room is the caller's: no pull is issued while `room()` is 0 (the lanes are full), which is the
backpressure that keeps unbounded work in JetStream, not in memory.

Junk is read at a bounded rate: `on_message` says whether a message was readable, and each junk
message spends a token of a bucket (`JUNK_BURST`, refilled at `JUNK_RATE` a second); with none
left, no pull is issued until one is back. A flood of junk then costs the broker a few hundred
reads a second, whatever its sender's rate: the rest waits in its sender's own backlog, which
JetStream caps (and then refuses the sender's publishes), in front of that sender's own requests.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from core.tasks import cancel_and_wait, wait_event

log = logging.getLogger("laneway.intake")

JUNK_BURST = 256  # junk messages read at once before the rate applies ...
JUNK_RATE = 100.0  # ... then this many a second (a well-formed request spends nothing)


class PullIntake:
    def __init__(
        self,
        nc: Client,
        stream: str,
        durable: str,
        on_message: Callable[[Msg], Awaitable[bool]],
        room: Callable[[], int],
        batch: int = 256,
        expires_s: float = 10.0,
        heartbeat_s: float = 1.0,
    ) -> None:
        self._nc = nc
        self._next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self._on_message = on_message
        self._room = room
        self._batch = batch
        self._expires_s = expires_s
        self._heartbeat_s = heartbeat_s
        self._inbox = nc.new_inbox()
        self._sub: Subscription | None = None
        self._remaining = 0  # messages the open pull may still deliver
        self._last_seen = 0.0
        self._junk_tokens: float = JUNK_BURST  # junk this pull may still read, as of `_junk_at`
        self._junk_at = 0.0
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    async def start(self) -> None:
        self._sub = await self._nc.subscribe(self._inbox, cb=self._deliver)
        self._task = asyncio.create_task(self._keep_pulling(), name=f"laneway-intake-{self._next_subject}")

    async def stop(self) -> None:
        """No new pull; then hand on what the open pull delivered before the server saw the UNSUB
        (drain). Those messages count as delivered to this consumer: dropped here, each would wait
        out `ack_wait` before any broker saw it again. The server forgets the open pull itself
        once its reply subject has no interest."""
        task, self._task = self._task, None
        await cancel_and_wait(task)
        sub, self._sub = self._sub, None
        if sub is not None:
            try:
                await sub.drain()
            except nats.errors.Error:
                # Closed: what was queued is gone and comes back after ack_wait. The flush went
                # unanswered (disconnected): the callback still runs on what was queued.
                pass

    def poke(self) -> None:
        """Room was freed: pull again if the open request is used up."""
        self._wake.set()

    async def _keep_pulling(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            # A pull with no heartbeat for a while died with a server restart or reconnect.
            if self._remaining and now - self._last_seen > 3 * self._heartbeat_s + 1:
                log.info("pull request went silent; issuing a new one")
                self._remaining = 0
            hold = self._junk_hold(now)
            room = self._room()
            if self._remaining == 0 and room > 0 and hold == 0 and self._nc.is_connected:
                n = min(self._batch, room)
                request = {
                    "batch": n,
                    "expires": int(self._expires_s * 1e9),
                    "idle_heartbeat": int(self._heartbeat_s * 1e9),
                }
                try:
                    await self._nc.publish(self._next_subject, json.dumps(request).encode(), reply=self._inbox)
                    self._remaining = n
                    self._last_seen = now
                except nats.errors.Error as exc:  # disconnected: the client reconnects by itself
                    log.warning("pull request failed: %s", exc)
            self._wake.clear()
            await wait_event(self._wake, hold or self._heartbeat_s)

    def _junk_hold(self, now: float) -> float:
        """How much longer the next pull waits for a junk token to come back."""
        self._junk_tokens = min(JUNK_BURST, self._junk_tokens + (now - self._junk_at) * JUNK_RATE)
        self._junk_at = now
        return 0.0 if self._junk_tokens >= 1 else (1 - self._junk_tokens) / JUNK_RATE

    async def _deliver(self, msg: Msg) -> None:
        self._last_seen = asyncio.get_running_loop().time()
        status = msg.headers.get("Status") if msg.headers else None
        if status:
            if status == "100":  # idle heartbeat: the pull is alive
                return
            # 404/408: the pull expired or had nothing; 409: max waiting, leadership change,
            # consumer deleted. Either way this pull is over. 503: no such consumer (yet: a class
            # set live before ops made its consumer); the next try waits a heartbeat, not at once.
            if status in ("409", "503"):
                log.info(
                    "pull on %s ended: %s %s", self._next_subject, status, (msg.headers or {}).get("Description", "")
                )
            self._remaining = 0
            if status != "503":
                self._wake.set()
            return
        self._remaining = max(0, self._remaining - 1)
        if self._remaining == 0:
            self._wake.set()
        try:
            if not await self._on_message(msg):
                self._junk_tokens -= 1
        except Exception:
            # The loop boundary: whatever a message breaks (a dropped connection mid-handling, or
            # a bug), it stays unacked and comes back after ack_wait; never lose the loop.
            log.exception("handling a request message failed: %s", msg.subject)
