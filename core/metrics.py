"""What every process's Prometheus metrics share: latency buckets around the SLOs.

Labels are drawn from configured sets only (class names, pool names, error codes, finish reasons),
never tenant-supplied strings, request ids or prompts. Each component gets its own registry, so
tests (and `laneway up` running several components) never collide.
"""

# Chat TTFT p95 < 0.8 s, end-to-end p95 < 1 s (and long tails).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.5, 2.5, 5, 10, 30, 60, 300)
