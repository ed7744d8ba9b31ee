"""The edge's JSON depth bound agrees with the real nesting of any document, strings included."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.codec import nests_deeper_than

# Strings full of what a naive scan would miscount: brackets, quotes, backslashes.
tricky = st.text(alphabet='[]{}"\\ax', max_size=8)
documents = st.recursive(
    st.none() | st.integers() | tricky,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(tricky, inner, max_size=3),
    max_leaves=40,
)


def depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    return 0


@settings(max_examples=300, deadline=None)  # a verdict, not a speed: GC pauses must not fail it
@given(documents, st.integers(min_value=0, max_value=12))
def test_agrees_with_the_documents_depth(document, limit):
    assert nests_deeper_than(json.dumps(document).encode(), limit) == (depth(document) > limit)


def test_a_deep_body_is_caught_without_recursion():
    deep = b'{"a": ' * 100_000 + b"1" + b"}" * 100_000
    assert nests_deeper_than(deep, 64)
    assert not nests_deeper_than(b"[]" * 100_000, 64)
