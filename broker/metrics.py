"""The broker's Prometheus metrics (labels bounded: see `core/metrics.py`), and the usage
counters it feeds from the metering records.

Usage labels stay bounded too: `tenant` takes only names of configured tenants and `model` only
names of configured logical models (both fed from the live `lw_tenants` / `lw_routing` config
through `set_known`); any other value is counted under `other`. So the series count is at most
(tenants + 1) x (models + 1) x a few, whatever a publisher puts in a record. Served model
versions, pools and request ids are never labels here: `laneway usage` has those details.

Feed `UsageMetrics` from ONE consumer of `lw.usage.*` per deployment (a queue-group subscription
shared by the broker replicas), or sums across replicas count each request more than once.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from core.metrics import LATENCY_BUCKETS, LiveSeries
from schemas.usage import Usage

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class BrokerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.queue_depth = Gauge("laneway_queue_depth", "Requests waiting in the lanes", ["pool", "class"], registry=r)
        self.tenant_queue_depth = LiveSeries(
            Gauge(
                "laneway_tenant_queue_depth",
                "Requests waiting in the lanes, by tenant (those with any)",
                ["pool", "class", "tenant"],
                registry=r,
            )
        )
        self.queue_wait = Histogram(
            "laneway_queue_wait_seconds", "Time from accept to dispatch", ["class"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.dispatched = Counter(
            "laneway_dispatched_total", "Requests handed to workers", ["pool", "class"], registry=r
        )
        self.batch_size = Histogram(
            "laneway_dispatch_batch_size", "Requests per answered pull", ["pool"], buckets=BATCH_BUCKETS, registry=r
        )
        self.affinity = Counter(
            "laneway_prefix_affinity_total",
            "Requests dispatched with a prompt prefix, by where the index said it was cached: "
            "hit (on the worker it went to), miss (more on another worker), cold (nowhere)",
            ["pool", "outcome"],
            registry=r,
        )
        self.affinity_tokens = Counter(
            "laneway_prefix_affinity_tokens_total",
            "Prompt tokens the index expected cached on the worker a request went to",
            ["pool"],
            registry=r,
        )
        self.lost_handed_back = Counter(
            "laneway_lost_worker_requests_total",
            "Requests running on a lost worker, handed back to JetStream (-NAK) to go on elsewhere",
            registry=r,
        )
        self.worker_probes = Counter(
            "laneway_worker_probes_total",
            "The scheduler's probes of its workers' NATS connections, by answer (none: gone)",
            ["answer"],
            registry=r,
        )
        self.workers_lost = Counter(
            "laneway_workers_lost_total",
            "Workers the scheduler found gone with requests running, by signal: interest (its NATS "
            "connection closed) or silence (no heartbeat past its bound)",
            ["signal"],
            registry=r,
        )
        self.expired = Counter("laneway_expired_total", "Requests that expired before starting", ["class"], registry=r)
        self.rejected = Counter("laneway_rejected_total", "Requests refused by the broker", ["reason"], registry=r)
        self.cancelled = Counter("laneway_cancelled_total", "Requests cancelled before they ran", ["class"], registry=r)
        self.dead_lettered = Counter("laneway_dead_lettered_total", "Messages moved to the DLQ", ["reason"], registry=r)
        self.dead_letters_dropped = Counter(
            "laneway_dead_letters_dropped_total",
            "Dead letters counted and terminated but never written to the DLQ (its queue full, or the publish failed)",
            ["reason"],
            registry=r,
        )
        self.parked_pulls = Gauge("laneway_parked_pulls", "Worker pulls held open", ["pool"], registry=r)
        self.ready_workers = Gauge(
            "laneway_ready_workers", "Workers with a fresh ready heartbeat", ["pool"], registry=r
        )
        self.routing_decisions = Counter(
            "laneway_routing_decisions_total", "Requests routed, by pool and why", ["pool", "reason"], registry=r
        )
        self.routing_fallback = Counter(
            "laneway_routing_fallback_total", "Requests spilled to the hosted-API pool", ["pool", "reason"], registry=r
        )
        # Several brokers, one schedule (broker/scheduler/): benchmarks find the leader by this gauge.
        self.scheduler = Gauge("laneway_broker_scheduler", "1 while this broker holds the scheduler lease", registry=r)
        self.takeovers = Counter(
            "laneway_scheduler_takeovers_total", "Times this broker took the scheduler lease", registry=r
        )
        self.forwarded = Counter("laneway_forwarded_total", "Admitted requests sent to the scheduler", registry=r)
        self.reforwarded = Counter(
            "laneway_reforwarded_total", "Admitted requests sent again (a new scheduler, or no answer)", registry=r
        )
        self.forwarded_waiting = Gauge(
            "laneway_forwarded_waiting", "Admitted requests here whose scheduler has not settled them", registry=r
        )


OTHER = "other"


class UsageMetrics:
    def __init__(
        self, registry: CollectorRegistry | None = None, tenants: Iterable[str] = (), models: Iterable[str] = ()
    ) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.tokens = Counter(
            "laneway_usage_tokens_total",
            "Tokens metered, by tenant, model and kind",
            ["tenant", "model", "kind"],
            registry=r,
        )
        self.cost = Counter(
            "laneway_usage_cost_usd_total", "Cost metered in US dollars", ["tenant", "model"], registry=r
        )
        # Apart from `tokens` (they are part of its prompt tokens): hit rate = these ÷ kind="prompt".
        self.cached_tokens = Counter(
            "laneway_usage_cached_prompt_tokens_total",
            "Prompt tokens served from the engines' prefix cache",
            ["tenant", "model"],
            registry=r,
        )
        self.prefix_saved = Counter(
            "laneway_usage_prefix_saved_usd_total",
            "US dollars the prefix-cache hits saved against the full prompt price",
            ["tenant", "model"],
            registry=r,
        )
        self.requests = Counter(
            "laneway_usage_requests_total", "Finished requests metered", ["tenant", "model", "cached"], registry=r
        )
        self._tenants: frozenset[str] = frozenset()
        self._models: frozenset[str] = frozenset()
        self.set_known(tenants, models)

    def set_known(self, tenants: Iterable[str] | None = None, models: Iterable[str] | None = None) -> None:
        """Which label values are allowed; call on every tenant or routing change."""
        if tenants is not None:
            self._tenants = frozenset(tenants)
        if models is not None:
            self._models = frozenset(models)

    def observe(self, usage: Usage) -> None:
        tenant = usage.tenant if usage.tenant in self._tenants else OTHER
        model = usage.model if usage.model in self._models else OTHER
        self.tokens.labels(tenant, model, "prompt").inc(max(0, usage.prompt_tokens))
        self.tokens.labels(tenant, model, "completion").inc(max(0, usage.completion_tokens))
        self.cost.labels(tenant, model).inc(max(0.0, usage.cost_usd))
        if usage.cached_tokens > 0:
            self.cached_tokens.labels(tenant, model).inc(usage.cached_tokens)
            self.prefix_saved.labels(tenant, model).inc(max(0.0, usage.prefix_saved_usd))
        self.requests.labels(tenant, model, "true" if usage.cached else "false").inc()
