"""The worker process: pull when there is room, serve, one frame per step per inbox, ack.

Each job has its own module; this one wires them and owns the worker's lifecycle.
- Pull (`workers/pulling.py`): a `Credit` goes to `lw.pull.<pool>` only while the engine has a
  free slot; the answer is a `Batch` of dispatches.
- Serve (`workers/serve.py`): one request's life, from its dispatch to its ack; the cascade's
  hold-or-escalate (`workers/cascade.py`) and the answer cache (`workers/cache.py`) on the way.
- Frames (`workers/outbox.py`): each stream's deltas go into an outbox keyed by reply subject; a
  flusher publishes ONE `TokenFrame` per inbox per event-loop turn (and at most one per
  `frame_interval_s`). An engine step wakes every stream it produced a token for in the same
  turn, so a frame carries that whole step (one NATS message per inbox instead of one per token
  per stream: nats-py costs ~17 µs of CPU per message).
- Acks: in-progress (`+WPI`) for every running request every `in_progress_s`, the final `+ACK`
  after the request's last frame (same connection, so the order holds), `+TERM` for requests
  refused here.
- Metering (`workers/metering.py`) and liveness (`workers/heartbeat.py`).
- An `EngineDead` stops the worker without acking: JetStream redelivers its requests elsewhere.
  So does the death of any of its own loops (the flusher, the pull loop): a worker that can no
  longer answer must not keep taking work, so it stops pulling and exits non-zero.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine

import msgspec
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from core.connect import connect, disconnect
from core.liveness import hold
from core.looplag import LoopLag
from core.provision import wait_provisioned
from core.tasks import beat_forever, cancel_and_wait, pause
from schemas import codec
from schemas.subjects import BadToken
from schemas.work import Dispatch
from workers.active import Active, nak_with_delay
from workers.cache import AnswerStore
from workers.cascade import Escalator
from workers.config import WorkerConfig
from workers.continuing import EdgeAsk
from workers.engine import Engine, RequestKey
from workers.heartbeat import heartbeat
from workers.metering import UsageRecorder
from workers.metrics import WorkerMetrics
from workers.orphans import cancel_orphans
from workers.outbox import Outbox
from workers.pulling import Puller
from workers.serve import WPI, Serving

__all__ = ["Worker", "WorkerConfig"]

log = logging.getLogger("laneway.worker")


class Worker:
    def __init__(self, config: WorkerConfig, engine: Engine, metrics: WorkerMetrics | None = None) -> None:
        self.config = config.with_id()
        self.id = self.config.worker_id
        self.s = self.config.nats.subjects
        self.engine = engine
        self.metrics = metrics or WorkerMetrics()
        self.ready = False
        self.dead: BaseException | None = None
        self._nc: Client | None = None
        self._active: dict[RequestKey, Active] = {}
        self._outbox = Outbox(self.id, self.config.pool, self.metrics, self.config.frame_interval_s)
        self._room = asyncio.Event()
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._serving: Serving | None = None
        self._puller: Puller | None = None
        self.usage = UsageRecorder(self._outbox, self.s, self.config.pool, self.id)
        self.loop_lag = LoopLag()

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        n = self.config.nats
        self._nc = await connect(n, f"laneway-worker-{self.id}")
        js = self._nc.jetstream()
        self._serving = Serving(
            self.id,
            self.config.pool,
            self.s,
            self.engine,
            self.metrics,
            self._outbox,
            self.usage,
            Escalator(js, self.s, self.metrics, self.config.pool),
            AnswerStore(js, self.s),
            self._active,
            self._room,
            self._die,
            prefilled=lambda: self._puller.prefilled() if self._puller else None,
            ask_edge=EdgeAsk(self._nc, self.s, self.id),
        )
        self._tasks.append(self._watched(self.loop_lag.run(), "loop-lag"))
        self._tasks.append(self._watched(beat_forever(self._heartbeat, self.config.heartbeat_s), "heartbeats"))
        # Like the broker and the bridge: a worker may start before provisioning ran, and waits
        # for the one bucket it reads (prices, for metering), the one its NATS user may look up.
        await wait_provisioned(js, self.s, "worker", buckets=("routing",))
        await self.usage.start(js)
        # Load and warm up before taking any work: the first request pays no cold start.
        await self.engine.start()
        await self.engine.warmup()
        self.ready = True
        await self._heartbeat()
        await self._nc.subscribe(self.s.cancel_all, cb=self._on_cancel)
        await self._nc.subscribe(self.s.fence(self.id), cb=self._on_fence)
        await hold(self._nc, self.s.worker_alive(self.id))  # broker/worker_probes.py probes it
        await self._nc.subscribe(self.s.worker_ping, cb=self._on_ping)
        await self._nc.subscribe(self.s.sched_leader, cb=self._on_new_scheduler)
        self._puller = puller = Puller(
            self._nc,
            self.s.pull(self.config.pool),
            self.config,
            self.engine,
            self.metrics,
            self._active,
            self._on_batch,
            self._room,
            self._stopping,
        )
        self._flusher = self._watched(self._outbox.run(self._nc), "flusher")
        self._tasks += [
            self._flusher,
            self._watched(self._in_progress(), "in-progress"),
            self._watched(puller.run(), "pull-loop"),
            self._watched(
                cancel_orphans(self._nc, self.s, self._active, self._abort, self.metrics, self.config.pool), "orphans"
            ),
        ]
        log.info(
            "worker %s ready: pool=%s engine=%s model=%s",
            self.id,
            self.config.pool,
            self.engine.name,
            self.engine.model,
        )

    async def wait(self) -> int:
        """Until stopped or dead; the process exit code."""
        await self._stopping.wait()
        return 1 if self.dead is not None else 0

    def _watched(self, loop: Coroutine[object, object, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(loop, name=name)
        task.add_done_callback(self._loop_ended)
        return task

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        error = None if task.cancelled() else task.exception()
        if error is not None:
            log.error(
                "worker loop %s died: %r; stopping without taking more work", task.get_name(), error, exc_info=error
            )
            self._die(error)

    def _die(self, error: BaseException) -> None:
        """Stop pulling; `wait()` returns 1 and running requests are left unacked."""
        self.dead = error
        self._stopping.set()
        self._room.set()

    async def stop(self) -> None:
        """Stop pulling; let running requests finish for `drain_s`; then hand the rest back."""
        self._stopping.set()
        self.ready = False
        pending = [a.task for a in self._active.values() if a.task is not None]
        if pending and self.dead is None:
            await asyncio.wait(pending, timeout=self.config.drain_s)
        for active in list(self._active.values()):
            if active.task is not None:
                active.task.cancel()  # unacked: JetStream redelivers them
        if self._nc is not None and not (self._flusher is not None and self._flusher.done()):
            await self._outbox.flush(self._nc)  # not if it already failed: it would again
            await self._outbox.confirmed(timeout_s=5)
        await cancel_and_wait(*self._tasks)
        self._tasks.clear()
        await self.engine.cleanup()
        if self._serving is not None:
            await self._serving.answers.wait(timeout_s=5)
        await self.usage.stop()
        if self._nc is not None:
            if self._nc.is_connected:
                try:
                    await self._heartbeat()  # the last, saying it stops
                except (nats.errors.Error, OSError) as exc:  # closing anyway
                    log.debug("last heartbeat: %s", exc)
            await disconnect(self._nc)
            self._nc = None

    async def __aenter__(self) -> Worker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- pulling --------------------------------------------------------------------------
    def _on_batch(self, dispatches: list[Dispatch]) -> None:
        if self._stopping.is_set():
            # Raced with shutdown: hand them straight back for another worker.
            for d in dispatches:
                self._outbox.after(d.ack_subject, nak_with_delay(0))
            return
        assert self._serving is not None  # the puller starts after it
        for dispatch in dispatches:
            self._serving.start(dispatch)

    # -- cancels, liveness ----------------------------------------------------------------
    async def _on_cancel(self, msg: Msg) -> None:
        try:
            # The subject's (tenant, request_id), never the payload's: the tenant its publisher may use.
            key = RequestKey(*self.s.parse_cancel(msg.subject))
        except BadToken:
            return
        active = self._active.get(key)
        if active is not None:
            await self._abort(key, active)

    async def _on_fence(self, msg: Msg) -> None:
        try:
            fence = codec.decode_fence(msg.data)
        except msgspec.DecodeError as exc:
            log.warning("unreadable fence: %s", exc)
            return
        assert self._serving is not None  # subscribed after it exists
        dropped = [
            f for f in fence.requests if await self._serving.fence(RequestKey(f.tenant, f.request_id), f.attempt)
        ]
        if dropped:
            log.warning(
                "the scheduler judged this worker lost (silent too long): %d request(s) dropped here, "
                "they go on on another worker",
                len(dropped),
            )

    async def _abort(self, key: RequestKey, active: Active) -> None:
        """A client's cancel, or its bridge gone (workers/orphans.py): the engine stops, the slot
        comes back, the usage record says `cancelled`."""
        if not active.cancelled:
            active.cancelled = True
            await self.engine.abort(key)

    async def _on_ping(self, msg: Msg) -> None:
        await self._heartbeat()

    async def _on_new_scheduler(self, msg: Msg) -> None:
        """A pull parked at a scheduler that died would wait out its timeout: a fresh credit now
        goes to the new one (the puller replaces an outstanding pull when room is set)."""
        if msg.data:
            self._room.set()

    async def _in_progress(self) -> None:
        while True:
            await pause(self.config.in_progress_s)
            for active in list(self._active.values()):
                self._outbox.after(active.dispatch.ack_subject, WPI)

    async def _heartbeat(self) -> None:
        assert self._nc is not None
        beat = heartbeat(
            self.id,
            self.config,
            self.engine,
            self.metrics,
            ready=self.ready,
            stopping=self._stopping.is_set(),
            loop_lag_s=self.loop_lag.current(),
        )
        await self._nc.publish(self.s.worker_event(self.id), codec.encode(beat))
