"""What the simulated engine holds for a running request: one output buffer to its `generate()`
stream (a lagging consumer's deltas merged, as vLLM's DELTA output does) and one sequence per
choice, each with the slot, KV tokens and text it has so far."""

from __future__ import annotations

import asyncio
import random
from collections import deque
from dataclasses import dataclass, field

from workers.engine import EngineOutput, EngineRequest
from workers.engines.sim.output import Answer
from workers.engines.sim.request import SimRequest
from workers.engines.sim.scheduler import Sequence


@dataclass(eq=False)
class Req:
    """One request: its choices' outputs go through one buffer to its `generate()` stream."""

    request: EngineRequest
    sim: SimRequest
    order: int
    mean: float  # the SIMULATED mean logprob of this prompt
    top: int | None  # top logprobs asked for per token; None: no logprobs
    choices: list[Seq] = field(default_factory=list)
    open: int = 0  # choices not finished
    reserve: int = 0  # KV tokens held: the prompt, once (choices share its prefix)
    done: bool = False
    buffer: deque[EngineOutput] = field(default_factory=deque)
    waiter: asyncio.Future[None] | None = None
    vectors: list[bytes] | None = None  # an embedding request's SIMULATED answer
    stops: list[str] = field(default_factory=list)  # the body's, read once (not per token)
    replayed: int = 0  # a continuation's: answer tokens prefilled after the prompt

    def push(self, out: EngineOutput) -> None:
        if not (out.finish_reason is None and self._merged(out)):
            self.buffer.append(out)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _merged(self, out: EngineOutput) -> bool:
        """The consumer lags: fold the delta into its choice's pending one, as vLLM DELTA does."""
        last = next((o for o in reversed(self.buffer) if o.index == out.index), None)
        if last is None or last.finish_reason is not None or bool(last.tool_calls) != bool(out.tool_calls):
            return False
        if out.tool_calls:
            call, more = last.tool_calls[-1], out.tool_calls[0]
            if more.index == call.index and not more.id:
                call.arguments += more.arguments
            else:
                last.tool_calls.append(more)
        last.text += out.text
        last.token_ids.extend(out.token_ids)
        last.logprobs.extend(out.logprobs)
        last.confidence.extend(out.confidence)
        return True


@dataclass(eq=False)
class Seq:
    """One choice: a sequence that holds an engine slot and KV tokens while it runs."""

    req: Req
    index: int
    answer: Answer
    reserve: int  # KV tokens for its output: the limit (worst case) or its length
    rng: random.Random  # the logprobs' randomness
    sched: Sequence | None = None  # the scheduler's view: tokens computed, KV blocks
    produced: int = 0
    text: str = ""  # content generated so far
    sent: int = 0  # characters of `text` already streamed
    finish: str | None = None
