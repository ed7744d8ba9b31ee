"""Cascade policy: serve from the small pool, escalate to the large one when confidence is low.

Pure. The signal is the mean token log-probability of the small pool's first `window` tokens;
every engine Laneway ships returns them, and a pool whose engine cannot is served without a
gate (`stream_gate` in `workers/cascade.py`), so it never escalates. For streams the verdict is
taken on those first tokens BEFORE any is released: released tokens cannot be taken back, so
`StreamGate` holds them until the verdict and then either releases them or drops them.

The verdict, the gate and the verdict's report on a golden set (`laneway eval`: share escalated,
quality and cost vs always-large, the threshold that keeps quality within a bound) live here,
apart from the routing package, so that the routing rules (settings), the eval gate (the report)
and the workers (the gate) share them without a worker importing routing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Annotated, Generic, TypeVar

import msgspec
from msgspec import Meta

T = TypeVar("T")


class CascadeSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    # Mean logprob of the first tokens below this → escalate. -1.0 ≈ the model gave its own
    # tokens ~37% on average: a calibrated small model is rarely that unsure on an easy answer.
    min_mean_logprob: Annotated[float, Meta(le=0.0)] = -1.0
    window: Annotated[int, Meta(ge=1, le=256)] = 8  # tokens the verdict waits for


class Verdict(Enum):
    PENDING = "pending"  # fewer than `window` tokens seen and the stream goes on
    ACCEPT = "accept"  # keep the small pool's answer
    ESCALATE = "escalate"  # discard it; the large pool serves the request


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


# -- the report: share escalated, quality vs always-large ------------------------------------------


@dataclass(frozen=True, slots=True)
class CascadeSample:
    """One golden prompt answered by both pools: scores in [0, 1], costs in dollars."""

    item_id: str
    small_score: float
    large_score: float
    small_logprobs: tuple[float, ...]
    small_cost: float = 0.0
    large_cost: float = 0.0


@dataclass(frozen=True, slots=True)
class CascadeReport:
    n: int
    threshold: float
    escalated_share: float  # of requests, sent on to the large pool
    quality_cascade: float  # points (0-100) on the golden set
    quality_small: float  # always-small
    quality_large: float  # always-large
    cost_cascade: float  # dollars for the whole set; an escalation pays both pools
    cost_large: float

    @property
    def kept_off_large(self) -> float:
        return 1.0 - self.escalated_share

    @property
    def quality_delta(self) -> float:
        return self.quality_cascade - self.quality_large


def cascade_report(samples: Sequence[CascadeSample], settings: CascadeSettings) -> CascadeReport:
    if not samples:
        raise ValueError("cascade_report needs at least one sample")
    escalated = 0
    quality = cost = 0.0
    for s in samples:
        if decide(s.small_logprobs, settings, finished=True) is Verdict.ESCALATE:
            escalated += 1
            quality += s.large_score
            cost += s.small_cost + s.large_cost  # conservative: the whole small answer is paid
        else:
            quality += s.small_score
            cost += s.small_cost
    n = len(samples)
    return CascadeReport(
        n=n,
        threshold=settings.min_mean_logprob,
        escalated_share=escalated / n,
        quality_cascade=100.0 * quality / n,
        quality_small=100.0 * sum(s.small_score for s in samples) / n,
        quality_large=100.0 * sum(s.large_score for s in samples) / n,
        cost_cascade=cost,
        cost_large=sum(s.large_cost for s in samples),
    )


def pick_threshold(
    samples: Sequence[CascadeSample], base: CascadeSettings, thresholds: Iterable[float], max_drop: float = 1.0
) -> CascadeReport | None:
    """The threshold that keeps the most traffic off the large pool while quality stays within
    `max_drop` points of always-large (the eval gate's rule); None if none qualifies."""
    best: CascadeReport | None = None
    for t in sorted(thresholds):
        report = cascade_report(samples, msgspec.structs.replace(base, min_mean_logprob=t))
        if report.quality_cascade >= report.quality_large - max_drop:
            if best is None or report.escalated_share < best.escalated_share:
                best = report
    return best


def format_report(r: CascadeReport) -> str:
    return (
        f"cascade on {r.n} golden prompts (mean logprob of first tokens >= {r.threshold:.2f} keeps "
        f"the small answer)\n"
        f"  escalated to large: {100 * r.escalated_share:5.1f}%   kept off large: {100 * r.kept_off_large:5.1f}%\n"
        f"  quality  cascade {r.quality_cascade:6.2f}   always-large {r.quality_large:6.2f}   "
        f"always-small {r.quality_small:6.2f}   (delta vs large {r.quality_delta:+.2f} pt)\n"
        f"  cost     cascade ${r.cost_cascade:.6f}   always-large ${r.cost_large:.6f}"
    )
