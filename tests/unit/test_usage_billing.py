"""A batch line run again is billed once: the run its output names (`Superseded`), never the
others, and never another line's runs (line 1's record does not void line 10's). A request
message is billed once: a continuation's record voids a fenced worker's late one."""

from __future__ import annotations

from core.usage_log import billed
from schemas import codec
from schemas.usage import Superseded, Usage
from tests.records import usage_record


def usage(request_id: str, **fields) -> Usage:
    return usage_record(request_id, **({"klass": "batch", "pool": "p"} | fields))


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


def test_a_continuation_voids_the_late_record_of_a_worker_judged_lost_not_a_finisher() -> None:
    """Worker A, only silent, is judged lost; B continues the stream (its record takes over what A
    streamed), and A, waking, finishes before it reads its fence: A's record is void. A request
    A had finished (B found the stream over: nothing taken over) keeps A's record."""
    late = usage("chatcmpl-1", attempt=1, message=7, completion_tokens=400)
    went_on = usage("chatcmpl-1", attempt=2, message=7, takes_over=True, completion_tokens=400, continued_tokens=90)
    done = usage("chatcmpl-2", attempt=1, message=8)
    nothing = usage("chatcmpl-2", attempt=2, message=8, completion_tokens=0, finish_reason="worker_lost")
    assert billed([late, went_on, done, nothing]) == [went_on, done, nothing]
    assert billed([went_on, late]) == [went_on]  # whichever is stored first
    # Another message under the same id (an Idempotency-Key's retry), and records without the fields
    # (written before them), are their own.
    again = usage("chatcmpl-1", attempt=1, message=9)
    old = usage("chatcmpl-1")
    assert billed([late, went_on, again, old]) == [went_on, again, old]
    # Two continuations: the last delivery's record is the one billed.
    third = usage("chatcmpl-1", attempt=3, message=7, takes_over=True, continued_tokens=200)
    assert billed([late, went_on, third]) == [third]
