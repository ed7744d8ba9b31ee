"""The worker's outbox: a stream's deltas that wait for the same flush travel as one entry,
with contiguous sequence numbers, and never merge across attempts, past a terminal entry, or
into another tenant's stream of the same request id."""

from __future__ import annotations

from schemas import codec
from schemas.frames import Delta, Finished, StreamError, TokenUsage
from workers.metrics import WorkerMetrics
from workers.outbox import Delivery, Outbox


class FakeNats:
    max_payload = 1 << 20
    is_connected = True

    def __init__(self) -> None:
        self.published: list[tuple[str, bytes]] = []

    async def publish(self, subject: str, payload: bytes) -> None:
        self.published.append((subject, payload))


def frames(nc: FakeNats):
    return [(subject, codec.decode_frame(payload)) for subject, payload in nc.published]


async def test_deltas_of_one_stream_merge_until_the_flush():
    box, nc = Outbox("w1", "pool", WorkerMetrics(), 0.002), FakeNats()
    box.emit("inbox.a", Delta("r1", 1, 0, "Hel", [1]))
    assert box.extend(("inbox.a", "r1", 1), "lo", [2])
    assert not box.extend(("inbox.a", "r2", 1), "x", [9])  # nothing open for r2: the caller emits
    box.emit("inbox.a", Delta("r2", 1, 0, "Hi", [5]))
    assert box.extend(("inbox.a", "r1", 1), "!", [3])
    await box.flush(nc)
    [(subject, frame)] = frames(nc)
    assert subject == "inbox.a"
    assert frame.entries == [Delta("r1", 1, 0, "Hello!", [1, 2, 3]), Delta("r2", 1, 0, "Hi", [5])]
    # After a flush nothing is open: the next delta is a new entry with the next seq.
    assert not box.extend(("inbox.a", "r1", 1), " more", [4])


async def test_no_merge_across_attempts_or_after_the_end():
    box, nc = Outbox("w1", "pool", WorkerMetrics(), 0.002), FakeNats()
    box.emit("inbox.a", Delta("r1", 1, 0, "a", [1]))
    assert not box.extend(("inbox.a", "r1", 2), "b", [2])  # another delivery attempt
    box.emit("inbox.a", Finished("r1", 1, 1, "stop", TokenUsage(3, 1)))
    assert not box.extend(("inbox.a", "r1", 1), "late", [7])  # the stream already ended
    box.emit("inbox.b", Delta("r3", 1, 0, "x", [1]))
    box.emit("inbox.b", StreamError("r3", 1, 1, "engine_error", "boom"))
    assert not box.extend(("inbox.b", "r3", 1), "y", [2])
    await box.flush(nc)
    entries = {subject: frame.entries for subject, frame in frames(nc)}
    assert [type(e).__name__ for e in entries["inbox.a"]] == ["Delta", "Finished"]
    assert entries["inbox.a"][0].text == "a"
    assert [e.seq for e in entries["inbox.b"]] == [0, 1]


async def test_two_tenants_streams_of_one_request_id_stay_apart():
    """Request ids are the client's: acme and globex may stream under the same one at once. Each
    inbox gets its own tenant's text, and each usage record counts its own stream's tokens."""
    box, nc = Outbox("w1", "pool", WorkerMetrics(), 0.002), FakeNats()
    acme, globex = "lw.tok.acme.e1", "lw.tok.globex.e2"
    box.emit(acme, Delta("same", 1, 0, "acme's", [1]))
    box.emit(globex, Delta("same", 1, 0, "globex's", [7, 8]))
    assert box.extend((acme, "same", 1), " answer", [2])
    assert box.extend((globex, "same", 1), " own", [9])
    delivered: dict[str, Delivery] = {}

    def usage_of(inbox: str):
        def build(delivery: Delivery) -> bytes:
            delivered[inbox] = delivery
            return b"usage"

        return build

    for inbox in (acme, globex):
        box.emit(inbox, Finished("same", 1, 1, "stop", TokenUsage(3, 2)))
        box.metered("usage", (inbox, "same", 1), usage_of(inbox))
    await box.flush(nc)
    nc.published = [(subject, payload) for subject, payload in nc.published if subject != "usage"]
    entries = {subject: frame.entries for subject, frame in frames(nc)}
    assert entries[acme][0] == Delta("same", 1, 0, "acme's answer", [1, 2])
    assert entries[globex][0] == Delta("same", 1, 0, "globex's own", [7, 8, 9])
    assert delivered[acme].tokens == 2 and delivered[globex].tokens == 3
