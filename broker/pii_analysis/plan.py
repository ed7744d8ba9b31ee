"""What a pool worker must look for: derived once per policy version, sent with every job."""

from __future__ import annotations

import msgspec

from core.policy.pii import NER_ENTITIES, PATTERN_ENTITIES, CustomRecognizer, TenantPiiPolicy, fingerprint

# A finding inside a worker, relative to the analyzed text: (entity_type, start, end, score).
Hit = tuple[str, int, int, float]


class Plan(msgspec.Struct, frozen=True):
    key: str  # policy fingerprint: workers cache built recognizers by it
    patterns: tuple[str, ...]  # predefined pattern entity types to run
    ner: tuple[str, ...]  # entity types wanted from the NER model
    custom: tuple[CustomRecognizer, ...]
    allow_list: tuple[str, ...]
    min_score: float

    @property
    def empty(self) -> bool:
        return not (self.patterns or self.ner or self.custom)


def plan_for(policy: TenantPiiPolicy, key: str | None = None) -> Plan:
    wanted = policy.detected()
    custom = tuple(c for c in policy.custom if c.entity_type in wanted)
    return Plan(
        key=key or fingerprint(policy),
        patterns=tuple(sorted(wanted & PATTERN_ENTITIES)),
        ner=tuple(sorted(wanted & NER_ENTITIES)),
        custom=custom,
        allow_list=tuple(policy.allow_list),
        min_score=policy.min_score,
    )
