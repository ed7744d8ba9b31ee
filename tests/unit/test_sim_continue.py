"""A continued sim stream equals an unbroken one: given the tokens a lost worker streamed, the
SIMULATED engine prefills them and goes on with the next token, and its usage counts them as
prefill, not as its own output. The zero profile: nothing here waits for time to pass."""

from __future__ import annotations

import asyncio

import pytest

from schemas.openai import ChatBody, Message
from workers.engine import Continued, EngineOutput, EngineRequest
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.roofline import PROFILES


def chat(**fields) -> ChatBody:
    return ChatBody(model="m", messages=[Message(role="user", content="Tell me about lanes")], **fields)


async def run(
    engine: SimEngine, body: ChatBody, continued: Continued | None = None, rid: str = "r"
) -> list[EngineOutput]:
    return [out async for out in engine.generate(EngineRequest(rid, body, continued=continued))]


def tokens(outs: list[EngineOutput]) -> list[int]:
    return [t for out in outs for t in out.token_ids]


def text(outs: list[EngineOutput]) -> str:
    return "".join(out.text for out in outs)


@pytest.mark.parametrize(
    "fields", [{"temperature": 0.0}, {"seed": 7, "max_tokens": 40}, {"temperature": 0.0, "stop": ["GPU engine"]}]
)
@pytest.mark.parametrize("cut", [1, 4, 9])
def test_a_continuation_goes_on_from_the_next_token(fields: dict, cut: int) -> None:
    async def main() -> None:
        engine = SimEngine(PROFILES["zero"])
        await engine.start()
        try:
            whole = await run(engine, chat(**fields))
            ids = tokens(whole)
            assert len(ids) > cut
            # What the client had: the first `cut` tokens' outputs, as they were streamed.
            head = [out for out in whole if out.token_ids][:cut]
            rest = await run(engine, chat(**fields), Continued(tokens(head), text(head)), rid="r2")
            assert tokens(head) + tokens(rest) == ids
            assert text(head) + text(rest) == text(whole)
            assert rest[-1].finish_reason == whole[-1].finish_reason
            # The delivered tokens were prefilled here, not generated.
            assert rest[-1].prompt_tokens == whole[-1].prompt_tokens + cut
            assert rest[-1].completion_tokens == whole[-1].completion_tokens - cut
        finally:
            await engine.cleanup()

    asyncio.run(main())


def test_a_continuation_of_a_whole_answer_only_ends_it() -> None:
    async def main() -> None:
        engine = SimEngine(PROFILES["zero"])
        await engine.start()
        try:
            whole = await run(engine, chat(temperature=0.0, max_tokens=6))
            rest = await run(engine, chat(temperature=0.0, max_tokens=6), Continued(tokens(whole), text(whole)), "r2")
            assert tokens(rest) == [] and text(rest) == ""
            assert rest[-1].finish_reason == whole[-1].finish_reason == "length"
        finally:
            await engine.cleanup()

    asyncio.run(main())
