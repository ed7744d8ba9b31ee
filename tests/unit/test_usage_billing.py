"""A batch line run again is billed once: the run its output names (`Superseded`), never the
others, and never another line's runs (line 1's record does not void line 10's)."""

from __future__ import annotations

from core.usage_log import billed
from schemas import codec
from schemas.usage import Superseded, Usage


def usage(request_id: str) -> Usage:
    return Usage(
        request_id=request_id,
        tenant="acme",
        klass="batch",
        model="m",
        served_model="m",
        pool="p",
        worker_id="w",
        prompt_tokens=3,
        completion_tokens=5,
        finish_reason="stop",
        queued_s=0.0,
        ttft_s=0.1,
        total_s=0.2,
        finished_at=1.0,
    )


def test_a_line_run_again_is_billed_as_its_output_names_it() -> None:
    first, again = usage("batch_a-1-edge1-0"), usage("batch_a-1-edge2-0")
    others = [usage("batch_a-10-edge1-0"), usage("batch_b-1-edge1-0"), usage("chatcmpl-xyz")]
    records = [first, *others, again, Superseded("acme", "batch_a", 1, again.request_id, 2.0)]
    assert billed(records) == [*others, again]
    assert billed([first, again, *others]) == [first, again, *others]  # nothing superseded: all of it


def test_a_superseded_record_is_not_read_as_usage() -> None:
    data = codec.encode(Superseded("acme", "batch_a", 1, "batch_a-1-edge2-0", 2.0))
    try:
        codec.decode_usage(data)
    except codec.DecodeError:
        pass
    else:
        raise AssertionError("an old reader of Usage would count it")
    assert codec.decode_superseded(data).kept == "batch_a-1-edge2-0"
