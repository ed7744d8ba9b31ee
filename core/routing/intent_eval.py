"""Labelled prompts and a model's accuracy on them: what the offline trainer
(`tools/routing/train_classifier.py`) and the public-set report (`loadtest/intent_public.py`) share.
It lives with the classifier, not the trainer, because the installed report scores the shipped
model and the trainer is not installed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from core.routing.classifier import IntentModel

LABELS = ("simple", "complex", "code")


@dataclass(frozen=True, slots=True)
class Example:
    text: str
    label: str
    group: str


def evaluate(model: IntentModel, examples: Sequence[Example]) -> tuple[float, dict[str, dict[str, int]]]:
    confusion = {a: {b: 0 for b in LABELS} for a in LABELS}
    for e in examples:
        confusion[e.label][model.predict(e.text)[0]] += 1
    correct = sum(confusion[label][label] for label in LABELS)
    return correct / max(1, len(examples)), confusion
