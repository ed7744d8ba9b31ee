"""The noisy-neighbour benchmark's physics bound (the steps a chat's first token needs beside
noise), and where a first token waited, from the client's results and Laneway's usage records."""

import pytest

from loadtest.http_client import Result
from loadtest.noisy import chunks, physics_ratio
from loadtest.ttft_path import ttft_path
from schemas.usage import Usage
from tests.records import usage_record


def test_a_prompt_takes_threshold_sized_steps_beside_others():
    assert chunks(512, 128) == 4
    assert chunks(513, 128) == 5
    assert chunks(100, 128) == 1
    assert chunks(512, 0) == 1  # no threshold: the whole prompt in one step


def test_bound_swaps_the_alone_step_for_the_flooded_steps():
    # alone: 20 ms of path + one 10 ms step; beside noise: the step in flight + 4 prefill steps, 200 ms
    assert physics_ratio(0.030, 0.010, 0.200) == pytest.approx((0.020 + 0.200) / 0.030)


def test_bound_is_never_below_alone():
    assert physics_ratio(0.030, 0.010, 0.001) == 1.0
    assert physics_ratio(0.0, 0.010, 0.200) == 1.0


def usage(request_id: str, queued_s: float, ttft_s: float | None) -> Usage:
    return usage_record(request_id, queued_s=queued_s, ttft_s=ttft_s)


def test_a_first_token_splits_into_the_lanes_the_engine_and_the_hops():
    results = [
        Result(ttft=0.100, request_id="a"),
        Result(ttft=0.050, request_id="b"),
        Result(ttft=0.900, request_id="c", retries=1),  # counted from its first try: left out
        Result(ttft=0.070, request_id="d"),  # no record: left out
        Result(ttft=None, request_id="e", error="overloaded"),
    ]
    records = {u.request_id: u for u in (usage("a", 0.010, 0.080), usage("b", 0.001, 0.040), usage("c", 0, 0.1))}
    records["e"] = usage("e", 0.0, None)
    path = ttft_path(results, records)
    assert {part: path[part]["n"] for part in path} == {"queue": 2, "engine": 2, "hops": 2}
    assert path["queue"]["mean"] == pytest.approx(0.0055) and path["engine"]["mean"] == pytest.approx(0.060)
    assert path["hops"]["mean"] == pytest.approx(0.0095)  # (0.100 - 0.090 + 0.050 - 0.041) / 2
