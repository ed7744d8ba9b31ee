"""PII detection and redaction for the gate (Presidio in a process pool) and for streamed output.

gate = PiiGate()                      # spawns and warms the analyzer pool (broker/pii_analysis/)
await gate.start()
decision, request = await gate.inspect_request(tenant, policy, request)   # PiiTooLarge: over max_chars
publish(decision.audit(request.request_id))   # when decision.findings
decision.raise_if_blocked()           # PiiBlocked(entity_types, param), or PiiRefused (an image)
# request: every text an engine reads redacted (slots.py says where), extra fields included
"""

from broker.gate.pii.audit import AuditSpan, PiiAudit, decode_audit, encode_audit
from broker.gate.pii.gate import Finding, PiiDecision, PiiGate, PiiTooLarge
from core.policy.pii import (
    DEFAULT_ACTIONS,
    DEFAULT_POLICY,
    KNOWN_ENTITIES,
    Action,
    CustomPattern,
    CustomRecognizer,
    TenantPiiPolicy,
    decode,
    fingerprint,
)
from core.policy.pii.errors import PiiBlocked, PiiError, PiiRefused, PiiUnavailable, PolicyError
from core.policy.pii.stream import StreamRedactor

__all__ = [
    "Action",
    "AuditSpan",
    "CustomPattern",
    "CustomRecognizer",
    "DEFAULT_ACTIONS",
    "DEFAULT_POLICY",
    "Finding",
    "KNOWN_ENTITIES",
    "PiiAudit",
    "PiiBlocked",
    "PiiDecision",
    "PiiError",
    "PiiGate",
    "PiiRefused",
    "PiiTooLarge",
    "PiiUnavailable",
    "PolicyError",
    "StreamRedactor",
    "TenantPiiPolicy",
    "decode",
    "decode_audit",
    "encode_audit",
    "fingerprint",
]
