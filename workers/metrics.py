"""The worker's Prometheus metrics, bounded labels (pool, class, finish reason, publish kind, and the
tenant, which its request's subject names: only a configured tenant's NATS user may publish there)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from core.metrics import LiveSeries

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.slots_in_use = Gauge(
            "laneway_worker_slots_in_use", "Sequences running in the engine", ["pool"], registry=r
        )
        self.slots_total = Gauge("laneway_worker_slots_total", "Engine sequence slots", ["pool"], registry=r)
        self.running = LiveSeries(
            Gauge(
                "laneway_worker_running",
                "Sequence slots held, by class and tenant",
                ["pool", "class", "tenant"],
                registry=r,
            )
        )
        self.kv_tokens = Gauge(
            "laneway_worker_kv_tokens", "The engine's KV cache in tokens (0: not reported)", ["pool"], registry=r
        )
        self.kv_free_tokens = Gauge(
            "laneway_worker_kv_free_tokens", "KV-cache tokens free for new sequences", ["pool"], registry=r
        )
        self.tokens = Counter("laneway_worker_tokens_total", "Tokens generated", ["pool", "class"], registry=r)
        self.prompt_tokens = Counter(
            "laneway_worker_prompt_tokens_total", "Prompt tokens of metered requests", ["pool", "class"], registry=r
        )
        # Their prefix-cache hits: ÷ prompt tokens is the hit rate (prefill the engine skipped).
        self.cached_prompt_tokens = Counter(
            "laneway_worker_cached_prompt_tokens_total",
            "Prompt tokens read from the engine's prefix cache",
            ["pool", "class"],
            registry=r,
        )
        self.finished = Counter("laneway_worker_finished_total", "Requests finished", ["pool", "reason"], registry=r)
        self.frames = Counter("laneway_worker_frames_total", "Token frames published", ["pool"], registry=r)
        self.entries_per_frame = Histogram(
            "laneway_worker_entries_per_frame",
            "Stream entries carried per frame",
            ["pool"],
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.breaker_state = Gauge(
            "laneway_worker_upstream_breaker_state",
            "Hosted-upstream circuit breaker: 0 closed, 1 open, 2 half-open",
            ["pool"],
            registry=r,
        )
        self.escalations = Counter(
            "laneway_worker_escalations_total",
            "Requests handed to a larger pool on low first-token confidence",
            ["pool"],
            registry=r,
        )
        self.pulls = Counter("laneway_worker_pulls_total", "Pulls sent to the broker", ["pool"], registry=r)
        self.malformed_batches = Counter(
            "laneway_worker_malformed_batches_total",
            "Pull replies that could not be decoded (JetStream redelivers their requests after ack_wait)",
            ["pool"],
            registry=r,
        )
        self.publish_failures = Counter(
            "laneway_worker_publish_failures_total",
            "Publishes that failed; what they carried was dropped",
            ["pool", "kind"],
            registry=r,
        )
        self.edge_probes = Counter(
            "laneway_worker_edge_probes_total",
            "Probes of the bridges awaiting running requests, by whether NATS "
            "had interest (none: that bridge's connection is gone)",
            ["pool", "answer"],
            registry=r,
        )
        self.orphans = Counter(
            "laneway_worker_orphans_cancelled_total",
            "Requests cancelled because the bridge awaiting their frames is gone",
            ["pool"],
            registry=r,
        )
        self.fenced = Counter(
            "laneway_worker_fenced_total",
            "Requests dropped because the scheduler judged this worker lost and handed them to another",
            ["pool"],
            registry=r,
        )
        self.ttft = Histogram(
            "laneway_worker_ttft_seconds",
            "Dispatch to first token in the engine",
            ["pool", "class"],
            registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 5, 10, 30),
        )
