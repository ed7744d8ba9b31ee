"""Resuming a stream at another bridge replica: the asking bridge and the one holding the
stream speak these on `lw.resume.<edge_id>` (subjects.py), bridges only.

Ask and Release travel to the holder; Relayed chunks come back, in order, to the asker's reply
subject. The holder checks the tenant: an ask naming a stream of another tenant is answered
exactly as one naming no stream. New fields go at the end, with defaults.
"""

from __future__ import annotations

import msgspec


class ResumeAsk(msgspec.Struct, tag=0, array_like=True, gc=False):
    tenant: str  # whom the asker's API key opened
    request_id: str
    after: int  # the last event the client saw (its Last-Event-ID's position)
    path: str  # the endpoint resumed on: a chat stream is not resumed as a completion
    reply: str  # the asker's `resume_reply` subject


class ResumeRelease(msgspec.Struct, tag=1, array_like=True, gc=False):
    """The asker's client went away: the holder stops relaying and keeps the stream for the window."""

    request_id: str
    reply: str


ResumeControl = ResumeAsk | ResumeRelease


class Relayed(msgspec.Struct, array_like=True, gc=False):
    since: int  # the position this chunk continues from (the asker checks for gaps)
    upto: int  # the position of its last event
    events: bytes = b""  # SSE bytes, `id:` lines included
    done: bool = False  # the stream's last events: nothing follows
    status: int = 0  # an error instead of events (0: none): HTTP status, code, message
    code: str = ""
    message: str = ""
