"""A tenant's storage quota: how much Laneway keeps for it at rest (the Files API's bytes and
objects; one stored response or conversation's size). Pure: the bridge measures what a tenant
holds and asks `over` before it keeps more (`bridge/file_store.py`, `bridge/stored/`)."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

GIB = 1 << 30
MIB = 1 << 20


class StorageQuota(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """Defaults hold five of the largest batch input files (200 MB each) and any number of
    ordinary ones; a stored record holds a long conversation's items."""

    file_bytes: Annotated[int, Meta(ge=0)] = GIB          # all of a tenant's files together
    files: Annotated[int, Meta(ge=0)] = 1000               # how many files it may keep
    record_bytes: Annotated[int, Meta(ge=1024)] = 4 * MIB   # one stored response or conversation


class StorageExceeded(Exception):
    """Keeping `wanted` more would take the tenant past `limit` (the quota field's name), which
    allows `allowed`; it holds `used` already."""

    def __init__(self, limit: str, allowed: int, used: int, wanted: int) -> None:
        unit = "" if limit == "files" else " bytes"
        super().__init__(f"storage quota exceeded: the tenant's {limit} limit is {allowed}{unit}; "
                         f"it holds {used}{unit} and this would add {wanted}{unit}")
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


def over_record(quota: StorageQuota, size: int) -> StorageExceeded | None:
    if size > quota.record_bytes:
        return StorageExceeded("record_bytes", quota.record_bytes, 0, size)
    return None
