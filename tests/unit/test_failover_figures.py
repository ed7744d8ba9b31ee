"""loadtest.failover's figures from chunk arrival times."""

from loadtest.failover import arrivals, rate, stall
from loadtest.http_client import Result


def test_arrivals_are_rebuilt_from_the_first_token_and_the_gaps():
    r = Result(ttft=0.5, gaps=[0.1, 0.2])
    assert arrivals(r, 10.0) == [10.5, 10.6, 10.8]
    assert arrivals(Result(), 10.0) == []


def test_the_stall_is_the_gap_that_spans_the_kill():
    assert abs(stall([1.0, 1.1, 2.9, 3.0], kill=1.5) - 1.8) < 1e-9
    assert stall([1.0, 1.1], kill=5.0) is None  # ended before the kill


def test_rate_counts_chunks_in_the_window():
    assert rate([[1.0, 1.5, 2.5], [1.2]], 1.0, 2.0) == 3.0
    assert rate([[1.0]], 2.0, 2.0) == 0.0
