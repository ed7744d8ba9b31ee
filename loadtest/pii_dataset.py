"""A labelled, deterministic PII dataset: multi-turn B2B chats with gold spans, generated in code.

Conversations look like what a support/ops copilot sees: a tenant system prompt, a pasted document
(ticket, incident log, HR note, billing dispute, CRM notes, code question), assistant replies and
short follow-ups. PII is sparse, as in real traffic, and the filler carries the usual hard
negatives: product and company names, weekdays, versions, order numbers, amounts, timestamps, hashes.

    >>> convs = generate(seed=7, conversations=120)
    >>> convs[0].messages[1].spans[0]  # Span(entity_type='PERSON', start=..., end=...)
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Literal

ENTITY_TYPES = (
    "PERSON", "EMAIL_ADDRESS", "PHONE_NUMBER", "US_SSN", "CREDIT_CARD", "IP_ADDRESS", "LOCATION",
)

FIRST = ("James Maria Wei Priya Ahmed Olga Kenji Fatima Carlos Aisha Liam Sofia Dmitri Chloe Mateo "
         "Hannah Raj Emma Kwame Ingrid Diego Yuki Noah Elena Omar Lucas Amara Daniel Mei Samuel Zara "
         "Thomas Ana Ethan Leila Benjamin Nadia Victor Claire Tomasz Astrid Rahul Isabel Jonas Abena").split()
LAST = ("Garcia Zhang Patel Haddad Petrova Tanaka Okafor Rossi Nguyen Schmidt Kowalski Johansson "
        "O'Brien Murphy Silva Kim Cohen Dubois Mensah Fernandez Novak Yamamoto Walker Hughes Ibrahim "
        "Larsen Moreau Castillo Bennett Sato Kaur Reyes Fischer Adeyemi Costa Lindqvist Brennan Mwangi "
        "Alvarez Chen Whitaker Sorensen").split()
CITIES = ("Boston|Chicago|Denver|Seattle|Austin|Atlanta|Phoenix|Portland|San Diego|San Francisco|"
          "New York|Los Angeles|Toronto|Vancouver|London|Manchester|Dublin|Berlin|Munich|Paris|Lyon|"
          "Madrid|Barcelona|Lisbon|Amsterdam|Stockholm|Oslo|Warsaw|Prague|Vienna|Zurich|Milan|Rome|"
          "Tokyo|Osaka|Seoul|Singapore|Sydney|Melbourne|Mumbai|Bangalore|Nairobi|Lagos|Cairo|Dubai|"
          "Texas|Ohio|California|Germany|Brazil|Japan|Canada|Kenya|Poland").split("|")
COMPANIES = ("Acme Logistics|Globex|Initech|Umbrella Health|Northwind Traders|Contoso|Stark Freight|"
             "Wayne Biotech|Hooli|Vandelay Imports|Soylent Foods|Tyrell Systems|Cyberdyne Robotics|"
             "Pied Piper|Massive Dynamic|Oscorp Energy").split("|")
PRODUCTS = ("Kubernetes Postgres Redis Terraform Grafana Jira Salesforce Zendesk Slack Snowflake Kafka "
            "NATS Datadog Okta Stripe HubSpot Airflow Elasticsearch").split()
DOMAINS = ("gmail.com", "outlook.com", "proton.me", "yahoo.com")
DAYS = "Monday Tuesday Wednesday Thursday Friday".split()
MONTHS = "January February March April June July August September October November December".split()
AREA = (212, 206, 303, 312, 404, 415, 503, 512, 602, 617, 619, 646, 718, 720, 773, 917)

# Document sections. {P1}/{F1}/{E1}: the main person (full name / first name / email), {P2}...: a
# second one; {AGENT}: a staff name. Upper-case slots below the line are filler, never gold.
TICKET = [
    "Ticket #{N5} opened {DAY} by {P1} ({E1}), account {COMPANY}.",
    "Customer says the {PRODUCT} export has failed every night since the {VERSION} upgrade.",
    "They tried re-running the job manually at {TIME} UTC and got a 502 after about 40 seconds.",
    "{F1} asked for a callback on {PHONE} before {DAY} afternoon.",
    "Callback number on file: {PHONE}.",
    "Customer is based in {LOC} and works mostly in the evening, so please schedule accordingly.",
    "Previous agent {AGENT} offered a {PCT}% credit on invoice {INV}, which they have not accepted yet.",
    "Escalated to tier 2 because the same error appeared on order {ORDER} last month.",
    "Note from {AGENT}: the customer was polite but frustrated; this is the third contact this week.",
    "Attached logs show retries backing off to 64 seconds and then giving up.",
    "{F1} mentioned that {P2} from their finance team will join the next call.",
    "Please keep {E2} in copy on all replies about billing.",
]
INCIDENT = [
    "## Incident {INC}: elevated error rate on the {PRODUCT} gateway",
    "Start: {DATE} {TIME} UTC. Detected by the {PRODUCT} alert on p99 latency above 2 seconds.",
    "The first failing requests came from {IP}, which belongs to the batch ingestion fleet.",
    "Traffic from {IP} spiked to {N3} requests per second before the rate limiter engaged.",
    "{AGENT} rolled back to {VERSION} at {TIME} UTC and the error rate recovered within ten minutes.",
    "Root cause: a connection pool of 16 was shared by 48 workers after the {VERSION} config change.",
    "Customer impact: about {PCT}% of API calls returned 503 for 27 minutes.",
    "log: {DATE}T{TIME}Z ERROR pool-{N2} timeout acquiring connection (waited 30000 ms) req={HASH}",
    "log: {DATE}T{TIME}Z WARN upstream {IP}:8443 reset by peer after 1.2 MB",
    "Follow-up owner: {P1} ({E1}); review scheduled for {DAY}.",
    "Action items: add a saturation alert, cap workers per pool, and document the rollback in the runbook.",
    "The on-call engineer in {LOC} paged {F1} at {TIME}, who joined within five minutes.",
]
HR = [
    "New hire paperwork for {P1}, starting {DAY} {MONTH} {D} in the {LOC} office.",
    "Payroll needs the SSN {SSN} entered before the first pay run.",
    "Emergency contact: {P2}, phone {PHONE}.",
    "Personal email for onboarding documents: {E1}.",
    "Manager: {AGENT}. Team: platform reliability, level 4, remote-friendly.",
    "Equipment: laptop with 32 GB RAM, two monitors, and a {PRODUCT} license.",
    "Benefits enrollment closes 30 days after the start date; remind them in week two.",
    "Background check cleared on {DATE}; reference calls with {P2} and a former manager went well.",
    "Relocation stipend of {AMOUNT} approved because they are moving from {LOC2}.",
    "Their previous employer was {COMPANY}; no non-compete applies.",
]
BILLING = [
    "Billing dispute from {P1} <{E1}> regarding invoice {INV} for {AMOUNT}.",
    "They say card {CARD} was charged twice on {DATE}.",
    "Our records show one charge on the card ending in {N4} and one refund that is still pending.",
    "The customer asked us to switch future charges to {CARD} instead.",
    "Per policy, refunds above {AMOUNT} need approval from {AGENT}.",
    "Account tier: Enterprise, annual contract, renewal on {MONTH} {D}.",
    "{F1} can be reached at {PHONE} between 9 and 5 Eastern.",
    "The disputed amount includes {N3} seats that were removed in {MONTH}.",
    "Stripe event id {HASH} shows the retry came from the dunning job, not from a manual charge.",
]
CRM = [
    "Met {P1} from {COMPANY} at the {LOC} summit; they run {N3} agents on {PRODUCT}.",
    "Pain points: slow first response, no single view of tickets across {PRODUCT} and email.",
    "Budget owner is {P2}; procurement wants a security review before {MONTH}.",
    "Next step: demo on {DAY} with {F1} and two team leads; send the deck to {E1} beforehand.",
    "{F1} prefers calls to {PHONE} rather than email.",
    "Competitor in the deal: {COMPANY}; they were quoted {AMOUNT} per year.",
    "They are expanding to {LOC2} next quarter and will need data residency there.",
    "Champion: {F2}, who pushed for the pilot after the outage in {MONTH}.",
]
CODE = [
    "Why does this retry loop never stop when the server returns 429?",
    "```python\nasync def fetch(session, url, attempts=5):\n    for i in range(attempts):\n"
    "        async with session.get(url) as r:\n            if r.status != 429:\n"
    "                return await r.json()\n        await asyncio.sleep(2 ** i)\n```",
    "We run it under Python 3.11 with aiohttp {VERSION} inside {PRODUCT}.",
    "The container has 2 CPUs and 4 GB of memory; p95 latency went from 180 ms to 1.4 s.",
    "Also, is it safe to share one ClientSession across {N2} worker tasks?",
    "The deploy pipeline pins {PRODUCT} to {VERSION} and builds images tagged {HASH}.",
    "Our SLO is 99.9% over 30 days, measured at the load balancer.",
    "Config: max_connections=64, keepalive=30s, timeout=10s, retries=3.",
]
SYSTEM = [
    "You are Lane Assist, the support copilot for {COMPANY}.",
    "Answer in a friendly, concise tone; use bullet points for steps and never invent policy.",
    "Customers are mostly operations teams on the Enterprise and Growth plans.",
    "Refunds above {AMOUNT} must be escalated; credits up to {PCT}% may be offered by the agent.",
    "Business hours are 8:00 to 18:00 in each customer's time zone, {DAY} through Friday.",
    "Escalation contact for this workspace: {AGENT}.",
    "When a ticket mentions an outage, link the status page and ask for the request id.",
    "Do not include internal ticket numbers such as {INV} in customer-facing drafts.",
    "Prefer {PRODUCT} terminology the customer already uses; avoid jargon.",
    "If you are unsure, say so and suggest what information would resolve the question.",
    "Summaries should start with the customer's goal, then the blocker, then the next step.",
    "All drafts are reviewed by a human before sending; flag anything that needs legal review.",
]
REPLY = [
    "Here is a summary: the export job fails after the {VERSION} upgrade and {F1} wants a callback.",
    "Draft reply:\n\nHi {F1},\n\nThanks for your patience while we looked into this.",
    "We confirmed the root cause and a fix is scheduled for {DAY}.",
    "I suggest offering the {PCT}% credit again and confirming the refund timeline in writing.",
    "Next steps: 1) confirm the callback time, 2) attach the logs, 3) loop in {AGENT}.",
    "The rollback to {VERSION} looks like the right call; add an alert on pool saturation.",
    "Best regards,\n{AGENT}",
    "The retry loop never stops because the sleep is outside the response context; cap the attempts.",
]
FOLLOW = [
    "Can you make it shorter and mention that {P2} will join the call?",
    "Please also cc {E2} and keep the tone formal.",
    "Add that they can reach me directly at {PHONE}.",
    "Rewrite the summary for the weekly report, no names.",
    "What should we tell the customer in {LOC} about the maintenance window on {DAY}?",
    "Their new card is {CARD}; can you confirm the refund goes to the old one?",
    "The server {IP} is still failing health checks, what else should we check?",
    "Thanks, that works. Translate the draft into plain bullet points.",
    "Good. Now list the risks of moving the {PRODUCT} cluster to {VERSION} next {DAY}.",
    "HR asked me to double check the SSN {SSN}, is that format valid?",
]
GENERIC = [
    "The {PRODUCT} dashboard showed nothing unusual until {DAY} morning.",
    "We agreed to revisit the contract terms at the {MONTH} business review.",
    "Most of the backlog is low priority, but two items block the quarterly release.",
    "Latency improved by {PCT}% after the cache was moved closer to the database.",
    "The Growth plan includes 25 seats, SSO, and a 99.5% uptime commitment.",
    "Order {ORDER} shipped on {DATE} and was delivered two days late.",
    "A second opinion from the {COMPANY} integration team would help here.",
    "Weekly sync moved to Thursdays at 10:30 because of the new sprint cadence.",
    "Please keep the answer under 200 words and avoid promising dates we cannot meet.",
    "Version {VERSION} of the SDK deprecates the old pagination parameters.",
    "The audit found no gaps in access reviews, but two service accounts lack owners.",
    "Finance flagged {AMOUNT} of unbilled usage from the last quarter.",
    "Customer Success wants a one-page summary they can share with their VP.",
    "There are {N3} open tickets tagged billing and {N2} tagged outage this month.",
    "Use the Standard Operating Procedure for priority one incidents.",
    "Migration to {PRODUCT} is planned in three phases, each with a rollback point.",
]
DOCS = (TICKET, INCIDENT, HR, BILLING, CRM, CODE)


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
    messages: tuple[LabelledMessage, ...]   # system, user, assistant, user, ...

    def turn(self, n: int) -> tuple[LabelledMessage, ...]:
        """The request of turn n (1-based): everything up to and including the n-th user message."""
        return self.messages[: 2 * n]

    @property
    def turns(self) -> int:
        return len(self.messages) // 2


NEGATIVE_SHARE = 0.2   # conversations without any PII (precision on realistic clean traffic)
_SLOT = re.compile(r"\{([A-Z0-9]+)\}")
_GOLD = {"P1", "F1", "E1", "P2", "F2", "E2", "AGENT", "LOC", "LOC2", "PHONE", "SSN", "CARD", "IP"}


class _Gen:
    def __init__(self, rng: random.Random, pii: bool) -> None:
        self.r = rng
        self.pii = pii   # False: a negative conversation, templates with gold slots are skipped
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
        return r.choice((f"({a}) {x}-{n}", f"{a}-{x}-{n}", f"+1 {a} {x} {n}", f"{a}.{x}.{n}",
                         f"+44 20 7946 {r.randint(100, 999)}", f"+49 30 {r.randint(100000, 9999999)}"))

    def ssn(self) -> str:
        a = self.r.choice([i for i in range(1, 900) if i != 666])
        sep = "-" if self.r.random() < 0.85 else " "
        return f"{a:03d}{sep}{self.r.randint(1, 99):02d}{sep}{self.r.randint(1, 9999):04d}"

    def card(self) -> str:
        r = self.r
        prefix, length = r.choice((("4", 16), ("51", 16), ("55", 16), ("6011", 16), ("37", 15)))
        digits = [int(c) for c in prefix] + [r.randint(0, 9) for _ in range(length - len(prefix) - 1)]
        total = sum(d if i % 2 else sum(divmod(2 * d, 10)) for i, d in enumerate(reversed(digits)))
        s = "".join(map(str, digits)) + str((10 - total % 10) % 10)   # Luhn check digit
        groups = (4, 6, 5) if length == 15 else (4, 4, 4, 4)
        parts, i = [], 0
        for g in groups:
            parts.append(s[i:i + g])
            i += g
        return r.choice((" ", "-", "")).join(parts)

    def ip(self) -> str:
        r = self.r
        if r.random() < 0.15:
            return f"2001:db8:{r.randint(1, 65535):x}:{r.randint(1, 65535):x}::{r.randint(1, 65535):x}"
        return r.choice((f"10.{r.randint(0, 255)}.{r.randint(0, 255)}.{r.randint(1, 254)}",
                         f"192.168.{r.randint(0, 255)}.{r.randint(1, 254)}",
                         f"{r.choice((34, 52, 54, 104, 185))}.{r.randint(0, 255)}.{r.randint(0, 255)}.{r.randint(1, 254)}"))

    def fill(self, template: str) -> tuple[str, list[Span]]:
        out: list[str] = []
        spans: list[Span] = []
        pos = 0
        last = 0
        for m in _SLOT.finditer(template):
            lit = template[last:m.start()]
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
        gold = {"P1": (p[0][0], "PERSON"), "F1": (p[0][1], "PERSON"), "E1": (p[0][2], "EMAIL_ADDRESS"),
                "P2": (p[1][0], "PERSON"), "F2": (p[1][1], "PERSON"), "E2": (p[1][2], "EMAIL_ADDRESS"),
                "AGENT": (self.agent, "PERSON"), "LOC": (self.locs[0], "LOCATION"),
                "LOC2": (self.locs[1], "LOCATION")}
        if name in gold:
            return gold[name]
        fresh = {"PHONE": (self.phone, "PHONE_NUMBER"), "SSN": (self.ssn, "US_SSN"),
                 "CARD": (self.card, "CREDIT_CARD"), "IP": (self.ip, "IP_ADDRESS")}
        if name in fresh:
            make, etype = fresh[name]
            return make(), etype
        filler = {
            "COMPANY": lambda: r.choice(COMPANIES), "PRODUCT": lambda: r.choice(PRODUCTS),
            "VERSION": lambda: f"{r.randint(1, 9)}.{r.randint(0, 30)}.{r.randint(0, 12)}",
            "DAY": lambda: r.choice(DAYS), "MONTH": lambda: r.choice(MONTHS), "D": lambda: str(r.randint(1, 28)),
            "DATE": lambda: f"2025-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}",
            "TIME": lambda: f"{r.randint(0, 23):02d}:{r.randint(0, 59):02d}",
            "AMOUNT": lambda: f"${r.randint(1, 90)},{r.randint(0, 999):03d}.00",
            "PCT": lambda: str(r.choice((5, 10, 15, 20, 25))), "N2": lambda: str(r.randint(10, 99)),
            "N3": lambda: str(r.randint(100, 999)), "N4": lambda: str(r.randint(1000, 9999)),
            "N5": lambda: str(r.randint(10000, 99999)), "HASH": lambda: f"{r.getrandbits(40):010x}",
            "ORDER": lambda: f"ORD-{r.randint(10000, 99999)}-{r.choice('ABCDEFGH')}{r.choice('KXZ')}",
            "INV": lambda: f"INV-2025-{r.randint(0, 99999):05d}", "INC": lambda: f"INC-{r.randint(1000, 9999)}",
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
    ask = g.fill(rng.choice(("Summarize the following and draft a short reply." if not g.pii else
                             "Summarize the following and draft a reply to {F1}.",
                             "Read these notes and tell me what to do next.",
                             "Please review the material below and list the open questions.")))
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
