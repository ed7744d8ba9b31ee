"""`SampledLog`: the first line per key each interval, and the tally of those left out."""

from __future__ import annotations

import logging

from core.logsample import SampledLog


def test_one_line_per_key_each_interval_with_a_count_of_the_rest(caplog):
    now = [100.0]
    sampled = SampledLog(logging.getLogger("laneway.test.sampled"), interval_s=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="laneway.test.sampled"):
        written = [sampled.warning("malformed", "junk on %s", f"lw.req.j{i}.acme") for i in range(1000)]
        assert sampled.warning("invalid", "refused on %s", "lw.req.batch.acme"), "another key has its own interval"
        now[0] += 9.9
        assert not sampled.warning("malformed", "junk on %s", "late")
        now[0] += 0.2
        assert sampled.warning("malformed", "junk on %s", "next")
        now[0] += 10.0
        assert sampled.warning("malformed", "junk on %s", "quiet")
    assert written == [True] + [False] * 999
    assert [r.getMessage() for r in caplog.records] == [
        "junk on lw.req.j0.acme",
        "refused on lw.req.batch.acme",
        "junk on next (and 1000 more like it in the last 10 s, not logged)",
        "junk on quiet",
    ]
