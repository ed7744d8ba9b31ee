"""A tenant's stored responses (`/v1/responses` with `store`): whether Laneway keeps them, and for
how long. The store's per-message TTL enforces the retention (`bridge/responses/stored/store.py`)."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

DEFAULT_RETENTION_DAYS = 30.0  # as OpenAI keeps a stored response
DAY_S = 86_400


class StoragePolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """`store = false` forces every response of the tenant unstored, whatever the client asks
    (`store: true` is then answered with `"store": false`; `background`, which needs the store,
    is refused)."""

    store: bool = True
    retention_days: Annotated[float, Meta(gt=0, le=3650)] = DEFAULT_RETENTION_DAYS

    @property
    def retention_s(self) -> int:
        """JetStream's per-message TTL is whole seconds, at least one."""
        return max(1, int(self.retention_days * DAY_S))
