"""Small builders for the wire contract's OpenAI bodies, so tests say what they ask for.

chat("hi", max_tokens=3)                        # one user message to laneway-sim
chat(Message("system", "Be brief."), "hi")      # messages given as Message or user text
chat("hi", model="slow", temperature=0.0)       # any ChatBody field by name
"""

from __future__ import annotations

from typing import Any

from schemas.openai import ChatBody, CompletionBody, Message

SIM_MODEL = "laneway-sim"


def user(text: str) -> Message:
    return Message("user", text)


def chat(*messages: str | Message, model: str = SIM_MODEL, **fields: Any) -> ChatBody:
    """A chat body; a str message is the user's."""
    return ChatBody(model=model, messages=[m if isinstance(m, Message) else user(m) for m in messages], **fields)


def completion(prompt: str, model: str = SIM_MODEL, **fields: Any) -> CompletionBody:
    return CompletionBody(model=model, prompt=prompt, **fields)
