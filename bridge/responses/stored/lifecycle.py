"""A stored response's status, read and changed on its stored JSON, and the one rule for a
background response whose bridge went away. Pure: time is passed in."""

from __future__ import annotations

from typing import Any

import orjson

from schemas.stored import STALE_LEASES, StoredResponse

TERMINAL = frozenset({"completed", "incomplete", "failed", "cancelled"})
BRIDGE_LOST = "the bridge running this background response stopped before it finished; create it again"


def status_of(record: StoredResponse) -> str:
    return orjson.loads(record.response)["status"]


def running(record: StoredResponse) -> bool:
    return status_of(record) not in TERMINAL


def stale(record: StoredResponse, now: float) -> bool:
    """A background response still running whose bridge has not refreshed it for STALE_LEASES
    leases: that bridge is gone (or cut off from NATS), and its generation with it."""
    return record.lease_s > 0 and running(record) and now - record.beat_at > STALE_LEASES * record.lease_s


def ended(record: StoredResponse, status: str, error: dict[str, Any] | None = None) -> StoredResponse:
    """The record with its Response in a terminal `status` (and `error`), no longer owned."""
    response = orjson.loads(record.response)
    response["status"] = status
    if error is not None:
        response["error"] = error
    events = record.events
    if events and status == "failed":  # a streamed one: its readers see the end in-band too
        seq = record.first_event + len(events)
        events = [
            *events,
            b"event: response.failed\ndata: "
            + orjson.dumps({"type": "response.failed", "sequence_number": seq, "response": response})
            + b"\n\n",
        ]
    return StoredResponse(
        response=orjson.dumps(response),
        request_id=record.request_id,
        input_items=record.input_items,
        history=record.history,
        events=events,
        first_event=record.first_event,
    )


def lost(record: StoredResponse) -> StoredResponse:
    return ended(record, "failed", {"code": "server_error", "message": BRIDGE_LOST})
