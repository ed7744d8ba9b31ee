"""Per-tenant PII policy: what to detect, and what to do with each entity type. Pure: no I/O.

A policy is a JSON document (stored per tenant in KV) decoded into `TenantPiiPolicy`; `decode`
validates it and raises `PolicyError` naming the bad field. Unknown entity types are refused: an
action for a type the gate cannot detect would be a silent hole in a compliance setting.

Defaults are for a B2B SaaS whose prompts may reach a hosted fallback model: identifiers that are
regulated or enable fraud (SSN, card, bank, passport...) and direct contact data are *redacted*,
not blocked. Blocking refuses the work a support agent or analyst is doing (pasting a ticket that
happens to hold a card number) while protecting nothing more: with either action the value never
reaches an engine. Redaction with a typed placeholder (`<US_SSN>`) keeps the model's answer
coherent. A tenant under a stricter regime sets `block`. Names are redacted too; a tenant that
needs them in drafts sets `PERSON: allow`, which also turns NER off (the costly part of the gate).
Context-like types with high false-positive rates (LOCATION, DATE_TIME, ORGANIZATION, URL...) are
allowed by default; "allow" means "not analyzed at all".
"""

from __future__ import annotations

import hashlib
import re
from enum import Enum
from typing import Annotated

import msgspec
import regex
from msgspec import Meta

from core.policy.pii.errors import PolicyError

# How custom patterns run (Presidio's own flags, with the `regex` engine): they are checked the
# same way, so a pattern that validates is a pattern that runs.
PATTERN_FLAGS = regex.DOTALL | regex.MULTILINE | regex.IGNORECASE


class Action(str, Enum):
    allow = "allow"  # not detected at all (costs nothing)
    redact = "redact"  # replaced by <ENTITY_TYPE>
    mask = "mask"  # letters and digits replaced by '*', the last 4 digits kept for long numbers
    hash = "hash"  # replaced by <ENTITY_TYPE_hmac>: a stable, keyed pseudonym per tenant
    block = "block"  # the request is refused, naming the entity types


# How strongly an action hides a value; where findings overlap, the strongest one wins.
STRENGTH = {Action.allow: 0, Action.mask: 1, Action.hash: 2, Action.redact: 3, Action.block: 4}

# Entity types found by pattern recognizers (regex + checksum + context words).
PATTERN_ENTITIES = frozenset(
    {
        "CREDIT_CARD",
        "CRYPTO",
        "DATE_TIME",
        "EMAIL_ADDRESS",
        "IBAN_CODE",
        "IP_ADDRESS",
        "MAC_ADDRESS",
        "MEDICAL_LICENSE",
        "PHONE_NUMBER",
        "UK_NHS",
        "URL",
        "US_BANK_NUMBER",
        "US_DRIVER_LICENSE",
        "US_ITIN",
        "US_PASSPORT",
        "US_SSN",
        "UUID",
    }
)
# Entity types only the NER model finds (DATE_TIME is found by both).
NER_ENTITIES = frozenset({"PERSON", "LOCATION", "NRP", "ORGANIZATION", "DATE_TIME"})
KNOWN_ENTITIES = PATTERN_ENTITIES | NER_ENTITIES

DEFAULT_ACTIONS: dict[str, Action] = {
    **{
        e: Action.redact
        for e in (
            "US_SSN",
            "CREDIT_CARD",
            "US_BANK_NUMBER",
            "IBAN_CODE",
            "US_ITIN",
            "US_PASSPORT",
            "US_DRIVER_LICENSE",
            "UK_NHS",
            "MEDICAL_LICENSE",
            "CRYPTO",
            "EMAIL_ADDRESS",
            "PHONE_NUMBER",
            "IP_ADDRESS",
            "PERSON",
        )
    },
    **{
        e: Action.allow
        for e in (
            "LOCATION",
            "DATE_TIME",
            "NRP",
            "ORGANIZATION",
            "URL",
            "UUID",
            "MAC_ADDRESS",
        )
    },
}

EntityType = Annotated[str, Meta(pattern=r"^[A-Z][A-Z0-9_]{1,63}\Z")]
Name = Annotated[str, Meta(pattern=r"^[A-Za-z0-9_.-]{1,64}\Z")]
Score = Annotated[float, Meta(ge=0.0, le=1.0)]
Word = Annotated[str, Meta(min_length=1, max_length=128)]
# Tenant regexes run on every prompt: bounded in size, count and (in the worker) time.
MAX_PATTERN_CHARS = 512


