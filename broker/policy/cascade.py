"""Cascade policy: serve from the small pool, escalate to the large one when confidence is low.

Pure. The signal is the mean token log-probability of the small pool's first `window` tokens;
every engine Laneway ships returns them, and a pool whose engine cannot is served without a
gate (`workers/escalate.stream_gate`), so it never escalates. For streams the verdict is
taken on those first tokens BEFORE any is released: released tokens cannot be taken back, so
`StreamGate` holds them until the verdict and then either releases them or drops them.

The verdict and the gate live here, apart from the routing package, so that the routing rules
(settings), the eval gate (verdicts) and the workers (the gate) share them without a worker
importing routing; the golden-set report is in `broker/routing/cascade.py`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from enum import Enum
from typing import Annotated, Generic, TypeVar

import msgspec
from msgspec import Meta

T = TypeVar("T")


class CascadeSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    # Mean logprob of the first tokens below this → escalate. -1.0 ≈ the model gave its own
    # tokens ~37% on average: a calibrated small model is rarely that unsure on an easy answer.
    min_mean_logprob: Annotated[float, Meta(le=0.0)] = -1.0
    window: Annotated[int, Meta(ge=1, le=256)] = 8          # tokens the verdict waits for


class Verdict(Enum):
    PENDING = "pending"      # fewer than `window` tokens seen and the stream goes on
    ACCEPT = "accept"        # keep the small pool's answer
    ESCALATE = "escalate"    # discard it; the large pool serves the request


def mean_logprob(logprobs: Sequence[float], window: int) -> float:
    head = logprobs[:window]
    return sum(head) / len(head) if head else -math.inf


def decide(logprobs: Sequence[float], settings: CascadeSettings, finished: bool = False) -> Verdict:
    """The verdict on the small pool's tokens so far; `finished` when its stream has ended."""
    if len(logprobs) < settings.window and not finished:
        return Verdict.PENDING
    # An empty answer carries no confidence at all: -inf escalates.
    if mean_logprob(logprobs, settings.window) >= settings.min_mean_logprob:
        return Verdict.ACCEPT
    return Verdict.ESCALATE


class StreamGate(Generic[T]):
    """Holds a stream's first deltas until the cascade verdict, then releases or drops them.

    The worker calls `push(delta, logprobs)` per engine delta and publishes what it returns;
    on `Verdict.ESCALATE` it aborts the small request and hands the request to the large pool
    (nothing reached the client, so the client sees one uninterrupted answer).
    """

    def __init__(self, settings: CascadeSettings) -> None:
        self.settings = settings
        self.verdict = Verdict.PENDING
        self._held: list[T] = []
        self._logprobs: list[float] = []

    def push(self, delta: T, logprobs: Iterable[float]) -> list[T]:
        """Deltas to release now (empty while pending or after an escalation)."""
        if self.verdict is Verdict.ACCEPT:
            return [delta]
        if self.verdict is Verdict.ESCALATE:
            return []
        self._held.append(delta)
        self._logprobs.extend(logprobs)
        return self._settle(decide(self._logprobs, self.settings))

    def commit(self) -> list[T]:
        """Keep this stream whatever its confidence (it started a tool call: escalating now
        would split the call between two models); releases what was held."""
        if self.verdict is Verdict.PENDING:
            return self._settle(Verdict.ACCEPT)
        return []

    def finish(self) -> list[T]:
        """The small stream ended; decide on what it produced (short answers end early)."""
        if self.verdict is Verdict.PENDING:
            return self._settle(decide(self._logprobs, self.settings, finished=True))
        return []

    @property
    def score(self) -> float:
        return mean_logprob(self._logprobs, self.settings.window)

    def _settle(self, verdict: Verdict) -> list[T]:
        self.verdict = verdict
        if verdict is Verdict.ACCEPT:
            released, self._held = self._held, []
            return released
        if verdict is Verdict.ESCALATE:
            self._held = []
        return []
