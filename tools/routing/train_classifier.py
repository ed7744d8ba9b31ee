"""Train the intent classifier offline and write `intent_model.json`. Stdlib only, deterministic.

    python -m tools.routing.train_classifier            # train, print held-out accuracy, write
    python -m tools.routing.train_classifier --check    # train and print, write nothing

Multinomial logistic regression on `classifier.features`, fitted by SGD with AdaGrad steps and
L2 in a seeded order. Held out: whole template groups (`held_out_groups`), a quarter of each label's, so
the accuracy printed is on phrasings absent from training. The shipped model is the one trained
on the training split only: the held-out figure it reports (and the test pins) stays honest.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import sys
from collections.abc import Sequence
from pathlib import Path

from core.routing.classifier import MODEL_PATH, IntentModel, features, softmax
from core.routing.intent_eval import LABELS, Example, evaluate

DATA_PATH = Path(__file__).with_name("data") / "intents.jsonl"
HOLDOUT_SHARE = 0.25


def load_examples(path: Path = DATA_PATH) -> list[Example]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    examples = [Example(r["text"], r["label"], r["group"]) for r in rows]
    unknown = {e.label for e in examples} - set(LABELS)
    if unknown:
        raise ValueError(f"{path}: unknown labels {sorted(unknown)}")
    return examples


def held_out_groups(examples: Sequence[Example]) -> set[str]:
    """A quarter of each label's groups (templates and hand-written prompts kept apart), picked
    by a hash of the group name: stratified, so every label has unseen phrasings in the test."""
    held: set[str] = set()
    for label in LABELS:
        for kind in ("t", "hand"):
            groups = sorted(
                {e.group for e in examples if e.label == label and e.group.startswith("hand-") == (kind == "hand")},
                key=lambda g: hashlib.sha256(g.encode()).hexdigest(),
            )
            held.update(groups[: round(len(groups) * HOLDOUT_SHARE)])
    return held


def split(examples: Sequence[Example]) -> tuple[list[Example], list[Example]]:
    held = held_out_groups(examples)
    return [e for e in examples if e.group not in held], [e for e in examples if e.group in held]


def data_digest(path: Path = DATA_PATH) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fit(
    examples: Sequence[Example], epochs: int = 40, lr: float = 0.3, l2: float = 1e-4, seed: int = 13
) -> dict[str, list[float]]:
    k = len(LABELS)
    data = [(features(e.text), LABELS.index(e.label)) for e in examples]
    weights: dict[str, list[float]] = {}
    grads_sq: dict[str, list[float]] = {}
    order = list(range(len(data)))
    rng = random.Random(seed)
    for _ in range(epochs):
        rng.shuffle(order)
        for i in order:
            feats, y = data[i]
            z = [0.0] * k
            for name, value in feats.items():
                row = weights.get(name)
                if row is not None:
                    for c in range(k):
                        z[c] += value * row[c]
            probs = softmax(z)
            for name, value in feats.items():
                row = weights.setdefault(name, [0.0] * k)
                acc = grads_sq.setdefault(name, [1e-8] * k)
                for c in range(k):
                    g = value * (probs[c] - (1.0 if c == y else 0.0)) + l2 * row[c]
                    acc[c] += g * g
                    row[c] -= lr * g / math.sqrt(acc[c])
    return weights


def to_model(weights: dict[str, list[float]], meta: dict[str, object]) -> IntentModel:
    # Drop near-zero rows and round: the shipped file stays small and diff-able.
    kept = {
        f: tuple(round(w, 4) for w in row) for f, row in sorted(weights.items()) if max(abs(w) for w in row) >= 5e-4
    }
    return IntentModel(LABELS, kept, meta)


def write(model: IntentModel, path: Path = MODEL_PATH) -> None:
    doc = {
        "labels": list(model.labels),
        "meta": dict(model.meta),
        "weights": {f: list(row) for f, row in model.weights.items()},
    }
    path.write_text(json.dumps(doc, separators=(",", ":"), sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="train and report; do not write the model")
    parser.add_argument("--out", type=Path, default=MODEL_PATH)
    args = parser.parse_args(argv)
    examples = load_examples()
    train, test = split(examples)
    weights = fit(train)
    provisional = to_model(weights, {})
    train_acc, _ = evaluate(provisional, train)
    test_acc, confusion = evaluate(provisional, test)
    meta = {
        "data_sha256": data_digest(),
        "n_train": len(train),
        "n_held_out": len(test),
        "held_out_groups": len({e.group for e in test}),
        "train_accuracy": round(train_acc, 4),
        "held_out_accuracy": round(test_acc, 4),
    }
    model = to_model(weights, meta)
    print(
        f"examples: {len(examples)}  train: {len(train)}  held out: {len(test)} "
        f"({meta['held_out_groups']} whole template groups)"
    )
    print(f"train accuracy: {train_acc:.3f}   held-out accuracy: {test_acc:.3f}")
    print("confusion (rows: true, columns: predicted)")
    print("           " + "".join(f"{label:>9}" for label in LABELS))
    for label in LABELS:
        print(f"  {label:>8} " + "".join(f"{confusion[label][p]:>9}" for p in LABELS))
    print(f"features kept: {len(model.weights)}")
    if not args.check:
        write(model, args.out)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
