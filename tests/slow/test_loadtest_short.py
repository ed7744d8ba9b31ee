"""Short runs of the load generator and the overhead benchmark: BEHAVIOUR only, never speed.

Each test starts the real system (`laneway up` plus extra simulated workers, as processes) and
checks that the tools run, produce JSON with the expected keys, count no errors where none are
expected, compute shares, and that the report page embeds its images. The figures themselves are the benchmarks' job
(`python -m loadtest.hol` etc.), not these tests'. The short runs are split over three modules
(test_loadtest_short, test_benchmarks_lanes_short, test_benchmarks_scale_short) so that the
suite's workers share them: pytest-xdist hands out a module at a time (tests/conftest.py).
"""

from __future__ import annotations

import json

import pytest

from loadtest import generator, overhead, report, scenarios
from loadtest.results import to_json

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

GROUP_KEYS = {
    "requests",
    "completed",
    "failed",
    "cut",
    "errors",
    "ttft_s",
    "itl_s",
    "e2e_s",
    "tokens_per_s",
    "requests_per_s",
    "slo",
}


def _check_run(run: dict) -> None:
    assert {"label", "window", "overall", "by_class", "by_tenant", "by_flow", "ttft_samples", "timeline"} <= set(run)
    assert GROUP_KEYS <= set(run["overall"])
    assert {"ttft_800ms", "latency_1s"} == set(run["overall"]["slo"])
    for stat in ("ttft_s", "itl_s", "e2e_s"):
        assert {"p50", "p95", "p99"} <= set(run["overall"][stat])
    assert {"t", "tokens_per_s", "sample_t", "inflight", "waiting", "open_streams"} <= set(run["timeline"])


@pytest.mark.parametrize(
    "name,scale_by,target",
    [
        ("b2b-100k-dau", 0.01, "http"),
        ("cost-stack-120qps", 0.01, "http"),
        ("batch-flood", 0.02, "http"),
        ("two-tenant-fairness", 0.005, "nats"),
    ],
)
async def test_generator_scenario_runs_and_reports(name, scale_by, target, tmp_path):
    s = scenarios.get(name).scaled(scale_by).with_duration(3.0)
    doc = await generator.run_scenario(s, target=target, drain_s=4.0, show_progress=False)
    doc = json.loads(to_json(doc))  # what --json writes: strict JSON
    assert doc["scenario"] == name and doc["target"] == target
    assert "SIMULATION" in doc["engine"]["engine"]
    [run] = doc["runs"]
    _check_run(run)
    overall = run["overall"]
    assert overall["requests"] > 0 and overall["failed"] == 0, overall["errors"]
    assert overall["tokens"] > 0
    assert set(run["by_class"]) <= {f.klass for f in s.flows}
    assert set(run["by_tenant"]) <= {t.name for t in s.tenants}
    assert "ALL" in generator.render(doc)
    if name == "batch-flood":
        pytest.importorskip("matplotlib")
        paths = report.write(doc, tmp_path / "report.html")
        page = (tmp_path / "report.html").read_text()
        assert page.count("data:image/png;base64,") == 3
        assert all(p.read_bytes().startswith(b"\x89PNG") for p in paths.values())


async def test_overhead_short():
    report_ = await overhead.run_benchmark([1, 4], requests=12, max_tokens=16)
    assert [lv["concurrency"] for lv in report_["levels"]] == [1, 4]
    for lv in report_["levels"]:
        assert lv["errors"] == 0 and lv["requests"] == 12
        assert lv["laneway_ttft"]["n"] == 12 and lv["direct_ttft"]["n"] == 12
        # Every token of every answer arrived (counted from the usage chunk, not from chunks).
        assert lv["tokens_per_s"] * 12 / lv["requests_per_s"] == pytest.approx(12 * 16)
        # CPU clocks tick at 1-10 ms on some machines, so a short run may read 0: never negative.
        assert lv["cpu_ms_per_request"] >= 0 and lv["engine_cpu_ms_per_request"] >= 0
        assert lv["net_cpu_ms_per_request"] == pytest.approx(lv["cpu_ms_per_request"] - lv["engine_cpu_ms_per_request"])
        by_role = lv["cpu_ms_per_request_by_role"]  # where it went, a figure per process role
        assert set(by_role) == {"nats-server", "broker", "worker", "bridge"}
        assert all(v >= 0 for v in by_role.values())
    assert "added p50" in overhead.render(report_)
