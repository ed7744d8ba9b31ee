"""Every Prometheus metric of the broker and the bridge, in one place, with bounded labels.

Labels are drawn from configured sets only: class names, pool names, error codes, finish
reasons. Never tenant-supplied strings, request ids or prompts. Each component gets its own
registry, so tests (and `laneway up` running several components) never collide.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Latency buckets around the SLOs: chat TTFT p95 < 0.8 s, end-to-end p95 < 1 s (and long tails).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.5, 2.5, 5, 10, 30, 60, 300)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class BrokerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.queue_depth = Gauge("laneway_queue_depth", "Requests waiting in the lanes", ["pool", "class"], registry=r)
        self.queue_wait = Histogram("laneway_queue_wait_seconds", "Time from accept to dispatch",
                                    ["class"], buckets=LATENCY_BUCKETS, registry=r)
        self.dispatched = Counter("laneway_dispatched_total", "Requests handed to workers", ["pool", "class"], registry=r)
        self.batch_size = Histogram("laneway_dispatch_batch_size", "Requests per answered pull",
                                    ["pool"], buckets=BATCH_BUCKETS, registry=r)
        self.expired = Counter("laneway_expired_total", "Requests that expired before starting", ["class"], registry=r)
        self.rejected = Counter("laneway_rejected_total", "Requests refused by the broker", ["reason"], registry=r)
        self.cancelled = Counter("laneway_cancelled_total", "Requests cancelled before they ran", ["class"], registry=r)
        self.dead_lettered = Counter("laneway_dead_lettered_total", "Messages moved to the DLQ", ["reason"], registry=r)
        self.parked_pulls = Gauge("laneway_parked_pulls", "Worker pulls held open", ["pool"], registry=r)
        self.ready_workers = Gauge("laneway_ready_workers", "Workers with a fresh ready heartbeat", ["pool"], registry=r)
        self.routing_decisions = Counter("laneway_routing_decisions_total", "Requests routed, by pool and why",
                                         ["pool", "reason"], registry=r)
        self.routing_fallback = Counter("laneway_routing_fallback_total",
                                        "Requests spilled to the hosted-API pool", ["pool", "reason"], registry=r)
        # Several brokers, one schedule (broker/scheduler/): benchmarks find the leader by this gauge.
        self.scheduler = Gauge("laneway_broker_scheduler", "1 while this broker holds the scheduler lease",
                               registry=r)
        self.takeovers = Counter("laneway_scheduler_takeovers_total", "Times this broker took the scheduler lease",
                                 registry=r)
        self.forwarded = Counter("laneway_forwarded_total", "Admitted requests sent to the scheduler", registry=r)
        self.reforwarded = Counter("laneway_reforwarded_total",
                                   "Admitted requests sent again (a new scheduler, or no answer)", registry=r)
        self.forwarded_waiting = Gauge("laneway_forwarded_waiting",
                                       "Admitted requests here whose scheduler has not settled them", registry=r)


class BridgeMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter("laneway_http_requests_total", "Chat completion requests by outcome",
                                ["class", "status"], registry=r)
        self.ttft = Histogram("laneway_ttft_seconds", "Time to first token as the client sees it",
                              ["class"], buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("laneway_request_seconds", "End-to-end request time", ["class"],
                             buckets=LATENCY_BUCKETS, registry=r)
        self.tokens = Counter("laneway_output_tokens_total", "Tokens streamed to clients", ["class"], registry=r)
        self.rejected = Counter("laneway_edge_rejected_total", "Requests refused at the edge", ["reason"], registry=r)
        self.publish_retries = Counter("laneway_publish_retries_total",
                                       "Publishes of a request repeated after a PubAck timed out", registry=r)
        self.open_streams = Gauge("laneway_open_streams", "Requests in flight at this edge", registry=r)
        self.frames = Counter("laneway_frames_received_total", "Token frames demultiplexed", registry=r)
        self.frame_lag = Histogram("laneway_frame_lag_seconds", "Worker publish to edge receipt of a token frame",
                                   buckets=LATENCY_BUCKETS, registry=r)
        self.eval_quality = Gauge("laneway_eval_quality", "Golden-set quality of the live routing rules (0-100)",
                                  ["ruleset_version"], registry=r)
        self.stale_entries = Counter("laneway_stale_entries_total",
                                     "Frame entries dropped (stale attempt or unknown request)", registry=r)
        self.slow_readers = Counter("laneway_slow_readers_total",
                                    "Streams ended because their client stopped reading, by the limit "
                                    "that ended them (stream, tenant buffered bytes, write timeout)",
                                    ["limit"], registry=r)
