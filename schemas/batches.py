"""The Files and Batch APIs' objects (OpenAI's shapes), and what Laneway keeps beside them.

`FileObject` and `Batch` are what clients read; unset optional members are left out, as OpenAI
does (its schema types them as strings and integers, not null). `BatchState` is the record in the
batches bucket: the public `Batch` and the runner's bookkeeping (who runs it, until when, how far
it got), never shown to a client. `LineResult` is one finished input line, as the results stream
keeps it until the batch is finalized into its output and error files.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

FilePurpose = Literal["batch", "batch_output", "user_data"]
UPLOAD_PURPOSES: tuple[FilePurpose, ...] = ("batch", "user_data")  # what a client may upload; batch_output is Laneway's

BatchStatus = Literal[
    "validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled"
]
ACTIVE = frozenset({"validating", "in_progress", "finalizing", "cancelling"})  # a runner owes it work
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")

Metadata = Annotated[dict[str, Annotated[str, Meta(max_length=512)]], Meta(max_length=16)]


# `object` is the struct's tag: always written, where omit_defaults leaves out the unset optionals.
class FileObject(msgspec.Struct, omit_defaults=True, tag_field="object", tag="file"):
    id: str
    bytes: int
    created_at: int
    filename: str
    purpose: FilePurpose
    status: Literal["processed"]
    expires_at: int | None = None


class FileList(msgspec.Struct):
    data: list[FileObject]
    has_more: bool = False
    first_id: str | None = None
    last_id: str | None = None
    object: Literal["list"] = "list"


class Deleted(msgspec.Struct):
    id: str
    object: str
    deleted: bool = True


class CreateBatch(msgspec.Struct, forbid_unknown_fields=True):
    """The body of `POST /v1/batches`."""

    input_file_id: Annotated[str, Meta(min_length=1, max_length=64)]
    endpoint: str
    completion_window: str
    metadata: Metadata | None = None
    output_expires_after: dict[str, Any] | None = None


class BatchError(msgspec.Struct, omit_defaults=True):
    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(msgspec.Struct):
    data: list[BatchError]
    object: Literal["list"] = "list"


class RequestCounts(msgspec.Struct):
    total: int = 0
    completed: int = 0
    failed: int = 0


class BatchUsage(msgspec.Struct):
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    input_tokens_details: dict[str, int] = msgspec.field(default_factory=lambda: {"cached_tokens": 0})
    output_tokens_details: dict[str, int] = msgspec.field(default_factory=lambda: {"reasoning_tokens": 0})


class Batch(msgspec.Struct, omit_defaults=True, tag_field="object", tag="batch"):
    id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: BatchStatus
    created_at: int
    expires_at: int
    request_counts: RequestCounts
    model: str | None = None
    errors: BatchErrors | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    usage: BatchUsage | None = None
    metadata: dict[str, str] | None = None


class BatchList(msgspec.Struct):
    data: list[Batch]
    has_more: bool = False
    first_id: str | None = None
    last_id: str | None = None
    object: Literal["list"] = "list"


class BatchState(msgspec.Struct, omit_defaults=True):
    """The bucket's record. `owner` (a bridge's edge id) runs the batch while `lease_until` is in
    the future; `submitted` lines were published (under `owner`'s request ids); `lines` is the
    input's line count once validated."""

    tenant: str
    batch: Batch
    owner: str = ""
    lease_until: float = 0.0
    lines: int = 0
    submitted: int = 0


class LineResult(msgspec.Struct, array_like=True):
    """One input line, done: its output line (OpenAI's batch output format, JSON), whether it goes
    to the error file, and its token counts (the batch's usage)."""

    line: int
    output: bytes
    failed: bool
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
