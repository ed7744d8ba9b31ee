"""The documents operators set, as this process last saw them: priority classes, tenants, the
models table and the routing rules, each kept current by a KV watch (`laneway classes|tenants|
routing`, the admin API). Every process that reads them (broker, bridge) holds one `Catalogue`,
so a change applies the same way everywhere, and is logged.

Callbacks let the holder re-apply what it derives: `on_classes` after a class changes,
`on_catalogue` after a tenant, the models table or the rules are put, `on_rules` with the rules
in force after they are put or removed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from nats.js import JetStreamContext

from core.kvwatch import BucketWatch
from core.models import decode_models, served_names
from core.policy import classes as class_docs
from core.policy import tenants as tenant_docs
from core.policy.tenants import TenantDirectory
from core.routing import rules as rule_docs
from core.routing.rules import RuleSet
from core.routing.store import is_rules_key
from core.settings import LogicalModel
from schemas.subjects import Subjects

log = logging.getLogger("laneway.config")


def _nothing(*_: object) -> None:
    pass


LAST_RANK = 1_000  # past every class's rank (a class's is at most 100)


class Catalogue:
    def __init__(
        self,
        *,
        on_classes: Callable[[], None] = _nothing,
        on_catalogue: Callable[[], None] = _nothing,
        on_rules: Callable[[RuleSet | None], None] = _nothing,
    ) -> None:
        self.classes: dict[str, class_docs.ClassPolicy] = {}
        self.tenants = TenantDirectory()
        self.models: dict[str, LogicalModel] = {}
        self.rules: RuleSet | None = None
        self._on_classes = on_classes
        self._on_catalogue = on_catalogue
        self._on_rules = on_rules
        self._watches: list[BucketWatch] = []

    async def start(self, js: JetStreamContext, s: Subjects) -> None:
        """Returns once each bucket's current values are applied."""
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

    def model_names(self) -> set[str]:
        return served_names(self.models, self.rules)

    def rank(self, klass: str) -> int:
        """A class's rank (0 is served first); an unknown one is served last (a gate refuses it)."""
        policy = self.classes.get(klass)
        return policy.rank if policy is not None else LAST_RANK

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
            self._on_rules(self.rules)
            self._on_catalogue()
            log.info("applied routing rules version %d", self.rules.version)

    def _delete_routing(self, key: str) -> None:
        if is_rules_key(key):
            self.rules = None
            self._on_rules(None)
            log.info("routing rules removed; models table only")
