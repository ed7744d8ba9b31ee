"""The worker's metering: one `Usage` record per request that ends here, on `lw.usage.<tenant>`.

A record meters what was delivered. It is built by the flush that publishes the stream's last
frames (`Outbox.metered`), so it knows whether they went out. When every frame of the stream
was published it carries the engine's own token count. When one could not be (NATS went down
mid-stream), the client never saw the stream's end: the record is marked `interrupted` and
meters only the completion tokens of the frames published before that.

Prices come from `lw_routing/prices`, applied live.
"""

from __future__ import annotations

import time

from nats.js import JetStreamContext

from core.acks import stream_sequence
from core.kvwatch import BucketWatch
from core.metering import PRICES_KEY, Meter, parse_price_book
from schemas import codec
from schemas.subjects import Subjects
from schemas.usage import Usage
from schemas.work import Dispatch
from workers.outbox import Delivery, Outbox


class UsageRecorder:
    def __init__(self, outbox: Outbox, s: Subjects, pool: str, worker_id: str) -> None:
        self._outbox = outbox
        self._s = s
        self._pool = pool
        self._worker_id = worker_id
        self.meter = Meter()
        self._prices: BucketWatch | None = None

    async def start(self, js: JetStreamContext) -> None:
        self._prices = BucketWatch(js, self._s.bucket("routing"), self._put_routing, lambda key: None)
        await self._prices.start()

    async def stop(self) -> None:
        if self._prices is not None:
            await self._prices.stop()

    def _put_routing(self, key: str, value: bytes) -> None:
        if key == PRICES_KEY:
            self.meter = Meter(parse_price_book(value))

    def record(
        self,
        dispatch: Dispatch,
        started: float,
        first_token_at: float | None,
        finish_reason: str,
        prompt_tokens: int,
        completion_tokens: int,
        served_model: str,
        cached_tokens: int = 0,
        continued_tokens: int = 0,
        takes_over: bool = False,
    ) -> None:
        """Call after the stream's last entry: the record goes out with the flush that carries it."""
        r = dispatch.request
        total_s, finished_at = time.monotonic() - started, time.time()
        ttft_s = None if first_token_at is None else first_token_at - started

        def build(delivery: Delivery) -> bytes:
            sent = min(completion_tokens, delivery.tokens) if delivery.lost else completion_tokens
            return codec.encode(
                Usage(
                    request_id=r.request_id,
                    tenant=r.tenant,
                    klass=r.klass,
                    model=r.model,
                    served_model=served_model,
                    pool=self._pool,
                    worker_id=self._worker_id,
                    prompt_tokens=prompt_tokens,
                    completion_tokens=sent,
                    finish_reason=finish_reason,
                    queued_s=dispatch.queued_s,
                    ttft_s=ttft_s,
                    total_s=total_s,
                    finished_at=finished_at,
                    cost_usd=self.meter.cost(
                        self._pool, prompt_tokens, sent, cached_tokens=cached_tokens, klass=r.klass
                    ),
                    interrupted=delivery.lost,
                    undelivered_tokens=completion_tokens - sent,
                    cached_tokens=cached_tokens,
                    prefix_saved_usd=self.meter.prefix_saved(self._pool, cached_tokens, r.klass),
                    continued_tokens=continued_tokens,
                    attempt=dispatch.attempt,
                    message=stream_sequence(dispatch.ack_subject),
                    takes_over=takes_over,
                )
            )

        # Core publish into LW_USAGE: stored by JetStream without a round trip per request.
        self._outbox.metered(self._s.usage(r.tenant), (r.reply_to, r.request_id, dispatch.attempt), build)
