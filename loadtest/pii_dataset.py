"""A labelled, deterministic PII dataset: multi-turn B2B chats with gold spans, generated in code.

Conversations look like what a support/ops copilot sees: a tenant system prompt, a pasted document
(ticket, incident log, HR note, billing dispute, CRM notes, code question), assistant replies and
short follow-ups. PII is sparse, as in real traffic, and the filler carries the usual hard
negatives: product and company names, weekdays, versions, order numbers, amounts, timestamps, hashes.
The words and sentence templates it fills are loadtest/pii_templates.py's.

    >>> convs = generate(seed=7, conversations=120)
    >>> convs[0].messages[1].spans[0]  # Span(entity_type='PERSON', start=..., end=...)
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Literal

from loadtest.pii_templates import (
    AREA,
    CITIES,
    COMPANIES,
    DAYS,
    DOCS,
    DOMAINS,
    FIRST,
    FOLLOW,
    GENERIC,
    LAST,
    MONTHS,
    PRODUCTS,
    REPLY,
    SYSTEM,
)

ENTITY_TYPES = (
    "PERSON",
    "EMAIL_ADDRESS",
    "PHONE_NUMBER",
    "US_SSN",
    "CREDIT_CARD",
    "IP_ADDRESS",
    "LOCATION",
)


@dataclass(frozen=True)
class Span:
    entity_type: str
    start: int
    end: int


@dataclass(frozen=True)
class LabelledMessage:
    role: Literal["system", "user", "assistant"]
    content: str
    spans: tuple[Span, ...]


@dataclass(frozen=True)
class Conversation:
    id: str
    messages: tuple[LabelledMessage, ...]  # system, user, assistant, user, ...

    def turn(self, n: int) -> tuple[LabelledMessage, ...]:
        """The request of turn n (1-based): everything up to and including the n-th user message."""
        return self.messages[: 2 * n]

    @property
    def turns(self) -> int:
        return len(self.messages) // 2


NEGATIVE_SHARE = 0.2  # conversations without any PII (precision on realistic clean traffic)
_SLOT = re.compile(r"\{([A-Z0-9]+)\}")
_GOLD = {"P1", "F1", "E1", "P2", "F2", "E2", "AGENT", "LOC", "LOC2", "PHONE", "SSN", "CARD", "IP"}


class _Gen:
    def __init__(self, rng: random.Random, pii: bool) -> None:
        self.r = rng
        self.pii = pii  # False: a negative conversation, templates with gold slots are skipped
        self.people = [self.person() for _ in range(2)]
        self.agent = self.person()[0]
        self.locs = rng.sample(CITIES, 2)

    def person(self) -> tuple[str, str, str]:
        first, last = self.r.choice(FIRST), self.r.choice(LAST)
        dom = self.r.choice((*DOMAINS, self.r.choice(COMPANIES).split()[0].lower() + ".com"))
        local = self.r.choice((f"{first}.{last}", f"{first[0]}{last}", f"{first}{self.r.randint(1, 99)}"))
        return f"{first} {last}", first, re.sub(r"[^a-z0-9.]", "", local.lower()) + "@" + dom

    def phone(self) -> str:
        r = self.r
        a, x, n = r.choice(AREA), r.randint(201, 989), r.randint(1000, 9999)
        return r.choice(
            (
                f"({a}) {x}-{n}",
                f"{a}-{x}-{n}",
                f"+1 {a} {x} {n}",
                f"{a}.{x}.{n}",
                f"+44 20 7946 {r.randint(100, 999)}",
                f"+49 30 {r.randint(100000, 9999999)}",
            )
        )

    def ssn(self) -> str:
        a = self.r.choice([i for i in range(1, 900) if i != 666])
        sep = "-" if self.r.random() < 0.85 else " "
        return f"{a:03d}{sep}{self.r.randint(1, 99):02d}{sep}{self.r.randint(1, 9999):04d}"

    def card(self) -> str:
        r = self.r
        prefix, length = r.choice((("4", 16), ("51", 16), ("55", 16), ("6011", 16), ("37", 15)))
        digits = [int(c) for c in prefix] + [r.randint(0, 9) for _ in range(length - len(prefix) - 1)]
        total = sum(d if i % 2 else sum(divmod(2 * d, 10)) for i, d in enumerate(reversed(digits)))
        s = "".join(map(str, digits)) + str((10 - total % 10) % 10)  # Luhn check digit
        groups = (4, 6, 5) if length == 15 else (4, 4, 4, 4)
        parts, i = [], 0
        for g in groups:
            parts.append(s[i : i + g])
            i += g
        return r.choice((" ", "-", "")).join(parts)

    def ip(self) -> str:
        r = self.r
        if r.random() < 0.15:
            return f"2001:db8:{r.randint(1, 65535):x}:{r.randint(1, 65535):x}::{r.randint(1, 65535):x}"
        return r.choice(
            (
                f"10.{r.randint(0, 255)}.{r.randint(0, 255)}.{r.randint(1, 254)}",
                f"192.168.{r.randint(0, 255)}.{r.randint(1, 254)}",
                f"{r.choice((34, 52, 54, 104, 185))}.{r.randint(0, 255)}.{r.randint(0, 255)}.{r.randint(1, 254)}",
            )
        )

    def fill(self, template: str) -> tuple[str, list[Span]]:
        out: list[str] = []
        spans: list[Span] = []
        pos = 0
        last = 0
        for m in _SLOT.finditer(template):
            lit = template[last : m.start()]
            out.append(lit)
            pos += len(lit)
            value, etype = self.slot(m.group(1))
            if etype:
                spans.append(Span(etype, pos, pos + len(value)))
            out.append(value)
            pos += len(value)
            last = m.end()
        out.append(template[last:])
        return "".join(out), spans

    def slot(self, name: str) -> tuple[str, str | None]:
        r, p = self.r, self.people
        gold = {
            "P1": (p[0][0], "PERSON"),
            "F1": (p[0][1], "PERSON"),
            "E1": (p[0][2], "EMAIL_ADDRESS"),
            "P2": (p[1][0], "PERSON"),
            "F2": (p[1][1], "PERSON"),
            "E2": (p[1][2], "EMAIL_ADDRESS"),
            "AGENT": (self.agent, "PERSON"),
            "LOC": (self.locs[0], "LOCATION"),
            "LOC2": (self.locs[1], "LOCATION"),
        }
        if name in gold:
            return gold[name]
        fresh = {
            "PHONE": (self.phone, "PHONE_NUMBER"),
            "SSN": (self.ssn, "US_SSN"),
            "CARD": (self.card, "CREDIT_CARD"),
            "IP": (self.ip, "IP_ADDRESS"),
        }
        if name in fresh:
            make, etype = fresh[name]
            return make(), etype
        filler = {
            "COMPANY": lambda: r.choice(COMPANIES),
            "PRODUCT": lambda: r.choice(PRODUCTS),
            "VERSION": lambda: f"{r.randint(1, 9)}.{r.randint(0, 30)}.{r.randint(0, 12)}",
            "DAY": lambda: r.choice(DAYS),
            "MONTH": lambda: r.choice(MONTHS),
            "D": lambda: str(r.randint(1, 28)),
            "DATE": lambda: f"2025-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}",
            "TIME": lambda: f"{r.randint(0, 23):02d}:{r.randint(0, 59):02d}",
            "AMOUNT": lambda: f"${r.randint(1, 90)},{r.randint(0, 999):03d}.00",
            "PCT": lambda: str(r.choice((5, 10, 15, 20, 25))),
            "N2": lambda: str(r.randint(10, 99)),
            "N3": lambda: str(r.randint(100, 999)),
            "N4": lambda: str(r.randint(1000, 9999)),
            "N5": lambda: str(r.randint(10000, 99999)),
            "HASH": lambda: f"{r.getrandbits(40):010x}",
            "ORDER": lambda: f"ORD-{r.randint(10000, 99999)}-{r.choice('ABCDEFGH')}{r.choice('KXZ')}",
            "INV": lambda: f"INV-2025-{r.randint(0, 99999):05d}",
            "INC": lambda: f"INC-{r.randint(1000, 9999)}",
        }
        return filler[name](), None

    def block(self, pool: list[str], target_chars: int, sep: str = " ") -> tuple[str, list[Span]]:
        """Sentences from `pool` (shuffled, cycled) until `target_chars`, with shifted spans."""
        parts: list[str] = []
        spans: list[Span] = []
        size = 0
        order: list[str] = []
        if not self.pii:
            pool = [t for t in pool if not any(m.group(1) in _GOLD for m in _SLOT.finditer(t))]
        while size < target_chars:
            if not order:
                order = self.r.sample(pool, len(pool))
            text, sp = self.fill(order.pop())
            offset = size + (len(sep) if parts else 0)
            spans += [Span(s.entity_type, s.start + offset, s.end + offset) for s in sp]
            parts.append(text)
            size = offset + len(text)
        return sep.join(parts), spans


def _join(pieces: list[tuple[str, list[Span]]], sep: str = "\n\n") -> tuple[str, list[Span]]:
    text, spans, off = [], [], 0
    for t, sp in pieces:
        spans += [Span(s.entity_type, s.start + off, s.end + off) for s in sp]
        text.append(t)
        off += len(t) + len(sep)
    return sep.join(text), spans


def _conversation(i: int, rng: random.Random, target_chars: int) -> Conversation:
    g = _Gen(rng, pii=rng.random() >= NEGATIVE_SHARE)
    msgs: list[LabelledMessage] = []
    system, sp = g.block(SYSTEM, int(target_chars * 0.25))
    msgs.append(LabelledMessage("system", system, tuple(sp)))
    # The first user turn pastes one or two documents so that the first request is ~target_chars.
    kinds = rng.sample(DOCS, 2)
    budget = target_chars - len(system) - 120
    doc1 = g.block(kinds[0] + GENERIC, int(budget * 0.6), sep=rng.choice((" ", "\n")))
    doc2 = g.block(kinds[1] + GENERIC, budget - len(doc1[0]), sep=rng.choice((" ", "\n")))
    ask = g.fill(
        rng.choice(
            (
                "Summarize the following and draft a short reply."
                if not g.pii
                else "Summarize the following and draft a reply to {F1}.",
                "Read these notes and tell me what to do next.",
                "Please review the material below and list the open questions.",
            )
        )
    )
    text, sp = _join([ask, doc1, doc2])
    msgs.append(LabelledMessage("user", text, tuple(sp)))
    for _ in range(rng.randint(2, 3)):
        text, sp = g.block(REPLY, rng.randint(350, 700), sep="\n")
        msgs.append(LabelledMessage("assistant", text, tuple(sp)))
        text, sp = g.block(FOLLOW, rng.randint(60, 260))
        msgs.append(LabelledMessage("user", text, tuple(sp)))
    return Conversation(f"c{i:04d}", tuple(msgs))


def generate(seed: int = 7, conversations: int = 120, target_chars: int = 6000) -> list[Conversation]:
    """`conversations` chats whose first request is ~`target_chars` (6 KB ~ 1.5K tokens)."""
    rng = random.Random(seed)
    return [_conversation(i, rng, target_chars) for i in range(conversations)]


def messages(convs: list[Conversation]) -> list[LabelledMessage]:
    """Every distinct labelled prompt (message) of the dataset."""
    return [m for c in convs for m in c.messages]


def summary(convs: list[Conversation]) -> dict[str, int]:
    counts = {e: 0 for e in ENTITY_TYPES}
    for m in messages(convs):
        for s in m.spans:
            counts[s.entity_type] += 1
    negatives = sum(1 for m in messages(convs) if not m.spans)
    return {"conversations": len(convs), "messages": len(messages(convs)), "negatives": negatives, **counts}


if __name__ == "__main__":
    data = generate()
    print(summary(data))
    print(data[0].messages[1].content[:1500])
