"""The intent classifier: accuracy on held-out template groups, determinism, bounded cost."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from core.routing import classifier
from core.routing.classifier import IntentModel, features, predict, prompt_text
from core.routing.intent_eval import LABELS, evaluate
from schemas.openai import Message
from schemas.requests import GenerateRequest
from tests.requests import chat
from tools.routing.train_classifier import data_digest, fit, load_examples, split, to_model

# Measured 0.937 on 126 held-out prompts from 36 template groups the model never saw (the
# majority class scores 0.38, a hand-written keyword rule over the same features 0.74). 0.85
# leaves room for a retrain on slightly different data while still failing a model that learned
# nothing beyond its templates.
HELD_OUT_THRESHOLD = 0.85


@pytest.fixture(scope="module")
def model() -> IntentModel:
    return IntentModel.load()


def test_the_data_set_is_large_and_balanced() -> None:
    examples = load_examples()
    counts = Counter(e.label for e in examples)
    assert len(examples) >= 300
    assert set(counts) == set(LABELS) and min(counts.values()) >= 80
    train, test = split(examples)
    assert {e.group for e in train}.isdisjoint({e.group for e in test})  # whole groups held out
    assert set(Counter(e.label for e in test)) == set(LABELS)


def test_shipped_model_was_trained_on_the_shipped_data(model: IntentModel) -> None:
    assert model.meta["data_sha256"] == data_digest(), "data changed: rerun train_classifier"


def test_held_out_accuracy(model: IntentModel) -> None:
    _, test = split(load_examples())
    accuracy, confusion = evaluate(model, test)
    print(f"held-out accuracy {accuracy:.3f} on {len(test)} prompts; confusion {confusion}")
    assert accuracy >= HELD_OUT_THRESHOLD
    assert accuracy == pytest.approx(model.meta["held_out_accuracy"], abs=1e-4)


def test_training_is_reproducible(model: IntentModel) -> None:
    train, test = split(load_examples())
    retrained = to_model(fit(train), {})
    assert evaluate(retrained, test)[0] == pytest.approx(model.meta["held_out_accuracy"], abs=1e-4)


@pytest.mark.parametrize(
    ("prompt", "label"),
    [
        ("What is the capital of Portugal?", "simple"),
        ("hi there, thanks for your help yesterday", "simple"),
        ("Write a Python function that returns the median of a list.", "code"),
        ("Why does this fail?\n```\nx = [1, 2]\nprint(x[2])\n```", "code"),
        (
            "Compare nuclear and solar power for a small island nation, weighing cost, reliability and "
            "environmental impact, and recommend a strategy.",
            "complex",
        ),
    ],
)
def test_clear_cases(prompt: str, label: str) -> None:
    got, confidence = predict(prompt)
    assert got == label and 1 / 3 < confidence <= 1.0


def test_predict_is_deterministic_and_cheap() -> None:
    prompts = [e.text for e in load_examples()[:50]] + ["word " * 5000, "", "{" * 3000]
    first = [predict(p) for p in prompts]
    assert [predict(p) for p in prompts] == first
    started = time.perf_counter()
    for _ in range(5):
        for p in prompts:
            predict(p)
    per_call = (time.perf_counter() - started) / (5 * len(prompts))
    print(f"predict: {per_call * 1e6:.0f} µs per prompt")
    # Not a benchmark: a tripwire for a pathological regex or an unbounded feature loop, which
    # would cost seconds on the 15 KB prompts above (features read only MAX_CHARS of a prompt).
    assert per_call < 0.02
    assert len(features("x" * 100_000)) < 50


def test_prompt_text_is_the_latest_user_turn() -> None:
    req = GenerateRequest(
        request_id="r",
        tenant="t",
        klass="c",
        model="auto",
        reply_to="x",
        created_at=0,
        deadline=1,
        chat=chat(
            Message("system", "You write code."),
            Message("user", "first"),
            Message("assistant", "ok"),
            Message("user", "What is 2 + 2?"),
            model="auto",
        ),
    )
    assert prompt_text(req) == "What is 2 + 2?"
    assert classifier.intent_of(req) == "simple"
