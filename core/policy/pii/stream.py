"""Redaction of streamed model output: an entity split across frames is still caught. Pure.

`feed(delta)` returns only text that can no longer be part of a match; the rest is held:
- the last word (it may still become an e-mail, an IP, an ID),
- before it, a chain of numeric tokens ("+1 (415) 555", "4111 1111 1111"): a phone or card
  number in progress is held whole, however the tokens were split,
- with custom patterns (whose shape is unknown), at least `hold` characters,
- never more than `max_hold` characters (a giant token is released rather than stalled).
A match that straddles the release point moves it back to the match's start. So ordinary prose
streams with the latency of one word, and digits wait only until they can be judged.

Detectors are regexes with validators (Luhn for cards, SSN area rules, `ipaddress` for IPs),
checked only when their trigger character is in the buffer: cheap enough per frame.
"""

from __future__ import annotations

import copy
import ipaddress
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache

from core.policy.pii import Action, TenantPiiPolicy, mask

Replace = Callable[[str, str], str]  # (entity_type, value) -> replacement


@dataclass(frozen=True)
class Detector:
    entity_type: str
    pattern: re.Pattern[str]
    valid: Callable[[str], bool] | None = None
    triggers: str | None = None  # None: always scan (custom patterns)


def _luhn(value: str) -> bool:
    digits = [int(c) for c in value if c.isdigit()]
    if not 13 <= len(digits) <= 19 or digits[0] not in (3, 4, 5, 6):
        return False
    total = sum(d if i % 2 == 0 else (d * 2 - 9 if d > 4 else d * 2) for i, d in enumerate(reversed(digits)))
    return total % 10 == 0


def _ssn(value: str) -> bool:
    d = [c for c in value if c.isdigit()]
    area, group, serial = "".join(d[:3]), "".join(d[3:5]), "".join(d[5:])
    return area not in ("000", "666") and area[0] != "9" and group != "00" and serial != "0000"


def _phone(value: str) -> bool:
    return 10 <= sum(c.isdigit() for c in value) <= 15


def _ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return any(c.isdigit() or c in "abcdefABCDEF" for c in value)


_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
BUILT_IN = (  # order = precedence where matches overlap
    Detector(
        "CREDIT_CARD",
        re.compile(  # contiguous, 4-4-4-4(-3), or Amex/Diners 4-6-5/4
            r"(?<![\d-])(?:\d{13,19}|\d{4}([ -])\d{4}\1\d{4}\1\d{4}(?:\1\d{3}(?!\d))?|\d{4}([ -])\d{6}\2\d{4,5})(?!\d)"
        ),
        _luhn,
        "0123456789",
    ),
    Detector("US_SSN", re.compile(r"(?<![\d-])\d{3}([- ])\d{2}\1\d{4}(?![\d-])"), _ssn, "0123456789"),
    Detector("IP_ADDRESS", re.compile(rf"(?<![\d.]){_OCTET}(?:\.{_OCTET}){{3}}(?![\d]|\.\d)"), _ip, "0123456789"),
    Detector("IP_ADDRESS", re.compile(r"(?<![\w:])[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,7}(?![\w:])"), _ip, ":"),
    Detector(
        "EMAIL_ADDRESS", re.compile(r"[A-Za-z0-9._%+\-]+@[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)*\.[A-Za-z]{2,}"), None, "@"
    ),
    Detector(
        "PHONE_NUMBER",
        re.compile(
            r"(?<![\w+])(?:\+\d{1,3}[ .-]?)?(?:\(\d{1,4}\)[ .-]?|\d{1,4}[ .-])(?:\d{2,4}[ .-]){0,3}\d{2,8}(?!\w)"
        ),
        _phone,
        "0123456789",
    ),
)
STREAM_TYPES = frozenset(d.entity_type for d in BUILT_IN)  # what output redaction can find
_FLAGS = re.IGNORECASE | re.MULTILINE | re.DOTALL  # Presidio's flags for pattern recognizers
_NUMERIC = set("0123456789+-().")


def redacts_output(policy: TenantPiiPolicy) -> bool:
    """Whether the policy has the answer redacted, with something output redaction can find."""
    if not (policy.enabled and policy.output):
        return False
    findable = STREAM_TYPES | {c.entity_type for c in policy.custom}
    return not findable.isdisjoint(policy.detected())


def custom_detectors(policy: TenantPiiPolicy) -> list[Detector]:
    out = []
    for rec in policy.custom:
        for p in rec.patterns:
            out.append(Detector(rec.entity_type, re.compile(p.regex, _FLAGS)))
        if rec.deny_list:
            words = "|".join(re.escape(w) for w in rec.deny_list)
            out.append(Detector(rec.entity_type, re.compile(rf"(?:^|(?<=\W))(?:{words})(?=\W|$)", _FLAGS)))
    return out