class CustomPattern(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    regex: Annotated[str, Meta(min_length=1, max_length=MAX_PATTERN_CHARS)]
    score: Score = 0.6
    name: Name = "custom"


class CustomRecognizer(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A tenant's own recognizer: regexes (Python `re` syntax, matched case-insensitively, as
    Presidio does), a deny-list of exact terms, and context words that raise a match's score by
    0.35 when one of them appears in the 5 words before it. `entity_type` may be new
    (EMPLOYEE_ID) or extend a built-in type."""

    name: Name
    entity_type: EntityType
    patterns: Annotated[list[CustomPattern], Meta(max_length=16)] = []
    deny_list: Annotated[list[Word], Meta(max_length=1000)] = []
    deny_list_score: Score = 1.0
    context: Annotated[list[Word], Meta(max_length=32)] = []


class TenantPiiPolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    enabled: bool = True
    fail_open: bool = False  # analysis failed or timed out: refuse (False) or pass unredacted
    min_score: Score = 0.4  # Presidio's "very weak" patterns (<0.4) count only with context
    timeout_ms: Annotated[int, Meta(ge=10, le=30_000)] = 1000
    entities: dict[EntityType, Action] = {}  # overrides of DEFAULT_ACTIONS
    allow_list: Annotated[list[Word], Meta(max_length=1000)] = []  # exact values never flagged
    custom: Annotated[list[CustomRecognizer], Meta(max_length=32)] = []
    custom_action: Action = Action.redact  # for custom entity types not named in `entities`
    # Model output too: the worker's stream detectors (validated patterns and the custom
    # recognizers, no NER) redact what the input's actions do not allow, across chunk edges.
    output: bool = True

    def action_for(self, entity_type: str) -> Action:
        action = self.entities.get(entity_type)
        if action is not None:
            return action
        return DEFAULT_ACTIONS.get(entity_type, self.custom_action)

    def detected(self) -> frozenset[str]:
        """The entity types to look for: every known or custom type whose action is not allow."""
        types = KNOWN_ENTITIES | {c.entity_type for c in self.custom}
        return frozenset(t for t in types if self.action_for(t) is not Action.allow)

    @property
    def looks(self) -> bool:
        """Whether this policy looks for anything: text it has not analysed may not be stored."""
        return self.enabled and bool(self.detected())


DEFAULT_POLICY = TenantPiiPolicy()

_decoder = msgspec.json.Decoder(TenantPiiPolicy)
_encoder = msgspec.json.Encoder(order="sorted")
_AT = re.compile(r" - at `(key` in `)?\$\.?(.*)`$")
_UNKNOWN = re.compile(r"unknown field `(.+?)`")
_ACTIONS = {a.value for a in Action}


def decode(document: bytes | str) -> TenantPiiPolicy:
    """JSON → validated policy, or `PolicyError(field, message)`."""
    try:
        policy = _decoder.decode(document)
    except msgspec.ValidationError as exc:
        raise PolicyError(*_locate(str(exc), document)) from None
    except msgspec.DecodeError as exc:
        raise PolicyError("", f"malformed JSON: {exc}") from None
    validate(policy)
    return policy


def _locate(error: str, document: bytes | str) -> tuple[str, str]:
    """msgspec's path (`$.custom[0].name`) as a field name; for `entities`, whose keys msgspec
    does not name, the offending key is found in the document."""
    m = _AT.search(error)
    message = error[: m.start()] if m else error
    path = m.group(2) if m else ""
    unknown = _UNKNOWN.search(message)
    if unknown:
        return (f"{path}.{unknown.group(1)}" if path else unknown.group(1)), message
    if path.startswith("entities"):
        entities = msgspec.json.decode(document).get("entities", {})
        bad_key = m is not None and m.group(1) is not None  # "- at `key` in `$.entities`"
        for key, value in entities.items() if isinstance(entities, dict) else ():
            if (bad_key and not re.fullmatch(r"[A-Z][A-Z0-9_]{1,63}", key)) or (not bad_key and value not in _ACTIONS):
                return f"entities.{key}", message
    return path, message


def validate(policy: TenantPiiPolicy) -> None:
    """Rules the types cannot express; raises `PolicyError` naming the field."""
    custom_types = set()
    names = set()
    for i, rec in enumerate(policy.custom):
        where = f"custom[{i}]"
        if rec.name in names:
            raise PolicyError(f"{where}.name", f"duplicate recognizer name {rec.name!r}")
        names.add(rec.name)
        if not rec.patterns and not rec.deny_list:
            raise PolicyError(where, "a custom recognizer needs patterns or a deny_list")
        for j, pat in enumerate(rec.patterns):
            try:
                compiled = regex.compile(pat.regex, PATTERN_FLAGS)
            except regex.error as exc:
                raise PolicyError(f"{where}.patterns[{j}].regex", f"invalid regex: {exc}") from None
            if compiled.match(""):
                raise PolicyError(f"{where}.patterns[{j}].regex", "regex matches the empty string")
        custom_types.add(rec.entity_type)
    for entity in policy.entities:
        if entity not in KNOWN_ENTITIES and entity not in custom_types:
            raise PolicyError(
                f"entities.{entity}",
                f"unknown entity type {entity!r}: not built in and no custom recognizer declares it",
            )


def encode(policy: TenantPiiPolicy) -> bytes:
    return _encoder.encode(policy)


def fingerprint(policy: TenantPiiPolicy) -> str:
    """Stable id of a policy's content: the key of cached analyses and of built recognizers, so a
    changed policy never reuses results computed under the old one."""
    return document_fingerprint(encode(policy))


def document_fingerprint(document: bytes) -> str:
    """`fingerprint` of a policy already encoded (`encode`): the same id, without encoding again."""
    return hashlib.blake2b(document, digest_size=12).hexdigest()


def mask(value: str) -> str:
    """Letters and digits become '*', separators stay; long numbers keep their last 4 digits
    (the usual card/account display), names and addresses keep nothing."""
    digits = sum(c.isdigit() for c in value)
    keep = 4 if digits >= 8 else 0
    out = []
    for c in reversed(value):
        if c.isdigit() and keep:
            out.append(c)
            keep -= 1
        else:
            out.append("*" if c.isalnum() else c)
    return "".join(reversed(out))
