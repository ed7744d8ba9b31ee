"""Multi-turn chat sessions, as a customer-service assistant sends them: one long system prompt
shared by all of a tenant's sessions (its policies, its tools), then turns that each send the
whole conversation again. Closed loop: a session sends a turn, reads the answer to its end,
thinks (exponential, mean `think_s`) and sends the next; after `turns` turns it starts over as a
new conversation. What a prefix cache can reuse is real: each turn's prompt begins with the
previous turn's prompt, answer included (the answer in the history is a stand-in of the same
length: the cache keys on what is sent, and the stand-in keeps runs comparable).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp

from loadtest.http_client import Result, stream_chat

WORDS = (
    "account",
    "refund",
    "order",
    "delivery",
    "invoice",
    "warranty",
    "policy",
    "ticket",
    "billing",
    "address",
    "payment",
    "return",
    "exchange",
    "status",
    "support",
    "customer",
    "product",
    "update",
)


@dataclass(frozen=True)
class SessionShape:
    system_tokens: int = 1500  # the tenant's shared system prompt
    turn_tokens: int = 120  # each user message
    answer_tokens: int = 80  # each answer (max_tokens)
    turns: int = 12  # per conversation
    think_s: float = 4.0  # mean pause between an answer and the next turn


@dataclass(slots=True)
class Turn:
    session: int
    conversation: int
    turn: int  # 1 = the conversation's first
    result: Result = field(default_factory=Result)


def prose(rng: random.Random, tokens: int, tag: str = "") -> str:
    """~`tokens` tokens of text (~4 characters a token, as Laneway and the sim estimate)."""
    words, size = [tag] if tag else [], len(tag)
    while size < tokens * 4:
        word = rng.choice(WORDS)
        words.append(word)
        size += len(word) + 1
    return " ".join(words)[: tokens * 4]


def system_prompt(tenant: str, tokens: int) -> str:
    return prose(random.Random(f"system:{tenant}"), tokens, f"You are {tenant}'s support assistant.")


async def run_sessions(
    http: aiohttp.ClientSession,
    url: str,
    api_key: str,
    models: Sequence[str],
    tenant: str,
    shape: SessionShape,
    sessions: int,
    until: float,
    seed: int,
    out: list[Turn],
    klass: str = "interactive",
) -> None:
    """`sessions` concurrent sessions until `until` (time.time()), session n on `models[n % len]`
    (several: an assistant per product, each a LoRA adapter); each turn lands in `out` as sent."""
    system = system_prompt(tenant, shape.system_tokens)

    async def session(n: int) -> None:
        model = models[n % len(models)]
        rng = random.Random(f"{seed}:{n}")
        await asyncio.sleep(rng.uniform(0, shape.think_s))  # sessions start spread out
        conversation = 0
        while time.time() < until:
            conversation += 1
            messages = [{"role": "system", "content": system}]
            for k in range(1, shape.turns + 1):
                if time.time() >= until:
                    return
                tag = f"[session {n} conversation {conversation} turn {k}]"
                messages.append({"role": "user", "content": prose(rng, shape.turn_tokens, tag)})
                turn = Turn(n, conversation, k)
                out.append(turn)
                body = {
                    "model": model,
                    "messages": messages,
                    "max_tokens": shape.answer_tokens,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                await stream_chat(http, url, api_key, body, {"x-laneway-class": klass}, turn.result)
                messages.append({"role": "assistant", "content": prose(rng, shape.answer_tokens)})
                await asyncio.sleep(rng.expovariate(1 / shape.think_s) if shape.think_s else 0)

    await asyncio.gather(*(session(n) for n in range(sessions)))
