"""Pulling work: a `Credit` goes to `lw.pull.<pool>` only while the engine has a free slot.

The scheduler (the broker holding the lease, `broker/scheduler/`) holds a pull open until there
is work (a long poll). A fresh credit replaces the parked pull whenever the worker's room changes,
when a new scheduler announces itself (the runner sets `room`), and before the broker's hold
ends (`RENEW_PART`), so an idle worker is never unparked: it costs a pull and an empty answer
per `pull_wait_s`. A pull's answer is a `Batch` of dispatches. A reply that cannot be decoded
is logged, counted and skipped: no ack subject in it can be read, so its requests stay unacked
and JetStream redelivers them to the broker after ack_wait; the loop goes on pulling.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Protocol

from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from schemas import codec
from schemas.work import Credit, Dispatch
from workers.config import WorkerConfig
from workers.engine import Engine, RequestKey
from workers.metrics import WorkerMetrics

log = logging.getLogger("laneway.worker")


# A parked credit's pending prefill, once done, is stale by this part of an engine step or more:
# worth a fresh pull (one more per request with long prompts, none with short ones).
PREFILL_STALE_PART = 8
# An idle worker renews its pull this far into the broker's hold, before the hold ends: a pull that
# expired first leaves the worker unparked for a round trip, and a request arriving then goes to
# another worker (one that must load its LoRA adapter, say, evicting the one it holds).
RENEW_PART = 0.8


class Accepted(Protocol):
    """A request this worker took, as the credit counts it."""

    dispatch: Dispatch
    first_token_at: float | None


class Puller:
    def __init__(
        self,
        nc: Client,
        subject: str,
        config: WorkerConfig,
        engine: Engine,
        metrics: WorkerMetrics,
        accepted: Mapping[RequestKey, Accepted],
        on_batch: Callable[[list[Dispatch]], None],
        room: asyncio.Event,
        stopping: asyncio.Event,
    ) -> None:
        self._nc = nc
        self._subject = subject
        self.config = config
        self.engine = engine
        self.metrics = metrics
        self._accepted = accepted
        self._on_batch = on_batch
        self._room = room  # set whenever the credit may have changed (a slot, a prefill)
        self._stopping = stopping
        self._late: set[asyncio.Task[None]] = set()
        self._reported_prefill = 0  # the pending prefill the last credit reported
        self._step_tokens = 0

    def prefilled(self) -> None:
        """A prompt's prefill is done. If the last credit reported enough pending prefill that the
        scheduler's choices would read it wrong (the lanes' prefill caps, the affinity choice's
        steps before a first token), send a fresh one; a smaller queue is not worth a pull."""
        if self._reported_prefill >= max(1, self._step_tokens // PREFILL_STALE_PART):
            self._room.set()

    def credit(self) -> Credit | None:
        """Room from the engine's state, corrected by what this worker has accepted: a request
        handed to a serving task is not in the engine until that task first runs, and counting
        it twice is safer than over-committing the engine."""
        cap = self.engine.capacity()
        running: dict[str, int] = {}
        prefill: dict[str, int] = {}  # prompts not yet through the engine's prefill
        tenant_slots: dict[str, dict[str, int]] = {}
        tenant_tokens: dict[str, dict[str, int]] = {}
        tenant_prefill: dict[str, dict[str, int]] = {}
        unstarted_cost = 0
        taken = 0  # each of a request's n choices is a sequence slot
        adapters: dict[str, None] = {}  # those of accepted requests first: the engine loads them next
        for active in self._accepted.values():
            request = active.dispatch.request
            if active.dispatch.adapter:
                adapters[request.model] = None
            klass, tenant, cost = request.klass, request.tenant, request.estimated_cost()
            running[klass] = running.get(klass, 0) + request.choices
            slots, tokens = tenant_slots.setdefault(klass, {}), tenant_tokens.setdefault(klass, {})
            slots[tenant] = slots.get(tenant, 0) + request.choices
            tokens[tenant] = tokens.get(tenant, 0) + cost
            taken += request.choices
            if active.first_token_at is None:
                unstarted_cost += cost
                prompt = request.estimated_prompt_tokens()
                prefill[klass] = prefill.get(klass, 0) + prompt
                pending = tenant_prefill.setdefault(klass, {})
                pending[tenant] = pending.get(tenant, 0) + prompt
        free = min(cap.free_slots, cap.total_slots - taken)
        self.metrics.slots_total.labels(self.config.pool).set(cap.total_slots)
        self.metrics.slots_in_use.labels(self.config.pool).set(taken)
        self.metrics.kv_tokens.labels(self.config.pool).set(cap.kv_tokens)
        self.metrics.kv_free_tokens.labels(self.config.pool).set(cap.token_budget)
        self.metrics.running.set(
            {(self.config.pool, klass, tenant): n for klass, held in tenant_slots.items() for tenant, n in held.items()}
        )
        if free <= 0:
            return None
        self._reported_prefill, self._step_tokens = sum(prefill.values()), cap.step_tokens
        return Credit(
            worker_id=self.config.worker_id,
            pool=self.config.pool,
            free_slots=free,
            token_budget=max(0, cap.token_budget - unstarted_cost),
            total_slots=cap.total_slots,
            classes=list(self.config.classes),
            running=running,
            wait_s=self.config.pull_wait_s,
            step_tokens=cap.step_tokens,
            prefill=prefill,
            kv_tokens=cap.kv_tokens,
            # Held, or about to be: the pull that follows a batch goes out before the engine's
            # step loads its adapters, and the broker must not read this worker as without them.
            adapters=list(adapters | dict.fromkeys(cap.adapters)),
            tenant_slots=tenant_slots,
            tenant_tokens=tenant_tokens,
            tenant_prefill=tenant_prefill,
        )

    async def run(self) -> None:
        while not self._stopping.is_set():
            credit = self.credit()
            if credit is None:
                self._room.clear()
                await self._room.wait()
                continue
            self._room.clear()
            self.metrics.pulls.labels(self.config.pool).inc()
            pull = asyncio.create_task(self._pull(credit))
            room = asyncio.create_task(self._room.wait())
            await asyncio.wait({pull, room}, timeout=credit.wait_s * RENEW_PART, return_when=asyncio.FIRST_COMPLETED)
            room.cancel()
            if not pull.done():
                # Room grew, or the broker's hold is near its end: a fresh credit replaces the
                # pull (the broker answers the old one at once); the old one's reply is still served.
                self._late.add(pull)
                pull.add_done_callback(self._late.discard)
                continue
            await pull

    async def _pull(self, credit: Credit) -> None:
        try:
            reply = await self._nc.request(self._subject, codec.encode(credit), timeout=self.config.pull_wait_s + 2.0)
        except (TimeoutError, NatsTimeout):
            return
        except NoRespondersError:
            await asyncio.sleep(0.5)  # no broker yet, or it is restarting
            return
        except (NatsError, OSError) as exc:  # disconnected: the client reconnects
            log.warning("pull failed: %s", exc)
            await asyncio.sleep(0.5)
            return
        try:
            dispatches = codec.decode_batch(reply.data).dispatches
        except codec.DecodeError as exc:
            self.metrics.malformed_batches.labels(self.config.pool).inc()
            log.error(
                "skipped a malformed batch answering a pull on %s (%d bytes): %s; its requests "
                "are redelivered after ack_wait",
                self._subject,
                len(reply.data),
                exc,
            )
            return
        self._on_batch(dispatches)
