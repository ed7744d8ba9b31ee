"""The admission gate: validate → quota → cache → PII → route, each a small stage.

A stage returns its verdict or raises `Refusal` (`broker/refusal.py`) carrying an `ErrorCode`.
"""
