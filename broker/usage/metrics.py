"""Prometheus counters of metered usage: tokens, cost and requests per tenant and logical model.

Labels stay bounded: `tenant` takes only names of configured tenants and `model` only names of
configured logical models (both fed from the live `lw_tenants` / `lw_routing` config through
`set_known`); any other value is counted under `other`. So the series count is at most
(tenants + 1) x (models + 1) x a few, whatever a publisher puts in a record. Served model
versions, pools and request ids are never labels here: `laneway usage` has those details.

Feed it from ONE consumer of `lw.usage.*` per deployment (a queue-group subscription shared by
the broker replicas), or sums across replicas count each request more than once.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter

from schemas.usage import Usage

OTHER = "other"


class UsageMetrics:
    def __init__(self, registry: CollectorRegistry | None = None, tenants: Iterable[str] = (),
                 models: Iterable[str] = ()) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.tokens = Counter("laneway_usage_tokens_total", "Tokens metered, by tenant, model and kind",
                              ["tenant", "model", "kind"], registry=r)
        self.cost = Counter("laneway_usage_cost_usd_total", "Cost metered in US dollars",
                            ["tenant", "model"], registry=r)
        self.requests = Counter("laneway_usage_requests_total", "Finished requests metered",
                                ["tenant", "model", "cached"], registry=r)
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
        self.requests.labels(tenant, model, "true" if usage.cached else "false").inc()
