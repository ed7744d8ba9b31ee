"""Which pools have a ready worker, from heartbeats on `lw.evt.worker.*` (judged by the same
rules as the broker's `HealthBoard`), and which brokers are consuming requests."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

from nats.aio.msg import Msg

from core.routing.health import serving, stale_after
from core.topology import StreamLimits
from schemas import codec
from schemas.work import Heartbeat

DEFAULT_ACK_WAIT_S = StreamLimits().ack_wait_s


@dataclass(slots=True)
class _Seen:
    beat: Heartbeat
    at: float


class Readiness:
    def __init__(self, stale_after_s: float = 15.0) -> None:
        self._workers: dict[str, _Seen] = {}
        self._brokers: dict[str, tuple[float, str]] = {}  # id → (heard at, its PII stage)
        self._ack_waits: dict[str, float] = {}  # id → the ack_wait it says requests are under
        self._stale_after_s = stale_after_s

    async def on_broker(self, msg: Msg) -> None:
        broker = msg.subject.rsplit(".", 1)[-1]
        beat = codec.broker_beat(msg.data)
        if beat.leaving:
            self._brokers.pop(broker, None)
            self._ack_waits.pop(broker, None)
        else:
            self._brokers[broker] = (time.monotonic(), beat.pii)
            if beat.ack_wait_s > 0:
                self._ack_waits[broker] = beat.ack_wait_s

    def redelivery_within(self) -> float:
        """How long a request held by a worker that died may wait to be delivered again, when no
        scheduler saw the death: the consumer's ack_wait, as the brokers say it (the default
        until one has)."""
        return max(self._ack_waits.values(), default=DEFAULT_ACK_WAIT_S)

    def _live_brokers(self) -> list[str]:
        """The PII stage of each broker heard from in the last few heartbeats (they beat every second)."""
        now = time.monotonic()
        return [pii for seen, pii in self._brokers.values() if now - seen <= 5.0]

    def brokers(self) -> int:
        return len(self._live_brokers())

    def pii_stages(self) -> dict[str, int]:
        """Live brokers per PII stage: `missing` means tenants whose policy asks for PII get 503."""
        return dict(Counter(pii or "unknown" for pii in self._live_brokers()))

    async def on_heartbeat(self, msg: Msg) -> None:
        try:
            beat = codec.decode_heartbeat(msg.data)
        except codec.DecodeError:
            return
        self._workers[beat.worker_id] = _Seen(beat, time.monotonic())

    def alive(
        self, worker_id: str, now: float | None = None, *, heard_at: float | None = None, slack_s: float = 0.0
    ) -> bool:
        """Heard from recently (a beat, or at `heard_at` by other means: its frames); a draining
        worker is still alive (it finishes its streams). `slack_s`: how late this process reads
        what arrives, so silence that is only its own backlog is not read as a death."""
        seen = self._workers.get(worker_id)
        if seen is None:
            return False
        now = time.monotonic() if now is None else now
        last = seen.at if heard_at is None else max(seen.at, heard_at)
        return now - last <= stale_after(seen.beat, self._stale_after_s) + slack_s

    def known(self, worker_id: str) -> bool:
        return worker_id in self._workers

    def continues(self, worker_id: str) -> bool:
        """Whether its pool's engine goes on with a lost worker's streams (its last beat says)."""
        seen = self._workers.get(worker_id)
        return seen is not None and seen.beat.continues

    def ready_pools(self) -> dict[str, int]:
        now = time.monotonic()
        pools: dict[str, int] = {}
        for wid, seen in self._workers.items():
            if serving(seen.beat) and self.alive(wid, now):
                pools[seen.beat.pool] = pools.get(seen.beat.pool, 0) + 1
        return pools

    def workers(self) -> list[Heartbeat]:
        return [seen.beat for seen in self._workers.values()]
