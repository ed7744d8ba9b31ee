"""A JetStream delivery's ack subject says which stored message it is: its stream sequence is the
same on every delivery of that message, and differs for a message published again under the
same request id (an Idempotency-Key's retry)."""

from __future__ import annotations

import nats.errors
from nats.aio.msg import Msg


def stream_sequence(ack_subject: str) -> int:
    """The message's sequence in its stream; 0 when the subject is not an ack subject."""
    try:
        return Msg.Metadata._from_reply(ack_subject).sequence.stream
    except (nats.errors.Error, ValueError, IndexError):
        return 0


def same_message(ack_subject: str, other: str) -> bool:
    """Whether two ack subjects are deliveries of one stored message."""
    seq = stream_sequence(ack_subject)
    return seq == stream_sequence(other) if seq else ack_subject == other
