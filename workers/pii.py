"""The tenant's PII policy on model output, applied where the output is made: every reader of the
stream (the bridge, a tenant's own NATS client, the response cache) gets the redacted text.

The gate sends the policy with the dispatch (`Dispatch.output_pii`) when the tenant's policy asks
for it. Each text a choice streams (its content, refusal, reasoning, each tool call's arguments)
goes through a `StreamRedactor` of its own: a value split across engine outputs is still caught,
and text that may still be part of one is held until it can be judged (a word, a number in
progress). At the end `flush()` releases what is held. Token ids are not passed on: they spell
the unredacted text. Output cannot be refused mid-stream, so `block` redacts here, and `hash`
(keyed by the brokers' secret, which workers do not hold) redacts too.
"""

from __future__ import annotations

from functools import lru_cache

import msgspec

from core.policy.pii import decode as decode_policy
from core.policy.pii.stream import StreamRedactor, redacts_output
from schemas.frames import ToolCallDelta
from workers.engine import EngineOutput

_Field = tuple[int, str, int]  # (choice, "content" | "refusal" | "reasoning" | "tool", call index)
_ATTRIBUTE = {"content": "text", "refusal": "refusal", "reasoning": "reasoning"}  # of EngineOutput


@lru_cache(maxsize=256)
def _prototype(document: str) -> StreamRedactor | None:
    """The policy's detectors and replacements, built once per distinct policy (every request of
    a tenant carries the same one); None when it redacts nothing in output."""
    policy = decode_policy(document)
    return StreamRedactor.for_policy(policy) if redacts_output(policy) else None


class OutputRedaction:
    def __init__(self, prototype: StreamRedactor) -> None:
        self._prototype = prototype
        self._streams: dict[_Field, StreamRedactor] = {}

    @classmethod
    def for_dispatch(cls, document: str) -> OutputRedaction | None:
        """None when the dispatch carries no policy (nothing to redact)."""
        prototype = _prototype(document) if document else None
        return cls(prototype) if prototype is not None else None

    def apply(self, out: EngineOutput) -> EngineOutput:
        """`out`, changed in place (it is the caller's from here on): what can be released of each
        text redacted, the rest held; no token ids."""
        i = out.index
        out.token_ids = []
        out.text = self._feed((i, "content", 0), out.text)
        if out.refusal:
            out.refusal = self._feed((i, "refusal", 0), out.refusal)
        if out.reasoning:
            out.reasoning = self._feed((i, "reasoning", 0), out.reasoning)
        if out.tool_calls:
            out.tool_calls = [
                msgspec.structs.replace(c, arguments=self._feed((i, "tool", c.index), c.arguments))
                for c in out.tool_calls
            ]
        return out

    def flush(self) -> list[EngineOutput]:
        """What is still held, one output per choice, released redacted."""
        outs: dict[int, EngineOutput] = {}
        for (choice, kind, call), stream in self._streams.items():
            rest = stream.flush()
            if not rest:
                continue
            out = outs.setdefault(choice, EngineOutput("", index=choice))
            if kind == "tool":
                out.tool_calls.append(ToolCallDelta(call, arguments=rest))
            else:
                attr = _ATTRIBUTE[kind]
                setattr(out, attr, getattr(out, attr) + rest)
        return [outs[c] for c in sorted(outs)]

    def _feed(self, key: _Field, text: str) -> str:
        if not text:
            return ""
        stream = self._streams.get(key)
        if stream is None:
            stream = self._streams[key] = self._prototype.fresh()
        return stream.feed(text)
