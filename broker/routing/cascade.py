"""The cascade's report on a golden set: share escalated, quality and cost vs always-large, and
the threshold that keeps quality within a bound (`laneway eval`). The verdict it replays is the
pure one in `broker/policy/cascade.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import msgspec

from broker.policy.cascade import CascadeSettings, Verdict, decide


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
    escalated_share: float          # of requests, sent on to the large pool
    quality_cascade: float          # points (0-100) on the golden set
    quality_small: float            # always-small
    quality_large: float            # always-large
    cost_cascade: float             # dollars for the whole set; an escalation pays both pools
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
            cost += s.small_cost + s.large_cost     # conservative: the whole small answer is paid
        else:
            quality += s.small_score
            cost += s.small_cost
    n = len(samples)
    return CascadeReport(
        n=n, threshold=settings.min_mean_logprob, escalated_share=escalated / n,
        quality_cascade=100.0 * quality / n,
        quality_small=100.0 * sum(s.small_score for s in samples) / n,
        quality_large=100.0 * sum(s.large_score for s in samples) / n,
        cost_cascade=cost, cost_large=sum(s.large_cost for s in samples))


def pick_threshold(samples: Sequence[CascadeSample], base: CascadeSettings,
                   thresholds: Iterable[float], max_drop: float = 1.0) -> CascadeReport | None:
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
    return (f"cascade on {r.n} golden prompts (mean logprob of first tokens >= {r.threshold:.2f} keeps "
            f"the small answer)\n"
            f"  escalated to large: {100 * r.escalated_share:5.1f}%   kept off large: {100 * r.kept_off_large:5.1f}%\n"
            f"  quality  cascade {r.quality_cascade:6.2f}   always-large {r.quality_large:6.2f}   "
            f"always-small {r.quality_small:6.2f}   (delta vs large {r.quality_delta:+.2f} pt)\n"
            f"  cost     cascade ${r.cost_cascade:.6f}   always-large ${r.cost_large:.6f}")
