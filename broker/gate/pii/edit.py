"""Writing redacted text back where `slots.py` found it. A copy is made only along the edited
paths: every message, tool and member left untouched is the same object as before, and an
untouched member of `extra` keeps its bytes as the client spelled them."""

from __future__ import annotations

from typing import Any

import msgspec

from broker.gate.pii.slots import EXTRA, KEPT, Slot
from schemas import codec

# One replacement: the path left to walk, the slot it came from, what goes there.
Edit = tuple[tuple[str | int, ...], Slot, Any]


def edited(node: Any, edits: list[Edit], clashes: list[Slot]) -> Any:
    """`node` with each edit applied. A renamed key that would land on another key of its
    object wins over it, and its slot goes into `clashes` (for the gate to refuse)."""
    renames: dict[str, tuple[Slot, Any]] = {}
    below: dict[str | int, list[Edit]] = {}
    for rest, slot, value in edits:
        if not rest:
            return value  # this node is the slot's text
        if slot.key and len(rest) == 1:
            assert isinstance(rest[0], str)  # a key's own slot: it is an object's member
            renames[rest[0]] = (slot, value)
        else:
            below.setdefault(rest[0], []).append((rest[1:], slot, value))
    if isinstance(node, msgspec.Struct):
        members: dict[str, Any] = {}
        for f, e in below.items():
            assert isinstance(f, str)  # a struct's members are named
            members[f] = edited(getattr(node, f), e, clashes)
        return msgspec.structs.replace(node, **members)
    if isinstance(node, list):
        out = list(node)
        for i, e in below.items():
            assert isinstance(i, int)  # a list's members are numbered
            out[i] = edited(node[i], e, clashes)
        return out
    result: dict[str, Any] = {}
    for k, v in node.items():
        if k in below:
            v = edited(v, below[k], clashes)
        if k in renames:
            slot, k = renames[k]
            if k in result:
                clashes.append(slot)
        elif k in result:  # an earlier key was renamed onto this one
            clashes.append(next(s for s, new in renames.values() if new == k))
        result[k] = v
    return result


def split(edits: list[tuple[Slot, Any]]) -> tuple[list[Edit], list[Edit], list[Edit]]:
    """The edits of the body, those of `extra` and those of `kept` (paths without their head)."""
    body: list[Edit] = []
    free: dict[str | int, list[Edit]] = {EXTRA: [], KEPT: []}
    for slot, value in edits:
        if slot.path[0] in free:
            free[slot.path[0]].append((slot.path[1:], slot, value))
        else:
            body.append((slot.path, slot, value))
    return body, free[EXTRA], free[KEPT]


def edited_extra(raw: dict[str, msgspec.Raw], decoded: dict[str, Any], edits: list[Edit], clashes: list[Slot]) -> bytes:
    """`extra` (or `kept`) re-joined with the edits applied: only edited members are encoded again."""
    touched = {rest[0] for rest, slot, _ in edits if not (slot.key and len(rest) == 1)}
    root = {k: decoded[k] if k in touched else v for k, v in raw.items()}
    return codec.encode_json(edited(root, edits, clashes))
