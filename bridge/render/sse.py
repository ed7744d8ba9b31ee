"""Server-sent events framing shared by the edge's streams."""

from __future__ import annotations

DONE = b"data: [DONE]\n\n"


def error_event(error_body: bytes) -> bytes:
    """After the stream has started, errors go in-band, then [DONE] (as vLLM's server does)."""
    return b"data: " + error_body + b"\n\n"
