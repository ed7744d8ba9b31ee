"""Broker, workers and bridge in one event loop, against a given NATS: for tests and benchmarks.

`laneway up` runs the same components as separate processes; this is the in-process
equivalent, so a test can reach into each component (engine state, metrics) directly. Like `up`,
it provisions first (streams, buckets, the settings file into KV, as the `ops` user when
`credentials` has one), create-if-absent: a second stack on the same prefix keeps what KV holds.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import dataclass, field, replace

from bridge.admin import AdminConfig
from bridge.app import Bridge
from bridge.config import BridgeConfig
from broker.app import Broker
from broker.config import BrokerConfig
from core.connect import NatsSettings
from core.policy.tenants import Tenant, hash_key
from core.provision import provision_at
from core.settings import LogicalModel, Settings
from core.topology import StreamLimits
from workers.engine import Engine
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.roofline import PROFILES
from workers.runner import Worker, WorkerConfig


def demo_settings(
    api_key: str,
    model: str = "laneway-sim",
    pool: str = "sim",
    tenant: str = "demo",
    extra_tenants: dict[str, str] | None = None,
) -> Settings:
    tenants = {tenant: Tenant(name=tenant, api_key_sha256=[hash_key(api_key)])}
    for name, key in (extra_tenants or {}).items():
        tenants[name] = Tenant(name=name, api_key_sha256=[hash_key(key)])
    return Settings(tenants=tenants, models={model: LogicalModel(pool=pool)})


@dataclass
class Stack:
    nats_url: str
    settings: Settings
    engines: list[Engine] | None = None  # None: one zero-delay sim engine; []: no workers
    pools: list[str] | None = None  # per engine; default: every engine in `pool`
    pool: str = "sim"
    limits: StreamLimits = field(default_factory=StreamLimits)
    worker_config: WorkerConfig = field(default_factory=WorkerConfig)
    bridge_config: BridgeConfig = field(default_factory=BridgeConfig)  # its NATS settings and port are the stack's
    prefix: str = "lw"
    credentials: dict[str, tuple[str, str]] | None = None  # role (or "ops") → (user, password)
    admin: AdminConfig | None = None
    pii: str = "off"  # the broker's PII stage: off | auto | regex | ner
    cache_ttl_s: float = 3600.0
    max_held: int = BrokerConfig.max_held  # requests the broker takes from JetStream at most
    sweep_interval_s: float = BrokerConfig.sweep_interval_s
    broker: Broker | None = None
    bridge: Bridge | None = None
    workers: list[Worker] = field(default_factory=list)

    async def __aenter__(self) -> Stack:
        self._exit = AsyncExitStack()
        await provision_at(self._nats("ops"), self.limits, self.settings)
        self.broker = await self._exit.enter_async_context(
            Broker(
                BrokerConfig(
                    nats=self._nats("broker"),
                    limits=self.limits,
                    pii=self.pii,
                    cache_ttl_s=self.cache_ttl_s,
                    max_held=self.max_held,
                    sweep_interval_s=self.sweep_interval_s,
                )
            )
        )
        engines = [SimEngine(PROFILES["zero"])] if self.engines is None else self.engines
        for i, engine in enumerate(engines):
            pool = self.pools[i] if self.pools else self.pool
            config = replace(self.worker_config, nats=self._nats("worker"), pool=pool)
            self.workers.append(await self._exit.enter_async_context(Worker(config, engine)))
        self.bridge = await self._exit.enter_async_context(
            Bridge(replace(self.bridge_config, nats=self._nats("bridge"), port=0), self.settings, admin=self.admin)
        )
        if engines:
            await self.bridge.wait_ready()
        return self

    def _nats(self, role: str) -> NatsSettings:
        user, password = (self.credentials or {}).get(role, (None, None))
        return NatsSettings(url=self.nats_url, prefix=self.prefix, user=user, password=password)

    async def __aexit__(self, *exc: object) -> None:
        await self._exit.aclose()

    @property
    def url(self) -> str:
        assert self.bridge is not None  # a started stack
        return self.bridge.url

    def finished(self, pool: str | None = None) -> float:
        """Requests the workers (of one pool, or all) have ended, whatever the reason: how a
        test tells that a request did, or did not, reach an engine."""
        return sum(
            s.value
            for w in self.workers
            if pool is None or w.config.pool == pool
            for m in w.metrics.finished.collect()
            for s in m.samples
            if s.name.endswith("_total")
        )
