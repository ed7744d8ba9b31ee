"""The gate side: what this broker admitted goes to the scheduler's lanes.

When this broker holds the lease, straight into its own scheduler. Otherwise as an `Admitted`
request on `lw.sched.admit`, and a copy stays in `forwarded` until the scheduler's `Settled`
names it (or its answer says refused, or the client cancels). The copies are what survive a
scheduler's death: each new scheduler announces itself and every origin sends all of them again
(the lanes keep one entry per (tenant, request id)). A copy no scheduler took (none was there,
or no answer came) is sent again every `RESEND_S`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from broker.metrics import BrokerMetrics
from broker.scheduler.answers import AckHandle
from broker.scheduler.schedule import DISPATCH_OVERHEAD_BYTES, Scheduler
from core.tasks import pause
from schemas import codec
from schemas.subjects import Subjects
from schemas.work import Admitted

log = logging.getLogger("laneway.origin")

ANSWER_TIMEOUT_S = 2.0
RESEND_S = 1.0
SEND_AT_ONCE = 128  # admissions in flight while sending every copy again


@dataclass(slots=True, eq=False)
class Forwarded:
    admitted: Admitted
    data: bytes  # encoded once, sent as often as schedulers change
    taken: bool = False
    sending: bool = False


class Origin:
    def __init__(
        self,
        nc: Client,
        s: Subjects,
        broker_id: str,
        metrics: BrokerMetrics,
        scheduler: Scheduler,
        release: Callable[[str, str], Awaitable[None]],
    ) -> None:
        self._nc = nc
        self.s = s
        self.id = broker_id
        self.metrics = metrics
        self._scheduler = scheduler
        self._release = release
        self.forwarded: dict[tuple[str, str], Forwarded] = {}
        self._sub: Subscription | None = None

    def __len__(self) -> int:
        return len(self.forwarded)

    async def start(self) -> None:
        self._sub = await self._nc.subscribe(self.s.sched_settled(self.id), cb=self._on_settled)

    async def admit(self, admitted: Admitted, msg: Msg) -> None:
        if self._scheduler.active:
            size = len(msg.data) + len(msg.reply) + DISPATCH_OVERHEAD_BYTES
            if not await self._scheduler.enqueue(admitted, msg, size):
                await self._release(admitted.request.tenant, admitted.request.request_id)
            return
        request = admitted.request
        entry = Forwarded(admitted, codec.encode(admitted))
        self.forwarded[(request.tenant, request.request_id)] = entry
        self.metrics.forwarded.inc()
        self._gauge()
        await self._send(entry)

    async def _send(self, entry: Forwarded) -> None:
        entry.sending = True
        try:
            reply = await self._nc.request(self.s.sched_admit, entry.data, timeout=ANSWER_TIMEOUT_S)
        except nats.errors.NoRespondersError:
            return  # no scheduler right now: sent again when one announces itself
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            log.debug("no answer from the scheduler: %r", exc)
            return
        finally:
            entry.sending = False
        try:
            taken = codec.decode_admit_answer(reply.data).taken
        except codec.DecodeError:
            return
        entry.taken = True
        if not taken:  # refused there, the client told: nothing to keep
            request = entry.admitted.request
            self._drop(request.tenant, request.request_id, entry)
            await self._release(request.tenant, request.request_id)

    def _drop(self, tenant: str, request_id: str, entry: Forwarded | None = None) -> Forwarded | None:
        key = (tenant, request_id)
        found = self.forwarded.get(key)
        if found is None or (entry is not None and found is not entry):
            return None
        del self.forwarded[key]
        self._gauge()
        return found

    def _gauge(self) -> None:
        self.metrics.forwarded_waiting.set(len(self.forwarded))

    async def _on_settled(self, msg: Msg) -> None:
        try:
            settled = codec.decode_settled(msg.data).settled
        except codec.DecodeError:
            log.warning("ignored a malformed settled notice (%d bytes)", len(msg.data))
            return
        for s in settled:
            self._drop(s.tenant, s.request_id)
            if s.release:
                await self._release(s.tenant, s.request_id)

    async def cancel(self, tenant: str, request_id: str) -> bool:
        """A cancelled copy: removed from JetStream here too (no scheduler may hold it) and its
        grant given back (again, harmlessly, when the scheduler's `Settled` comes)."""
        entry = self._drop(tenant, request_id)
        if entry is None:
            return False
        await AckHandle(self._nc, entry.admitted.ack_subject).term()
        await self._release(tenant, request_id)
        return True

    # -- schedulers change ----------------------------------------------------------------
    async def on_leader(self, msg: Msg) -> None:
        leader = msg.data.decode(errors="replace")
        if not leader:
            return  # the lease was given up: the next holder announces itself
        if leader != self.id:  # this broker's own takeover hands its copies over itself
            await self._send_all(list(self.forwarded.values()))

    async def hand_to_self(self) -> None:
        """This broker took the lease: its copies go into its own lanes, no longer copies."""
        for key, entry in list(self.forwarded.items()):
            del self.forwarded[key]
            ack = AckHandle(self._nc, entry.admitted.ack_subject)
            if not await self._scheduler.enqueue(entry.admitted, ack, len(entry.data) + DISPATCH_OVERHEAD_BYTES):
                await self._release(*key)
        self._gauge()

    async def _forget_expired(self, now: float) -> None:
        expired = [key for key, e in self.forwarded.items() if e.admitted.request.deadline < now]
        for key in expired:
            del self.forwarded[key]
            await self._release(*key)
        if expired:
            self._gauge()

    async def _send_all(self, entries: list[Forwarded]) -> None:
        for entry in entries:
            entry.taken = False
        self.metrics.reforwarded.inc(len(entries))
        for i in range(0, len(entries), SEND_AT_ONCE):
            await asyncio.gather(*(self._send(e) for e in entries[i : i + SEND_AT_ONCE]))

    async def resend_forever(self) -> None:
        """Copies no scheduler took yet (none was there, or no answer came) go again; copies past
        their deadline are forgotten (a lost `Settled` must not keep one, nor its room, forever)."""
        while True:
            await pause(RESEND_S)
            await self._forget_expired(time.time())
            if self._scheduler.active:
                await self.hand_to_self()
            else:
                await self._send_all([e for e in self.forwarded.values() if not (e.taken or e.sending)])
