"""The bridge's Prometheus metrics (labels bounded: see `core/metrics.py`; a tenant label only once
its API key is authenticated)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from core.metrics import LATENCY_BUCKETS


class BridgeMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "laneway_http_requests_total", "Chat completion requests by outcome", ["class", "status"], registry=r
        )
        self.ttft = Histogram(
            "laneway_ttft_seconds",
            "Time to first token as the client sees it",
            ["class", "tenant"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "laneway_request_seconds", "End-to-end request time", ["class"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.tokens = Counter("laneway_output_tokens_total", "Tokens streamed to clients", ["class"], registry=r)
        self.rejected = Counter("laneway_edge_rejected_total", "Requests refused at the edge", ["reason"], registry=r)
        self.refused = Counter(
            "laneway_refused_total",
            "Chat and completion requests of a known tenant and class answered with an "
            "error instead of a stream or a body, by its code",
            ["class", "tenant", "reason"],
            registry=r,
        )
        self.publish_retries = Counter(
            "laneway_publish_retries_total", "Publishes of a request repeated after a PubAck timed out", registry=r
        )
        self.open_streams = Gauge("laneway_open_streams", "Requests in flight at this edge", registry=r)
        self.stream_limit = Gauge(
            "laneway_stream_limit", "Open streams this edge takes now, as measured from its delivery lag", registry=r
        )
        self.lower_stream_limit = Gauge(
            "laneway_lower_class_stream_limit",
            "Open streams of the classes under a streaming higher class this edge takes now (--lower-class-lag)",
            registry=r,
        )
        self.loop_lag = Gauge(
            "laneway_event_loop_lag_seconds", "How late this edge's event loop runs (mean over 2 s)", registry=r
        )
        self.frames = Counter("laneway_frames_received_total", "Token frames demultiplexed", registry=r)
        self.frame_lag = Histogram(
            "laneway_frame_lag_seconds",
            "Worker publish to edge receipt of a token frame",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.eval_quality = Gauge(
            "laneway_eval_quality",
            "Golden-set quality of the live routing rules (0-100)",
            ["ruleset_version"],
            registry=r,
        )
        self.stale_entries = Counter(
            "laneway_stale_entries_total", "Frame entries dropped (stale attempt or unknown request)", registry=r
        )
        self.slow_readers = Counter(
            "laneway_slow_readers_total",
            "Streams ended because their client stopped reading, by the limit "
            "that ended them (stream, tenant buffered bytes, write timeout)",
            ["limit"],
            registry=r,
        )
        self.resumed = Counter(
            "laneway_streams_resumed_total",
            "Streams a client took back with Last-Event-ID, counted by the bridge holding "
            "them, by how (local, or relay: the resume reached another replica)",
            ["via"],
            registry=r,
        )
        self.expired = Counter(
            "laneway_streams_expired_total",
            "Streams whose client left and did not resume within --resume-window-s: generation cancelled, events freed",
            registry=r,
        )
