"""Order at the bridge's door (DESIGN.md, "Order before the lanes"): a lower class is refused
first, an interactive request finds room while a batch flood holds the bridge, and a class's
streams are shared fairly between tenants. The real admission over a real Demux; no server."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter, defaultdict
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.config import BridgeConfig
from bridge.errors import EdgeError
from bridge.generate import admission
from bridge.generate.admission import MEASURED, OVERLOAD_HEADER, STREAMING_S, STREAMS, EdgeAdmission
from bridge.metrics import BridgeMetrics
from bridge.streams.demux import Demux
from core.catalogue import Catalogue
from core.looplag import LoopLag
from core.policy.classes import DEFAULT_CLASSES
from schemas.errors import ErrorCode

CLASSES = {policy.name: policy for policy in DEFAULT_CLASSES}


class Edge:
    """A bridge's admission and its open streams: `ask` admits a request and, if admitted, opens
    its stream; `end` closes a tenant's oldest."""

    def __init__(self, **config) -> None:
        catalogue = Catalogue()
        catalogue.classes.update(CLASSES)
        self.demux = Demux()
        self.admission = EdgeAdmission(
            BridgeConfig(**config), self.demux, LoopLag(), BridgeMetrics(), catalogue.rank, catalogue.classes
        )
        self.open: dict[str, list[str]] = defaultdict(list)
        self._ids = itertools.count()

    def ask(self, tenant: str, klass: str) -> EdgeError | None:
        try:
            self.admission(tenant, CLASSES[klass])
        except EdgeError as refusal:
            return refusal
        request_id = f"r{next(self._ids)}"
        self.demux.open(request_id, tenant, time.time() + 600, klass)
        self.open[tenant].append(request_id)
        return None

    def flood(self, tenant: str, klass: str) -> tuple[int, EdgeError]:
        """Ask until refused: how many were admitted, and the refusal."""
        for admitted in itertools.count():
            if (refusal := self.ask(tenant, klass)) is not None:
                return admitted, refusal
            assert admitted < 10_000

    def end(self, tenant: str) -> None:
        self.demux.close(self.open[tenant].pop(0))

    def held(self, tenant: str) -> int:
        return len(self.open[tenant])

    def close_all(self) -> None:
        for tenant in list(self.open):
            while self.open[tenant]:
                self.end(tenant)


def overloaded(refusal: EdgeError | None, kind: str) -> bool:
    return (
        refusal is not None
        and refusal.code is ErrorCode.overloaded
        and refusal.status == 503
        and int(refusal.headers["Retry-After"]) >= 1
        and refusal.headers[OVERLOAD_HEADER] == kind
    )


async def test_at_the_limit_held_by_batch_a_chat_is_admitted_and_batch_refused():
    for config, kind in (
        ({"max_streams": 10, "initial_stream_limit": 0}, STREAMS),
        ({"initial_stream_limit": 10}, MEASURED),
    ):
        edge = Edge(**config)
        admitted, refusal = edge.flood("flood", "batch")
        assert admitted == 9 and overloaded(refusal, kind), "batch holds at most 0.9 of the limit"
        assert "kept for higher classes" in refusal.message
        assert overloaded(edge.ask("neighbour", "batch"), kind), "the room left is not batch's, whoever asks"
        assert overloaded(edge.ask("neighbour", "standard"), kind), "standard's 0.95 of 10 is 9 too"
        assert edge.ask("chat", "interactive") is None, "a chat finds room while batch holds the bridge"
        assert overloaded(edge.ask("chat", "interactive"), kind), "the limit itself binds every class"
        edge.end("flood")
        assert edge.ask("chat", "interactive") is None, "a batch stream's end is a chat's room"
        assert overloaded(edge.ask("flood", "batch"), kind), "...and not batch's, while a chat holds it"
        if kind == MEASURED:  # refused by its shares, the measured limit binds: it grows when on time
            limit = edge.admission.limit
            limit.observe(time.monotonic() + limit.tick_s, open_streams=len(edge.demux), lag_s=0.0, loop_lag_s=0.0)
            assert limit.limit > 10
        edge.close_all()


