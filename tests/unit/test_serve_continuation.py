"""A redelivered request's worker asks the edge how it goes on (workers/serve.py, up to 2 s):
what happens to the request meanwhile. Serving with a real sim engine, the outbox and the meter
replaced by recorders."""

from __future__ import annotations

import asyncio
import time

from schemas.continuation import Continuation, Outcome
from schemas.errors import ErrorCode
from schemas.frames import Delta, StreamError
from schemas.requests import GenerateRequest
from schemas.subjects import Subjects
from schemas.work import Dispatch
from tests.requests import chat
from workers.engine import CannotContinue, RequestKey
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.roofline import PROFILES
from workers.metrics import WorkerMetrics
from workers.serve import ACK, Serving

S = Subjects("lw")


class Outbox:
    def __init__(self) -> None:
        self.entries: list = []
        self.acks: list[bytes] = []

    def emit(self, reply_to: str, entry) -> None:
        self.entries.append(entry)

    def extend(self, key, text: str, token_ids: list[int]) -> bool:
        return False

    def after(self, subject: str, payload: bytes) -> None:
        self.acks.append(payload)


class Usage:
    def __init__(self) -> None:
        self.records: list[tuple[str, int, int, bool]] = []

    def record(
        self,
        dispatch,
        started,
        first_token_at,
        reason,
        prompt,
        completion,
        model,
        cached=0,
        continued=0,
        takes_over=False,
    ):
        self.records.append((reason, prompt, completion, takes_over))


class Answers:
    def keep(self, dispatch, parts, cancelled, finished) -> None:
        pass


def dispatch() -> Dispatch:
    request = GenerateRequest(
        request_id="r1",
        tenant="acme",
        klass="interactive",
        model="laneway-sim",
        reply_to=f"{S.tok_tenant_prefix('acme')}e1",
        created_at=time.time(),
        deadline=time.time() + 60,
        chat=chat("a long answer, please", max_tokens=50),
    )
    return Dispatch(request, "ack.r1", attempt=2)


CONTINUE = Continuation(Outcome.CONTINUE, 2, [1, 2], "Hello there ", 1, delivered=2)


async def redelivered(engine: SimEngine, ask, active: dict) -> tuple[Outbox, Usage]:
    """Serves `dispatch()` (a redelivery) on `engine` until its task ends; `ask` answers for the edge."""
    await engine.start()
    outbox, usage = Outbox(), Usage()
    serving = Serving(
        "w2", "sim", S, engine, WorkerMetrics(), outbox, usage, None, Answers(), active, asyncio.Event(),
        lambda exc: None, ask_edge=ask,
    )  # fmt: skip
    serving.start(dispatch())
    task = active[RequestKey("acme", "r1")].task
    assert task is not None
    await asyncio.wait_for(task, 10)
    return outbox, usage


def test_a_cancel_while_the_worker_asks_the_edge_is_not_lost() -> None:
    async def main() -> None:
        active: dict = {}

        async def ask(d: Dispatch) -> Continuation:
            active[RequestKey("acme", "r1")].cancelled = True  # the client's cancel, as the runner marks it
            return CONTINUE

        outbox, usage = await redelivered(SimEngine(PROFILES["zero"]), ask, active)
        assert not active
        assert not [e for e in outbox.entries if isinstance(e, Delta)], "it generated for a cancelled client"
        assert outbox.acks == [ACK] and usage.records == [
            ("cancelled", 0, 2, True)
        ]  # it counts what the lost worker streamed

    asyncio.run(main())


class HalfCharacters(SimEngine):
    """Judges every continued answer broken inside a character, as vLLM does one that is."""

    async def generate(self, request):
        if request.continued is not None:
            raise CannotContinue(request.request_id, "the answer broke inside a character")
        async for out in super().generate(request):
            yield out


def test_an_answer_the_engine_cannot_continue_ends_with_worker_lost_saying_why() -> None:
    async def main() -> None:
        async def ask(d: Dispatch) -> Continuation:
            return CONTINUE

        outbox, usage = await redelivered(HalfCharacters(PROFILES["zero"]), ask, {})
        [error] = [e for e in outbox.entries if isinstance(e, StreamError)]
        assert error.code == ErrorCode.worker_lost.value, error  # not the engine's fault: engine_error
        assert "could not be continued" in error.message and "inside a character" in error.message
        assert (error.seq, usage.records[0][0]) == (2, ErrorCode.worker_lost.value)

    asyncio.run(main())
