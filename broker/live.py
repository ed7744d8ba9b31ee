"""What changes while a broker runs, as this replica last saw it.

- From KV watches: priority classes, tenants, the models table and the routing rules. Operators
  write them (`laneway classes|tenants|routing`, the admin API); every replica applies each
  change as its watch delivers it, and logs it.
- From worker heartbeats: each pool's health and the real model its workers serve.

The broker reads these on every request. Two callbacks let it re-apply what it derives from
them: its lanes' class policies, and the tenant- and model-shaped state (cache scopes, usage
metric labels).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from nats.aio.msg import Msg
from nats.js import JetStreamContext

from broker import classes as class_docs
from broker import tenants as tenant_docs
from broker.config import LogicalModel
from broker.gate.pipeline import Routing
from broker.models import decode_models, served_names
from broker.routing import rules as rule_docs
from broker.routing.health import HealthBoard
from broker.routing.rules import PoolHealth, RuleSet
from broker.routing.store import is_rules_key
from broker.runtime.kvwatch import BucketWatch
from broker.tenants import TenantDirectory
from schemas import codec
from schemas.subjects import Subjects

log = logging.getLogger("laneway.broker")


class LiveConfig:
    def __init__(self, on_classes: Callable[[], None], on_catalogue: Callable[[], None]) -> None:
        self.classes: dict[str, class_docs.ClassPolicy] = {}
        self.tenants = TenantDirectory()
        self.models: dict[str, LogicalModel] = {}
        self.rules: RuleSet | None = None
        self.health = HealthBoard()
        self.pool_health: dict[str, PoolHealth] = {}
        self.pool_models: dict[str, str] = {}     # pool → the model its workers announce
        self._on_classes = on_classes
        self._on_catalogue = on_catalogue         # tenants, models or rules changed
        self._watches: list[BucketWatch] = []

    async def start(self, js: JetStreamContext, s: Subjects) -> None:
        self._watches = [
            BucketWatch(js, s.bucket("classes"), self._put_class, self._delete_class),
            BucketWatch(js, s.bucket("tenants"), self._put_tenant, self._remove_tenant),
            BucketWatch(js, s.bucket("routing"), self._put_routing, self._delete_routing),
        ]
        for watch in self._watches:
            await watch.start()

    async def stop(self) -> None:
        for watch in self._watches:
            await watch.stop()

    def routing(self) -> Routing:
        return Routing(self.models, self.rules, self.pool_health, self.pool_models)

    def pool_names(self) -> set[str]:
        names = {m.pool for m in self.models.values()}
        return names | set(self.rules.pools) if self.rules else names

    def model_names(self) -> set[str]:
        return served_names(self.models, self.rules)

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

    # -- KV watch callbacks ---------------------------------------------------------------
    def _put_class(self, name: str, value: bytes) -> None:
        self.classes[name] = class_docs.decode(name, value)
        self._on_classes()
        log.info("applied class %s", name)

    def _delete_class(self, name: str) -> None:
        self.classes.pop(name, None)
        self._on_classes()
        log.info("removed class %s", name)

    def _put_tenant(self, name: str, value: bytes) -> None:
        self.tenants.put(tenant_docs.decode(name, value))
        self._on_catalogue()
        log.info("applied tenant %s", name)

    def _remove_tenant(self, name: str) -> None:
        self.tenants.remove(name)
        self._on_catalogue()
        log.info("removed tenant %s", name)

    def _put_routing(self, key: str, value: bytes) -> None:
        if key == "models":
            self.models = decode_models(value)
            self._on_catalogue()
            log.info("applied models: %s", sorted(self.models))
        elif is_rules_key(key):
            self.rules = rule_docs.decode(value)
            self._on_catalogue()
            log.info("applied routing rules version %d", self.rules.version)

    def _delete_routing(self, key: str) -> None:
        if is_rules_key(key):
            self.rules = None
            log.info("routing rules removed; models table only")