async def test_a_limit_cut_below_what_a_flood_holds_still_admits_a_chat_to_its_headroom():
    """The measured limit falls fast (0.8 of the open streams) when delivery runs late; a retry
    storm of standard then holds more than the whole new limit, and its streams are long. The
    storm's excess must not refuse every chat until they end: the storm counts up to its room."""
    edge = Edge(initial_stream_limit=100, tenant_stream_share=1.0)  # the classes' order alone
    limit = edge.admission.limit
    limit.growth = 0.0  # the limit moves only where the test moves it
    admitted, refusal = edge.flood("storm", "standard")
    assert admitted == 95 and overloaded(refusal, MEASURED)
    limit.limit = 50.0  # a cut: standard may fill 47 of it, and holds 95
    assert overloaded(edge.ask("storm", "standard"), MEASURED), "the storm gets nothing while over its room"
    assert overloaded(edge.ask("storm", "batch"), MEASURED), "nor does any class after it"
    assert [edge.ask("chat", "interactive") is None for _ in range(4)] == [True, True, True, False], (
        "the chats take the headroom standard may never fill (50 - 47), and no more"
    )
    edge.close_all()


async def test_while_a_chat_streams_the_classes_under_it_are_held_to_a_tighter_lag():
    """Frames 20 ms late: on time for the bridge's measured limit (late past 40 ms), late for the
    lower classes' while a higher class streams (past 7.5 ms over the floor, 3 x
    `lower_class_lag_s`). At that lag a chat waits its 20 ms behind each frame of a flood the
    bridge took on; the flood gets less. An offset between the hosts' clocks is not lateness."""
    cases = (  # the least lag lately, the lag now (smoothed), a chat streaming, batch's streams
        (0.001, 0.02, False, 230),
        (0.001, 0.02, True, 28),
        (0.001, 0.003, True, 230),
        (0.019, 0.02, True, 230),  # the worker's clock is 19 ms behind the bridge's: not late
    )
    for floor_s, lag_s, chat_streams, batch_gets in cases:
        edge = Edge(tenant_stream_share=1.0)  # the limits start at 256: batch's room is 230
        now = time.monotonic()
        edge.demux.lag.observe(floor_s, now - 1.5)
        edge.demux.lag.observe(lag_s, now)  # the first was over a second ago: the smoothed lag starts over
        if chat_streams:
            assert edge.ask("chat", "interactive") is None
        admitted, refusal = edge.flood("flood", "batch")
        assert admitted == batch_gets and overloaded(refusal, MEASURED), (floor_s, lag_s, chat_streams)
        assert edge.ask("chat", "interactive") is None, "the chats' own limit is the bridge's"
        edge.close_all()

    edge = Edge(tenant_stream_share=1.0, lower_class_lag_s=0.0)  # off: one limit for every class
    edge.demux.lag.observe(0.02, time.monotonic())
    assert edge.ask("chat", "interactive") is None and edge.flood("flood", "batch")[0] == 230
    edge.close_all()


