"""The admission gate: validate → quota → cache → PII → route, each a small stage.

A stage returns its verdict or raises `Refusal` (`broker/refusal.py`) carrying an `ErrorCode`.
"""

from __future__ import annotations

from broker.refusal import Refusal   # re-exported for older imports; product code imports the leaf

__all__ = ["Refusal"]
