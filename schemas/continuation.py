"""A stream that outlives its worker: the new worker's question to the edge holding the stream,
on `lw.cont.<tenant>.<edge>`, and the edge's answer.

JetStream redelivers a lost worker's request with a higher delivery attempt. Before generating,
the worker that gets it asks the edge what the client already has: the edge is the one place
that knows (frames in flight when the worker died never arrived). From the answer on, the edge
takes frames of the new attempt only, numbered on from `next_seq`, so the client sees no
duplicate and no gap. Fields are append-only (array_like).
"""

from __future__ import annotations

from enum import IntEnum

import msgspec


class Outcome(IntEnum):
    FRESH = 0  # nothing reached the client: generate from the start (seq 0)
    CONTINUE = 1  # go on after `token_ids` / `text`, numbering entries from `next_seq`
    GONE = 2  # the client's stream is over (answered, or ended here): generate nothing
    EXHAUSTED = 3  # lost too many workers already: the edge ended the stream; dead-letter it


class ContinueAsk(msgspec.Struct, array_like=True, gc=False):
    request_id: str
    attempt: int  # the new delivery's (the frames it will send carry it)
    worker: str  # the worker asking: the stream's source from now on


class Continuation(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    verdict: Outcome
    next_seq: int = 0
    token_ids: list[int] = []  # choice 0's, as streamed (empty when the frames carried none)
    text: str = ""  # choice 0's text as streamed
    migrations: int = 0  # workers this stream has been continued on, this one included
    reason: str = ""  # GONE / EXHAUSTED: why, for the worker's log and dead letter
    delivered: int = 0  # token ids the client got from the lost workers: the new one meters them
