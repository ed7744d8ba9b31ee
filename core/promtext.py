"""Prometheus text exposition → plain values, and quantiles from histogram buckets (the load
tests' figures and `laneway top`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families


@dataclass
class Scrape:
    """samples[(name, sorted label items)] = value"""

    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)

    def value(self, name: str, **labels: str) -> float:
        return self.samples.get((name, tuple(sorted(labels.items()))), math.nan)

    def total(self, name: str) -> float:
        return sum(v for (n, _), v in self.samples.items() if n == name)

    def buckets(self, name: str) -> list[tuple[float, float]]:
        """Cumulative (le, count) of an unlabelled histogram, summed over label sets."""
        return self.buckets_by(name).get((), [])

    def by(self, name: str, *keys: str) -> dict[tuple[str, ...], float]:
        """`name`'s samples summed by the values of the labels `keys` (a missing label reads "")."""
        out: dict[tuple[str, ...], float] = {}
        for (n, labels), v in self.samples.items():
            if n == name:
                at = dict(labels)
                key = tuple(at.get(k, "") for k in keys)
                out[key] = out.get(key, 0.0) + v
        return out

    def buckets_by(self, name: str, *keys: str) -> dict[tuple[str, ...], list[tuple[float, float]]]:
        """Cumulative (le, count) of a histogram, summed by the values of the labels `keys`."""
        acc: dict[tuple[str, ...], dict[float, float]] = {}
        for key, v in self.by(f"{name}_bucket", *keys, "le").items():
            acc.setdefault(key[:-1], {})[float(key[-1])] = v  # `by` summed each (key, le) already
        return {key: sorted(per.items()) for key, per in acc.items()}


def parse(text: str) -> Scrape:
    out = Scrape()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def bucket_delta(after: list[tuple[float, float]], before: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Observations between two scrapes of the same histogram."""
    prior = dict(before)
    return [(le, count - prior.get(le, 0.0)) for le, count in after]


def histogram_quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation inside the bucket, as PromQL does; the
    upper bound of the last finite bucket when the quantile lies in +Inf."""
    if not buckets or buckets[-1][1] <= 0:
        return math.nan
    total = buckets[-1][1]
    rank = q * total
    lower_le, lower_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return lower_le
            if count == lower_count:
                return le
            return lower_le + (le - lower_le) * (rank - lower_count) / (count - lower_count)
        lower_le, lower_count = le, count
    return lower_le


def fraction_at_most(buckets: list[tuple[float, float]], bound: float) -> float:
    """Share of observations ≤ `bound` (exact when `bound` is a bucket edge)."""
    if not buckets or buckets[-1][1] <= 0:
        return math.nan
    below = max((c for le, c in buckets if le <= bound), default=0.0)
    return below / buckets[-1][1]
