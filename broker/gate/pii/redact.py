"""Replacing found values: pure string work, shared by the gate and the stream redactor."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Sequence

from core.policy.pii import STRENGTH, Action, mask

HASH_HEX = 12  # 48 bits of a keyed hash: stable pseudonyms, no collisions at chat scale
Replace = Callable[[str, str, Action], str]  # (entity type, value, action) -> its replacement


class Replacer:
    """Turns (entity type, value, action) into the text that replaces the value.

    `hash` is an HMAC keyed by a server secret and the tenant: plain SHA-256 of an SSN (10^9
    values) is reversed by brute force in seconds, and an unkeyed pseudonym would link the same
    person across tenants.
    """

    def __init__(self, key: bytes, tenant: str) -> None:
        self._key = hmac.new(key, tenant.encode(), hashlib.sha256).digest()

    def __call__(self, entity_type: str, value: str, action: Action) -> str:
        if action is Action.mask:
            return mask(value)
        if action is Action.hash:
            return f"<{self._pseudonym(entity_type, value)}>"
        return f"<{entity_type}>"

    def name(self, entity_type: str, value: str, action: Action) -> str:
        """The replacement inside an identifier (a tool's name, a call id, a participant's
        name): letters, digits and '_' only, as OpenAI's name patterns ask (no '<', '>' or '*').
        `mask` has no such form, so it replaces by the type, as `redact` does."""
        if action is Action.hash:
            return self._pseudonym(entity_type, value)
        return entity_type

    def _pseudonym(self, entity_type: str, value: str) -> str:
        digest = hmac.new(self._key, f"{entity_type}\0{value}".encode(), hashlib.sha256)
        return f"{entity_type}_{digest.hexdigest()[:HASH_HEX]}"


def apply(text: str, spans: Sequence[tuple[int, int, str, Action]], replace: Replace) -> str:
    """Replace (start, end, entity_type, action) spans; overlapping spans are merged into one
    region replaced under the strongest action (type of the longest span). `block` spans are
    redacted too: a blocked request's messages must be safe even if someone forwards them."""
    regions: list[list] = []  # [start, end, type, action, length of the typed span]
    for start, end, etype, action in sorted(spans):
        if action is Action.allow:
            continue
        if regions and start < regions[-1][1]:
            last = regions[-1]
            last[1] = max(last[1], end)
            if STRENGTH[action] > STRENGTH[last[3]]:
                last[3] = action
            if end - start > last[4]:
                last[2], last[4] = etype, end - start
        else:
            regions.append([start, end, etype, action, end - start])
    if not regions:
        return text
    out, pos = [], 0
    for start, end, etype, action, _ in regions:
        out.append(text[pos:start])
        out.append(replace(etype, text[start:end], action))
        pos = end
    out.append(text[pos:])
    return "".join(out)
