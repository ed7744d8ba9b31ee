"""What every process's Prometheus metrics share: latency buckets around the SLOs.

Labels are drawn from configured sets only (class names, pool names, error codes, finish reasons,
tenant names once authenticated or fenced by their NATS user), never tenant-supplied strings,
request ids or prompts. Each component gets its own registry, so
tests (and `laneway up` running several components) never collide.
"""

# Chat TTFT p95 < 0.8 s, end-to-end p95 < 1 s (and long tails).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.5, 2.5, 5, 10, 30, 60, 300)


class LiveSeries:
    """A labelled gauge set whole from each snapshot: a series missing from the new one is
    removed, so a (class, tenant) row lasts while it holds something and no longer."""

    def __init__(self, gauge) -> None:
        self.gauge = gauge
        self._shown: set[tuple[str, ...]] = set()

    def set(self, values: dict[tuple[str, ...], float]) -> None:
        for labels, value in values.items():
            self.gauge.labels(*labels).set(value)
        for labels in self._shown - values.keys():
            self.gauge.remove(*labels)
        self._shown = set(values)
