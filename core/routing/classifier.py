"""The intent classifier behind `auto`: `simple` | `complex` | `code`, with a confidence.

Lightweight features (words, word pairs, code and math markers, length, question and multi-step
cues) and a multinomial logistic regression trained offline by `tools/routing/train_classifier.py`
and shipped as JSON weights (`intent_model.json`). Stdlib only: the broker runs it per `auto` request, so it
must cost microseconds and pull in no ML runtime.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from schemas.requests import GenerateRequest

MODEL_PATH = Path(__file__).with_name("intent_model.json")
MAX_CHARS = 2000  # features read at most this much of a prompt: bounded cost per request

_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?|\d+")
_DIGIT = re.compile(r"\d")
_ARITH = re.compile(r"\d\s*[-+*/^x×]\s*\d")
_SYMBOLS = "(){}[];=:<>_#`'\"/*+-%$&|\\"
_WH = frozenset("what who when where which why how is are does do can name".split())
_CODE_WORDS = frozenset(
    (
        "def function class return import const let var async await null none self "
        "sql query regex git bash script api json yaml compile compiler bug error "
        "exception stack trace loop array list dict int string func fn struct"
    ).split()
)
_STEP_WORDS = frozenset(
    (
        "then first finally step steps compare contrast analyze analyse evaluate explain "
        "why plan design strategy trade trade-offs tradeoffs pros cons reason reasoning "
        "argue assess discuss justify outline detailed essay implications consequences "
        "mitigate recommend weigh"
    ).split()
)
# snake_case, calls and operators, counted with str.count: no regex scan per position.
_IDENT_MARKS = ("_", "()", "->", "=>", "::", "==", "!=")


def features(text: str) -> dict[str, float]:
    """Sparse features of one prompt; the same function serves training and prediction."""
    head = text[:MAX_CHARS]
    lower = head.lower()
    words = _WORD.findall(lower)
    f: dict[str, float] = {"bias_": 1.0}
    for w in set(words[:400]):
        f["w:" + w] = 1.0
    for a, b in set(itertools.pairwise(words[:200])):
        f[f"b:{a}_{b}"] = 1.0
    if words:
        f["first:" + words[0]] = 1.0
    for ch in set(head) & set(_SYMBOLS):
        f["s:" + ch] = 1.0
    n_words = max(1, len(words))
    f["len:chars"] = math.log1p(len(text)) / 8
    f["len:words"] = math.log1p(len(words)) / 6
    f["len:lines"] = min(head.count("\n"), 20) / 10
    f["q:mark"] = 1.0 if "?" in head else 0.0
    f["q:wh_start"] = 1.0 if words and words[0] in _WH else 0.0
    f["q:sentences"] = min(sum(map(head.count, ".?!")), 10) / 5
    f["code:words"] = min(len(_CODE_WORDS.intersection(words)), 10) / 5
    f["code:idents"] = min(sum(map(head.count, _IDENT_MARKS)), 10) / 5
    f["code:fence"] = 1.0 if "```" in head or "\n    " in head or "\n  " in head else 0.0
    f["code:symbols"] = min(sum(map(head.count, "{}();=<>")), 40) / 20
    f["math:digits"] = len(_DIGIT.findall(head)) / max(1, len(head))
    f["math:ops"] = min(len(_ARITH.findall(head)), 5) / 5
    f["multi:cues"] = min(len(_STEP_WORDS.intersection(words)), 8) / 4
    f["multi:commas"] = min(head.count(","), 10) / 5
    f["multi:and_rate"] = words.count("and") / n_words
    return {k: v for k, v in f.items() if v}


@dataclass(frozen=True, slots=True)
class IntentModel:
    labels: tuple[str, ...]
    weights: Mapping[str, tuple[float, ...]]  # feature → one weight per label
    meta: Mapping[str, object]

    @classmethod
    def load(cls, path: Path = MODEL_PATH) -> IntentModel:
        doc = json.loads(path.read_text())
        labels = tuple(doc["labels"])
        weights = {k: tuple(v) for k, v in doc["weights"].items()}
        if any(len(v) != len(labels) for v in weights.values()):
            raise ValueError(f"{path}: every weight row needs {len(labels)} values")
        return cls(labels, weights, doc.get("meta", {}))

    def scores(self, feats: Mapping[str, float]) -> list[float]:
        z = [0.0] * len(self.labels)
        for name, value in feats.items():
            row = self.weights.get(name)
            if row is not None:
                for k, w in enumerate(row):
                    z[k] += value * w
        return z

    def probabilities(self, text: str) -> dict[str, float]:
        return dict(zip(self.labels, softmax(self.scores(features(text))), strict=True))

    def predict(self, text: str) -> tuple[str, float]:
        probs = softmax(self.scores(features(text)))
        best = max(range(len(probs)), key=probs.__getitem__)
        return self.labels[best], probs[best]


def softmax(z: list[float]) -> list[float]:
    top = max(z)
    e = [math.exp(v - top) for v in z]
    total = sum(e)
    return [v / total for v in e]


@cache
def default_model() -> IntentModel:
    return IntentModel.load()


def predict(prompt: str) -> tuple[str, float]:
    """(intent label, confidence in [0, 1]) from the shipped model."""
    return default_model().predict(prompt)


def prompt_text(request: GenerateRequest) -> str:
    """What the intent is judged on: the latest user turn (earlier turns are context, and the
    system prompt is the application's, not the ask)."""
    if request.chat is None:
        return request.body.texts()[0]
    messages = request.chat.messages
    for message in reversed(messages):
        if message.role == "user":
            return message.text
    return messages[-1].text


def intent_of(request: GenerateRequest) -> str:
    return predict(prompt_text(request))[0]
