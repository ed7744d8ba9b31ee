"""A tenant's budget of stored records (responses and conversations, `records` in its storage
quota), checked before a new one is created. Each record is one KV value, so at most one NATS
message (`max_payload`, 1 MiB by default): a bound on their count is a bound on their bytes.

The count is the server's: a `STREAM.INFO` of `lw_responses` filtered to the tenant's keys
answers how many subjects match (`total`), one small request, no reads of the records. It is asked
again at most every `FRESH_S` per tenant while the tenant is well under its budget, and for
every new record once it is near it. The bound is soft by the records created at once on all
bridges in that window (each a new response or conversation, never an upload's bytes). A count
that fails lets the record in: a NATS hiccup does not refuse a response.

Records already stored are never taken away: an append to a conversation, a background
response's progress, only grow records that exist."""

from __future__ import annotations

import logging
import time

import nats.errors
import orjson
from nats.js import JetStreamContext

from core.policy.storage_quota import StorageQuota, over_records

log = logging.getLogger("laneway.bridge")

FRESH_S = 2.0
PAST_THE_END = 1 << 31
NEAR = 0.9  # from this share of its budget on, a tenant is counted for every new record


class CountFailed(Exception):
    def __init__(self, stream: str, description: str) -> None:
        super().__init__(f"could not count the records of {stream}: {description}")
        self.stream = stream
        self.description = description


class RecordBudget:
    def __init__(self, js: JetStreamContext, stream: str, subject_prefix: str) -> None:
        self.js = js
        self.stream = stream  # KV_lw_responses
        self.subject_prefix = subject_prefix  # $KV.lw_responses.
        self._counted: dict[str, tuple[float, int]] = {}  # tenant -> (when, how many)

    async def admit(self, tenant: str, quota: StorageQuota) -> None:
        """Raise `StorageExceeded` if one more record would take `tenant` past its budget."""
        now = time.monotonic()
        at, held = self._counted.get(tenant, (float("-inf"), 0))
        if now - at > FRESH_S or held >= quota.records * NEAR:
            try:
                held = await self.count(tenant)
            except (CountFailed, nats.errors.Error) as exc:  # open: the server's own limits still hold
                log.warning("stored records of tenant %s not counted: %s", tenant, exc)
        if (refused := over_records(quota, held)) is not None:
            self._counted[tenant] = (now, held)
            raise refused
        self._counted[tenant] = (now if now - at > FRESH_S else at, held + 1)

    async def count(self, tenant: str) -> int:
        # An offset past the end: the server counts the matching subjects (`total`) but lists none,
        # so the answer stays small however many records the tenant keeps.
        request = orjson.dumps({"subjects_filter": f"{self.subject_prefix}{tenant}.>", "offset": PAST_THE_END})
        reply = await self.js._nc.request(f"{self.js._prefix}.STREAM.INFO.{self.stream}", request, timeout=5)
        info = orjson.loads(reply.data)
        if "error" in info:
            raise CountFailed(self.stream, info["error"].get("description", ""))
        return int(info.get("total") or 0)
