"""The admission gate, in the order `pipeline.py` runs it: validate → quota → PII → route → cache.

Each stage has one module or package here, named as its policy is in `core/policy/`:
`validate.py`, `quota/`, `pii/`, `route.py`; the cache lookup is `pipeline.py`'s, over the
shared store in `core/cache.py`. A stage returns its verdict or raises `Refusal`
(`core/policy/refusal.py`) carrying an `ErrorCode`.
"""
