"""OpenAI's cursor paging of lists (files, batches, stored items, conversation items): `after`
(an id in the list), `limit`, `order` (asc|desc by creation). One reading of the query, one
window over the list, for every listing route."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from aiohttp import web

from bridge.errors import EdgeError
from schemas.errors import ErrorCode

T = TypeVar("T")


def query_int(raw: str | None, default: int, param: str, low: int, high: int) -> int:
    try:
        value = int(raw) if raw is not None else default
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise EdgeError(ErrorCode.invalid_request, f"{param} must be an integer from {low} to {high}", param)
    return value


def page_query(request: web.Request, default_limit: int, max_limit: int) -> tuple[str | None, int, str]:
    """(after, limit, order) of a listing request; `order` is desc unless asked."""
    order = request.query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise EdgeError(ErrorCode.invalid_request, "order must be 'asc' or 'desc'", "order")
    return (
        request.query.get("after"),
        query_int(request.query.get("limit"), default_limit, "limit", 1, max_limit),
        order,
    )


def window(items: Sequence[T], ids: Sequence[str], after: str | None, limit: int, order: str) -> tuple[list[T], bool]:
    """The page of `items` (oldest first, `ids` theirs) after the id `after` in `order`, at most
    `limit`, and whether more follow. An `after` not in the list pages from nothing."""
    ordered, order_ids = (list(items), list(ids)) if order == "asc" else (list(items)[::-1], list(ids)[::-1])
    if after is not None:
        start = order_ids.index(after) + 1 if after in order_ids else len(ordered)
        ordered = ordered[start:]
    return ordered[:limit], len(ordered) > limit
