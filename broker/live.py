"""What changes while a broker runs, as this replica last saw it.

- From KV watches (`Catalogue`, shared with the bridge): priority classes, tenants, the models
  table and the routing rules.
- From worker heartbeats: each pool's health and the real model its workers serve.

The broker reads these on every request. Two callbacks let it re-apply what it derives from
them: its lanes' class policies, and the tenant- and model-shaped state (cache scopes, usage
metric labels).
"""

from __future__ import annotations

from collections.abc import Callable

from nats.aio.msg import Msg

from broker.gate.pipeline import Routing
from core.catalogue import Catalogue
from core.routing.health import HealthBoard
from core.routing.rules import PoolHealth
from schemas import codec


class LiveConfig(Catalogue):
    def __init__(self, on_classes: Callable[[], None], on_catalogue: Callable[[], None]) -> None:
        super().__init__(on_classes=on_classes, on_catalogue=on_catalogue)
        self.health = HealthBoard()
        self.pool_health: dict[str, PoolHealth] = {}
        self.pool_models: dict[str, str] = {}  # pool → the model its workers announce

    def routing(self) -> Routing:
        return Routing(self.models, self.rules, self.pool_health, self.pool_models)

    def pool_names(self) -> set[str]:
        names = {m.pool for m in self.models.values()}
        return names | set(self.rules.pools) if self.rules else names

    def refresh_health(self) -> dict[str, PoolHealth]:
        self.pool_health = self.health.snapshot()
        return self.pool_health

    async def on_heartbeat(self, msg: Msg) -> None:
        try:
            beat = codec.decode_heartbeat(msg.data)
        except codec.DecodeError:
            return
        self.health.on_heartbeat(beat)
        if beat.ready and beat.model:
            self.pool_models[beat.pool] = beat.model
        self.refresh_health()