@lru_cache(maxsize=256)
def _trigger_patterns(detectors: tuple[Detector, ...]) -> tuple[list[re.Pattern[str] | None], re.Pattern[str] | None]:
    """Each detector's trigger characters as one class, and all of them as one: one scan in C per
    release, not one per detector and character. Most text (prose) has no trigger at all, and
    then no detector can match. Built once per set of detectors, not per stream."""
    each = [None if d.triggers is None else re.compile(f"[{re.escape(d.triggers)}]") for d in detectors]
    every = "".join(sorted({c for d in detectors for c in d.triggers or ""}))
    return each, re.compile(f"[{re.escape(every)}]") if every else None


class StreamRedactor:
    def __init__(
        self, detectors: Iterable[Detector], replace: Replace, *, hold: int = 64, max_hold: int = 1024
    ) -> None:
        self.detectors = list(detectors)
        self.replace = replace
        self.custom = any(d.triggers is None for d in self.detectors)
        self._triggers, self._any_trigger = _trigger_patterns(tuple(self.detectors))
        self.hold = hold
        self.max_hold = max_hold
        self.found: list[tuple[str, int, int]] = []  # (entity_type, start, end) in the raw stream
        self._buf = ""
        self._left = ""  # the last released character: look-behind context for the buffer
        self._offset = 0  # raw-stream position of the buffer's first character

    @classmethod
    def for_policy(
        cls, policy: TenantPiiPolicy, replace: Callable[[str, str, Action], str] | None = None, **kw: int
    ) -> StreamRedactor:
        """Built-in detectors for the types the policy does not allow, plus its custom ones.
        Output cannot be refused mid-stream, so `block` redacts here."""
        wanted = policy.detected()
        dets = [d for d in BUILT_IN if d.entity_type in wanted] + [
            d for d in custom_detectors(policy) if d.entity_type in wanted
        ]
        # Without a keyed replacer `hash` falls back to redaction: an unkeyed hash is reversible.
        act = replace or (lambda etype, value, action: mask(value) if action is Action.mask else f"<{etype}>")

        allowed = frozenset(policy.allow_list)  # exact values never flagged, as on input

        def rep(etype: str, value: str) -> str:
            if value in allowed:
                return value
            action = policy.action_for(etype)
            return act(etype, value, Action.redact if action is Action.block else action)

        return cls(dets, rep, **kw)

    def fresh(self) -> StreamRedactor:
        """Another stream with this one's detectors, trigger patterns and replacements (built once
        per policy), and nothing fed yet."""
        new = copy.copy(self)
        new.found, new._buf, new._left, new._offset = [], "", "", 0
        return new

    def feed(self, delta: str) -> str:
        self._buf += delta
        return self._release(final=False)

    def flush(self) -> str:
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        buf = self._buf
        if not buf:
            return ""
        matches = self._matches(buf)
        cut = len(buf) if final else self._safe_cut(buf)
        for start, end, _ in matches:
            if start < cut < end:
                cut = start
        out, pos = [], 0
        for start, end, etype in matches:
            if end > cut:
                break
            out.append(buf[pos:start])
            out.append(self.replace(etype, buf[start:end]))
            self.found.append((etype, self._offset + start, self._offset + end))
            pos = end
        out.append(buf[pos:cut])
        if cut:
            self._left = buf[cut - 1]
        self._buf = buf[cut:]
        self._offset += cut
        return "".join(out)

    def _safe_cut(self, buf: str) -> int:
        i = len(buf)
        while i > 0 and not buf[i - 1].isspace():  # the last, maybe unfinished, word
            i -= 1
        while True:  # numeric tokens before it
            j = i
            while j > 0 and buf[j - 1].isspace():
                j -= 1
            k = j
            while k > 0 and buf[k - 1] in _NUMERIC:
                k -= 1
            if k < j and (k == 0 or buf[k - 1].isspace()) and any(c.isdigit() for c in buf[k:j]):
                i = k
            else:
                break
        if self.custom:
            i = min(i, max(0, len(buf) - self.hold))
            while 0 < i < len(buf) and not buf[i - 1].isspace() and not buf[i].isspace():
                i -= 1  # not inside a word
        return max(i, len(buf) - self.max_hold, 0)

    def _matches(self, buf: str) -> list[tuple[int, int, str]]:
        if not self.custom and (self._any_trigger is None or self._any_trigger.search(buf) is None):
            return []
        text, base = self._left + buf, len(self._left)
        found = []
        for rank, det in enumerate(self.detectors):
            trigger = self._triggers[rank]
            if trigger is not None and trigger.search(buf) is None:
                continue
            for m in det.pattern.finditer(text, base):
                if m.end() > m.start() and (det.valid is None or det.valid(m.group())):
                    found.append((m.start() - base, m.end() - base, rank, det.entity_type))
        # Overlaps: the detector listed first wins (a validated card beats the phone regex that
        # also matches its digits), then the longer match.
        found.sort(key=lambda f: (f[2], -(f[1] - f[0]), f[0]))
        chosen: list[tuple[int, int, str]] = []
        for start, end, _, etype in found:
            if all(end <= s or start >= e for s, e, _ in chosen):
                chosen.append((start, end, etype))
        return sorted(chosen)
