"""One `Usage` record per finished request on `lw.usage.<tenant>` (stream `LW_USAGE`).

Fields evolve by appending ones with defaults: older records decode with those defaults."""

from __future__ import annotations

import msgspec


class Usage(msgspec.Struct, omit_defaults=True, gc=False):
    request_id: str
    tenant: str
    klass: str = msgspec.field(name="class")
    model: str  # logical model asked for
    served_model: str  # real model that answered
    pool: str
    worker_id: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    queued_s: float
    ttft_s: float | None
    total_s: float
    finished_at: float
    cached: bool = False
    cost_usd: float = 0.0
    # Some of the stream's frames could not be published (e.g. NATS went down mid-stream): the
    # client never got its end, and `completion_tokens` counts only the tokens it was sent.
    interrupted: bool = False
    undelivered_tokens: int = 0  # generated but never published
    # Prefix-cache hits: of `prompt_tokens`, those the engine read from its KV cache instead of
    # prefilling, and what that saved at the prices in force (full prompt rate less cached rate).
    cached_tokens: int = 0
    prefix_saved_usd: float = 0.0
    # A continuation (its worker was lost mid-stream): tokens the lost worker streamed, which this
    # one prefilled after the prompt to go on. Counted once, in `completion_tokens` (the client
    # got them, the lost worker recorded nothing) and billed so; this extra prefill is Laneway's.
    continued_tokens: int = 0
    # Which delivery of which stored request message this is (JetStream's count; the message's
    # sequence in its request stream). A record that `takes_over` counted what the message's
    # earlier deliveries streamed to the client: a record of an earlier delivery (a worker judged
    # lost that finished before it read its fence) is void for billing (core/usage_log.billed).
    attempt: int = 0
    message: int = 0
    takes_over: bool = False


class StorageUsage(msgspec.Struct, frozen=True, omit_defaults=True):
    """What Laneway keeps for a tenant at rest (`lw_storage`, key `<tenant>`): written by the
    bridge whenever the tenant's files change, read by `laneway usage`. Numbers only: nothing of
    the files themselves, which `ops` may not read."""

    file_bytes: int = 0
    files: int = 0
    counted_at: float = 0.0  # when the bridge counted it (Unix time)


class Superseded(msgspec.Struct, frozen=True, tag_field="kind", tag="superseded"):
    """A batch's line run again because the bridge that ran it died: every other run of line
    `line` of `batch_id` is void for billing, and `kept`, the request id its output line names,
    is the one billed. On the tenant's usage subject beside the `Usage` records (whose decoder
    refuses it: readers of `Usage` alone skip it)."""

    tenant: str
    batch_id: str
    line: int
    kept: str
    at: float

    def voids(self, u: Usage) -> bool:
        """The record is another run of this line (its request id: `<batch>-<line>-<owner>-<try>`)."""
        return u.request_id != self.kept and u.request_id.startswith(f"{self.batch_id}-{self.line}-")