async def test_a_lower_class_is_held_in_the_gaps_between_chats_as_long_as_its_streams_live(monkeypatch):
    """A stream admitted in a gap between two chats is still open when the next chat comes: the
    lower classes stay held for `STREAMING_S` after a higher class last streamed, not for the
    gap. Held two seconds, a Poisson 2/s chat's gaps let a retry storm take the first limit's
    room (99 -> 176 streams in a second), and the next chats waited on every frame of it."""
    clock = [time.monotonic()]
    monkeypatch.setattr(admission, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    edge = Edge(tenant_stream_share=1.0)  # the limits start at 256: batch's room is 230

    def late_frames() -> None:  # 20 ms late over a 1 ms floor: late for the lower classes only
        edge.demux.lag.observe(0.001, clock[0] - 1.5)
        edge.demux.lag.observe(0.02, clock[0])

    late_frames()
    assert edge.ask("chat", "interactive") is None
    edge.end("chat")
    for gap_s, batch_gets in ((10.0, 28), (STREAMING_S + 1.0, 230)):
        clock[0] += gap_s  # no chat since
        late_frames()
        admitted, refusal = edge.flood("flood", "batch")
        assert admitted == batch_gets and overloaded(refusal, MEASURED), gap_s
        edge.close_all()


async def test_a_tenant_holding_its_share_is_refused_while_another_is_admitted():
    edge = Edge(max_streams=100, initial_stream_limit=0)  # batch's room: 90; one tenant's: 81
    admitted, refusal = edge.flood("flood", "batch")
    assert admitted == 81 and overloaded(refusal, STREAMS) and "this tenant holds 81" in refusal.message
    assert edge.ask("other", "batch") is None, "the room a flood leaves, another tenant takes"
    assert edge.ask("flood", "interactive") is None, "and the flood's own chat: its batch does not count"
    # The chats may fill 100 - 82; past 0.9 of that a tenant over its equal share of them waits.
    admitted, refusal = edge.flood("chat", "interactive")
    assert admitted == 16 and "this tenant holds 16 of the 17" in refusal.message
    assert edge.ask("flood", "interactive") is None, "a tenant under its share of the chats gets the last"
    refusal = edge.ask("other", "interactive")
    assert overloaded(refusal, STREAMS) and "limit (100)" in refusal.message, "and the bridge is full"
    edge.close_all()

    edge = Edge(max_streams=100, initial_stream_limit=0, tenant_stream_share=1.0)  # off
    assert edge.flood("flood", "batch")[0] == 90
    edge.close_all()


async def test_as_a_floods_streams_end_the_other_tenant_takes_them_to_an_equal_share():
    """Streams end oldest first; each time, the flood (many clients) asks five times, the other
    tenant once. A fixed per-tenant cap would leave the other its 9 streams forever."""
    edge = Edge(max_streams=100, initial_stream_limit=0)
    edge.flood("flood", "batch")
    edge.flood("other", "batch")
    assert (edge.held("flood"), edge.held("other")) == (81, 9)
    for _ in range(400):
        tenant = min(("flood", "other"), key=lambda t: int(edge.open[t][0][1:]) if edge.open[t] else 1 << 60)
        edge.end(tenant)
        for _ in range(5):
            edge.ask("flood", "batch")
        edge.ask("other", "batch")
    assert abs(edge.held("flood") - edge.held("other")) <= 1, (edge.held("flood"), edge.held("other"))
    assert edge.held("flood") + edge.held("other") >= 89, "tenants that both want more fill the room"
    edge.close_all()


def brute(demux: Demux) -> tuple[Counter, dict, Counter]:
    """The Demux's counts, recounted from its streams."""
    by_class, of_tenant = Counter(), defaultdict(Counter)
    for stream in demux.streams():
        by_class[stream.klass] += 1
        of_tenant[stream.tenant][stream.klass] += 1
    return by_class, of_tenant, Counter(klass for classes in of_tenant.values() for klass in classes)


KINDS = ["interactive", "standard", "batch", ""]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.booleans(), st.sampled_from(["a", "b", "c"]), st.sampled_from(KINDS), st.integers(0, 50)),
        max_size=80,
    )
)
def test_open_streams_are_counted_by_class_and_tenant(ops):
    async def play() -> None:
        demux, ids = Demux(), itertools.count()
        for opens, tenant, klass, pick in ops:
            streams = demux.streams()
            if opens or not streams:
                demux.open(f"r{next(ids)}", tenant, time.time() + 600, klass)
            else:
                demux.close(streams[pick % len(streams)].request_id)
            by_class, of_tenant, holders = brute(demux)
            assert demux.by_class() == by_class
            assert [demux.holders(k) for k in KINDS] == [holders[k] for k in KINDS]
            for name in ("a", "b", "c"):
                assert demux.classes_of(name) == of_tenant.get(name, {})
                assert demux.held_by(name) == sum(of_tenant.get(name, Counter()).values())
        for stream in demux.streams():
            demux.close(stream.request_id)
        assert not demux.by_class() and not any(demux.holders(k) for k in KINDS)

    asyncio.run(play())
