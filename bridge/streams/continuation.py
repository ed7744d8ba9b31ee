"""A stream outlives its worker: the edge's side of a continuation (schemas/continuation.py).

When a worker dies mid-stream, JetStream delivers its request again (at once when the scheduler
saw the worker go, else after `ack_wait`). The worker that gets it asks this edge, on
`lw.cont.<tenant>.<edge>`, what the client already has. Only this edge knows: frames in flight
when the worker died never came. The answer moves the stream to the new attempt in the same
step, so the dead worker's late frames are dropped as stale and the new one's are numbered on
from the last one the client got: no duplicate, no gap, one `Finished`.

A stream goes on only while all it carried was plain text of one choice (tool calls, logprobs,
`n` > 1 are not continued: their worker's loss ends them with `worker_lost`, as before), and at
most `max_migrations` times: a request whose workers keep dying is a poison pill, so the next
loss ends the stream with `worker_lost` saying so, and the worker dead-letters the request.
"""

from __future__ import annotations

import logging

from nats.aio.msg import Msg

from bridge.streams.demux import Demux, ResponseStream
from schemas import codec
from schemas.continuation import Continuation, ContinueAsk, Outcome
from schemas.errors import ErrorCode

log = logging.getLogger("laneway.bridge")

MAX_MIGRATIONS = 2
LOST_MESSAGE = "the worker serving this request was lost after the stream started"


def answer(stream: ResponseStream | None, tenant: str, ask: ContinueAsk, max_migrations: int) -> Continuation:
    """What the worker asking does next; moves the stream to its attempt when it goes on."""
    if stream is None or stream.tenant != tenant or stream.closed or ask.attempt <= stream.attempt:
        return Continuation(Outcome.GONE, reason="no open stream waits for this attempt here")
    if not stream.streamed:
        stream.attempt, stream.next_seq, stream.source = ask.attempt, 0, ask.worker
        return Continuation(Outcome.FRESH)
    if not stream.continuable:
        stream.fail(
            ErrorCode.worker_lost,
            f"{LOST_MESSAGE} (a stream of tool calls, logprobs or several choices is not continued on another worker)",
        )
        return Continuation(Outcome.GONE, reason="the stream cannot be continued", delivered=stream.tokens)
    if stream.migrations >= max_migrations:
        reason = (
            f"the request lost {stream.migrations + 1} workers while streaming (at most "
            f"{max_migrations} continuations); it was dead-lettered"
        )
        stream.fail(ErrorCode.worker_lost, reason)
        return Continuation(Outcome.EXHAUSTED, reason=reason, delivered=stream.tokens)
    stream.migrations += 1
    stream.attempt, stream.source, stream.lost_at = ask.attempt, ask.worker, None
    ids, text = stream.delivered()
    return Continuation(Outcome.CONTINUE, stream.next_seq, ids, text, stream.migrations, delivered=stream.tokens)


class Continuations:
    """Answers the workers' asks for the streams this edge holds."""

    def __init__(self, demux: Demux, max_migrations: int = MAX_MIGRATIONS) -> None:
        self.demux = demux
        self.max_migrations = max_migrations

    async def on_ask(self, msg: Msg) -> None:
        if not msg.reply:
            return
        try:
            ask = codec.decode_continue_ask(msg.data)
        except codec.DecodeError:
            return
        # lw.cont.<tenant>.<edge>: an ask may only touch that tenant's streams.
        tenant = msg.subject.split(".")[-2]
        verdict = answer(self.demux.get(ask.request_id), tenant, ask, self.max_migrations)
        if verdict.verdict is Outcome.CONTINUE:
            log.info(
                "stream %s continues on worker %s (attempt %d, after %d tokens, move %d)",
                ask.request_id,
                ask.worker,
                ask.attempt,
                len(verdict.token_ids),
                verdict.migrations,
            )
        await msg.respond(codec.encode(verdict))
