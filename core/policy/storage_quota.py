"""A tenant's storage quota: how much Laneway keeps for it at rest (the Files API's bytes and
files; its stored responses and conversations). Pure: the bridge measures what a tenant holds
and asks here before it keeps more (`bridge/files/store.py`, `bridge/responses/stored/budget.py`)."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

GIB = 1 << 30


class StorageQuota(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """The defaults hold five of the largest batch input files (200 MB each), or many small
    ones, and ten thousand stored responses (at most 10 GiB; most are a few KB)."""

    file_bytes: Annotated[int, Meta(ge=0)] = GIB  # all of a tenant's files together
    files: Annotated[int, Meta(ge=0)] = 1000  # how many files it may keep
    # stored responses and conversations together, each at most one NATS message (1 MiB)
    records: Annotated[int, Meta(ge=0)] = 10_000


class StorageExceeded(Exception):
    """Keeping `wanted` more would take the tenant past `limit` (the quota field's name), which
    allows `allowed`; it holds `used` already."""

    def __init__(self, limit: str, allowed: int, used: int, wanted: int) -> None:
        unit = " bytes" if limit.endswith("bytes") else ""
        super().__init__(
            f"storage quota exceeded: the tenant's {limit} limit is {allowed}{unit}; "
            f"it holds {used}{unit} and this would add {wanted}{unit}"
        )
        self.limit = limit
        self.allowed = allowed
        self.used = used
        self.wanted = wanted


def over_files(quota: StorageQuota, held_bytes: int, held_files: int, wanted_bytes: int) -> StorageExceeded | None:
    """`held_*`: what the tenant keeps besides this file; None when the file fits."""
    if held_files + 1 > quota.files:
        return StorageExceeded("files", quota.files, held_files, 1)
    if held_bytes + wanted_bytes > quota.file_bytes:
        return StorageExceeded("file_bytes", quota.file_bytes, held_bytes, wanted_bytes)
    return None


def over_records(quota: StorageQuota, held_records: int) -> StorageExceeded | None:
    """None when one more stored response or conversation fits."""
    if held_records + 1 > quota.records:
        return StorageExceeded("records", quota.records, held_records, 1)
    return None
