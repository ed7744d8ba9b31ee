"""The pool worker process: loads Presidio's recognizers (and the NER model) once, then analyzes
jobs. Only this module and the ones it imports touch Presidio or spaCy; the broker's event loop
never does (a 6 KB analysis holds the GIL for tens to hundreds of milliseconds)."""

from __future__ import annotations

import os
import sys
import time
from collections import OrderedDict

from broker.pii_analysis.plan import Hit, Plan
from core import env
from core.lifetime import die_with_parent

BUILT_PLANS = 64  # per worker; a plan is a few compiled regexes
# Presidio imports its transformers NLP engine, and spaCy's thinc imports torch, whenever they are
# installed (vLLM installs both); the analysis runs neither. Marked absent before Presidio loads, a
# worker starts on a third of the CPU and memory (2.6 vs 7.7 CPU-s, 176 vs 525 MB RSS, 2 cores).
NEVER_RUN = ("torch", "transformers")


class _State:
    def __init__(self, ner_model: str | None) -> None:
        from broker.pii_analysis.recognize import Recognizers

        self.recognizers = Recognizers()
        self.ner = None
        if ner_model:
            from broker.pii_analysis.ner import Ner

            self.ner = Ner(ner_model)
        self.plans: OrderedDict[str, tuple[list, frozenset[str]]] = OrderedDict()

    def built(self, plan: Plan) -> tuple[list, frozenset[str]]:
        from broker.pii_analysis.recognize import Custom

        hit = self.plans.get(plan.key)
        if hit is None:
            hit = ([Custom.build(c) for c in plan.custom], frozenset(plan.allow_list))
            self.plans[plan.key] = hit
            if len(self.plans) > BUILT_PLANS:
                self.plans.popitem(last=False)
        else:
            self.plans.move_to_end(plan.key)
        return hit


_state: _State | None = None


def init(ner_model: str | None, parent_pid: int) -> None:
    """ProcessPoolExecutor initializer: tie the worker's life to the broker's (a SIGKILLed
    broker must not leave 500 MB processes behind), then pay the imports and model load
    before the first job."""
    global _state
    die_with_parent(parent_pid)
    # Set here, in the pool process, not at import (importing this module must change nothing),
    # and before _State imports Presidio: tldextract would fetch the public-suffix list over the
    # network on the first e-mail match; Presidio would give a stuck regex 60 s.
    env.library_defaults({"TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS": "", "REGEX_TIMEOUT_SECONDS": "2"})
    for name in NEVER_RUN:
        # None in sys.modules is the import system's "absent": `import torch` raises ImportError,
        # which thinc and Presidio take as not installed. typeshed types the values as modules.
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]
    _state = _State(ner_model)


def analyze(plan: Plan, texts: list[tuple[str, int, int]]) -> tuple[list[list[Hit]], float]:
    """Findings for each (text, lo, hi) that overlap [lo, hi), and the CPU seconds spent. A
    chunk of a long text has a lead-in and a lead-out, read for context only."""
    from broker.pii_analysis.recognize import finalize

    assert _state is not None, "worker not initialised"
    cpu = time.process_time()
    custom, allow = _state.built(plan)
    per_text = [_state.recognizers.analyze(text, plan.patterns, custom) for text, _, _ in texts]
    if plan.ner and _state.ner is not None:
        for found, ner_found in zip(per_text, _state.ner.analyze(texts, plan.ner), strict=True):
            found += ner_found
    hits = [
        finalize(found, text, plan.min_score, allow, lo, hi)
        for found, (text, lo, hi) in zip(per_text, texts, strict=True)
    ]
    return hits, time.process_time() - cpu


def warm(plan: Plan, text: str, hold_s: float) -> int:
    """One analysis (first-call costs: regex compilation, BLAS buffers), then hold the worker a
    moment so that concurrent warm calls land on distinct processes. Returns the pid."""
    analyze(plan, [(text, 0, len(text))])
    time.sleep(hold_s)
    return os.getpid()


def ner_loaded() -> bool:
    return _state is not None and _state.ner is not None
