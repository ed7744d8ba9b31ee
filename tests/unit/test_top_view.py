"""`laneway top`'s frame from fixed metric text, the scrape config `up` writes read back, and the
live gauges that drop a tenant's row once it holds nothing."""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from core.metrics import LiveSeries
from core.promtext import parse
from laneway import scrape_config
from laneway.scrape_config import Target
from laneway.top_view import Frame, render

BRIDGE = Target("bridge", "bridge", "127.0.0.1:8080")
BROKER = Target("broker", "broker", "127.0.0.1:9101")
WORKER = Target("worker", "worker-1", "127.0.0.1:9102")


def ttft(klass: str, tenant: str, le_counts: list[tuple[str, int]]) -> str:
    return "".join(
        f'laneway_ttft_seconds_bucket{{class="{klass}",tenant="{tenant}",le="{le}"}} {n}\n' for le, n in le_counts
    )


def bridge_text(fast: int, slow: int, refused: int, limit: int | None) -> str:
    """`fast` first tokens under 0.1 s and `slow` between 0.8 and 1 s for acme's chats."""
    return (
        "# TYPE laneway_ttft_seconds histogram\n"
        + ttft("interactive", "acme", [("0.1", fast), ("0.8", fast), ("1.0", fast + slow), ("+Inf", fast + slow)])
        + ttft("batch", "beta", [("0.1", 0), ("0.8", 0), ("1.0", 0), ("+Inf", 0)])
        + "# TYPE laneway_refused_total counter\n"
        f'laneway_refused_total{{class="interactive",tenant="acme",reason="too_many_streams"}} {refused}\n'
        "# TYPE laneway_open_streams gauge\nlaneway_open_streams 7\n"
        + (f"# TYPE laneway_stream_limit gauge\nlaneway_stream_limit {limit}\n" if limit is not None else "")
    )


BROKER_TEXT = """# TYPE laneway_tenant_queue_depth gauge
laneway_tenant_queue_depth{pool="sim",class="batch",tenant="beta"} 120
laneway_tenant_queue_depth{pool="big",class="batch",tenant="beta"} 5
laneway_tenant_queue_depth{pool="sim",class="batch",tenant="acme"} 3
# TYPE laneway_broker_scheduler gauge
laneway_broker_scheduler 1
"""

WORKER_TEXT = """# TYPE laneway_worker_slots_total gauge
laneway_worker_slots_total{pool="sim"} 32
# TYPE laneway_worker_slots_in_use gauge
laneway_worker_slots_in_use{pool="sim"} 30
# TYPE laneway_worker_running gauge
laneway_worker_running{pool="sim",class="interactive",tenant="acme"} 2
laneway_worker_running{pool="sim",class="batch",tenant="beta"} 28
# TYPE laneway_worker_kv_tokens gauge
laneway_worker_kv_tokens{pool="sim"} 1000
# TYPE laneway_worker_kv_free_tokens gauge
laneway_worker_kv_free_tokens{pool="sim"} 250
# TYPE laneway_worker_prompt_tokens_total counter
laneway_worker_prompt_tokens_total{pool="sim",class="batch"} 400
# TYPE laneway_worker_cached_prompt_tokens_total counter
laneway_worker_cached_prompt_tokens_total{pool="sim",class="batch"} 100
"""


def frame(at: float, bridge: str, worker: str | None = WORKER_TEXT) -> Frame:
    return Frame(
        at,
        [
            (BRIDGE, parse(bridge)),
            (BROKER, parse(BROKER_TEXT)),
            (WORKER, parse(worker) if worker else "ClientConnectorError: refused"),
        ],
    )


def cells(text: str, *first: str) -> list[str]:
    """The cells of the row whose first cells are `first` (two spaces or more apart)."""
    rows = [re.split(r"\s{2,}", line.strip()) for line in text.splitlines()]
    found = [r for r in rows if r[: len(first)] == list(first)]
    assert len(found) == 1, text
    return found[0]


def test_the_lanes_by_class_and_tenant_with_each_class_total() -> None:
    text = render(frame(100.0, bridge_text(fast=19, slow=1, refused=4, limit=None)))
    #                       class, tenant, waiting, running, TTFT p95, refused
    assert cells(text, "batch", "(all)") == ["batch", "(all)", "128", "28", "-", "0"]
    assert cells(text, "beta") == ["beta", "125", "28", "-", "0"]  # both pools' lanes
    assert cells(text, "acme", "3") == ["acme", "3", "0", "-", "0"]  # batch's acme: waits, runs nothing
    assert cells(text, "interactive", "(all)")[2:] == ["0", "2", "100 ms", "4"]
    assert "TTFT p95 (since start)" in text


def test_ttft_p95_of_the_live_view_is_over_the_window() -> None:
    before = frame(100.0, bridge_text(fast=19, slow=1, refused=0, limit=256))
    now = frame(110.0, bridge_text(fast=20, slow=20, refused=0, limit=256))  # 1 fast, 19 slow since
    text = render(now, before)
    assert "TTFT p95 (last 10 s)" in text
    assert cells(text, "interactive", "(all)")[4] == "989 ms"
    assert cells(render(now), "interactive", "(all)")[4] == "980 ms"  # since start: 20 + 20


def test_the_workers_the_bridges_and_who_does_not_answer() -> None:
    text = render(frame(100.0, bridge_text(fast=1, slow=0, refused=0, limit=256)))
    assert cells(text, "worker-1") == ["worker-1", "sim", "30/32", "75%", "25%", "0"]
    assert cells(text, "bridge", "127.0.0.1:8080")[2:4] == ["7", "256"]
    assert cells(render(frame(100.0, bridge_text(1, 0, 0, limit=None))), "bridge")[3] == "off"
    assert cells(text, "broker")[1] == "yes"
    down = render(frame(100.0, bridge_text(1, 0, 0, 256), worker=None))
    assert "not answering:" in down and "worker-1 (http://127.0.0.1:9102/metrics): ClientConnectorError" in down


def test_the_scrape_config_up_writes_reads_back(tmp_path) -> None:
    targets = [
        BRIDGE,
        Target("broker", "broker-1", "127.0.0.1:11"),
        Target("broker", "broker-2", "127.0.0.1:12"),
        WORKER,
    ]
    path = scrape_config.write(tmp_path, targets)
    assert path == tmp_path / "prometheus.yml"
    assert scrape_config.read(path) == targets
    assert "job_name: laneway-broker" in path.read_text()


def test_live_series_drop_a_row_that_holds_nothing() -> None:
    registry = CollectorRegistry()
    series = LiveSeries(Gauge("held", "x", ["tenant"], registry=registry))
    series.set({("acme",): 3, ("beta",): 1})
    series.set({("acme",): 2})
    text = generate_latest(registry).decode()
    assert 'held{tenant="acme"} 2.0' in text and "beta" not in text


def test_up_lists_the_bridge_where_a_client_reaches_it_and_the_others_on_loopback() -> None:
    targets = scrape_config.up_targets("0.0.0.0", 8080, {"broker": 11, "worker-1": 12, "worker-2": 13})
    assert [(t.kind, t.name, t.address) for t in targets] == [
        ("bridge", "bridge", "127.0.0.1:8080"),
        ("broker", "broker", "127.0.0.1:11"),
        ("worker", "worker-1", "127.0.0.1:12"),
        ("worker", "worker-2", "127.0.0.1:13"),
    ]
    assert scrape_config.up_targets("::1", 8080, {})[0].url == "http://[::1]:8080/metrics"
